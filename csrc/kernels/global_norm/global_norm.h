// The global norm of many tensors, sqrt(sum over tensors of sum(x*x)), as optax's
// clip_by_global_norm computes it [Apex's multi_tensor_l2norm].
//
// Each tensor is cut into chunks of kChunk elements, whose sums of squares are f32 partials in
// the workspace (in the program's workspace arena): one per chunk on the CPU, where a tensor's
// sum adds its partials in chunk order and the total adds the tensors' sums left to right, as
// optax's Python sum does; one per block (two per chunk) on CUDA, added in a fixed tree. Either
// way the result does not depend on how many threads or blocks ran.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "common/chunk.h"
#include "common/ffi.h"
#include "common/tensor_list.h"

namespace jgsess {

inline int64_t NormItems(int64_t size) { return (size + kChunk - 1) / kChunk; }

struct NormCall {
  std::vector<TensorSlots<1, 0>> tensors;
  int64_t items;    // chunks over all tensors: one partial sum each
  char* workspace;  // in the arena result
};

// The operand checker the CPU and CUDA handlers share: every x_i f32, bf16 or f16; the arena
// result as large as the arena operand; the workspace, `bytes_per_item` per chunk from
// `offset`, 4-byte aligned and inside the arena.
inline ffi::ErrorOr<NormCall> ParseNorm(const Buffer& arena, Args& args, Buffer& arena_out,
                                        int64_t offset, int64_t bytes_per_item) {
  auto tensors = ParseTensors<1, 0>("global_norm", args, 0, nullptr);
  if (tensors.has_error()) return ffi::Unexpected(tensors.error());
  int64_t items = 0;
  for (const auto& t : *tensors) items += NormItems(t.size);
  const auto bytes = static_cast<int64_t>(arena_out.size_bytes());
  if (static_cast<int64_t>(arena.size_bytes()) != bytes) {
    return Invalid("global_norm", "the arena result (" + std::to_string(bytes) +
                                      " bytes) differs from the arena (" +
                                      std::to_string(arena.size_bytes()) + " bytes) in size");
  }
  const int64_t need = items * bytes_per_item;
  if (offset < 0 || offset % 4 != 0 || offset > bytes || need > bytes - offset) {
    return Invalid("global_norm", "the workspace (" + std::to_string(need) + " bytes for " +
                                      std::to_string(items) + " chunks, at offset " +
                                      std::to_string(offset) +
                                      ", 4-byte aligned) does not fit the arena (" +
                                      std::to_string(bytes) + " bytes)");
  }
  return NormCall{std::move(*tensors), items,
                  static_cast<char*>(arena_out.untyped_data()) + offset};
}

}  // namespace jgsess

JGSESS_DECLARE_HANDLERS(GlobalNorm);
