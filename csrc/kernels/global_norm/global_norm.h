// The global norm of many tensors, sqrt(sum over tensors of sum(x*x)), as optax's
// clip_by_global_norm computes it [Apex's multi_tensor_l2norm].
//
// Each tensor is cut into chunks of kChunk elements; a chunk's sum of squares is one f32
// partial in the workspace (in the program's workspace arena). A tensor's sum adds its partials
// in chunk order, and the total adds the tensors' sums in order, left to right, as optax's
// Python sum does: the result does not depend on how many threads or blocks ran.
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
    return Invalid("global_norm", "the arena result differs from the arena in size");
  }
  if (offset < 0 || offset % 4 != 0 || offset > bytes || items * bytes_per_item > bytes - offset) {
    return Invalid("global_norm", "the workspace does not fit the arena");
  }
  return NormCall{std::move(*tensors), items,
                  static_cast<char*>(arena_out.untyped_data()) + offset};
}

}  // namespace jgsess

JGSESS_DECLARE_HANDLERS(GlobalNorm);
