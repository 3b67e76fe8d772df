// Multi-tensor apply for CUDA, in the style of Apex's multi_tensor_apply.cuh.
//
// The tensors of one call are cut into chunks of kCudaChunk elements; one CUDA block handles
// one chunk. Addresses, sizes and the block -> (tensor, chunk) table travel by value as the
// kernel's argument (no host-to-device copy, so the launch can be captured in a CUDA graph).
// When a launch's table fills up, it is launched and filling starts over, carrying a tensor
// that was only partly covered into the next launch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace jgsess {

constexpr int64_t kCudaChunk = 65536;
constexpr int kCudaBlock = 512;

template <int kLists, int kMaxTensors, int kMaxBlocks>
struct TensorTable {
  void* ptr[kLists][kMaxTensors];
  int64_t size[kMaxTensors];
  int block_tensor[kMaxBlocks];
  int block_chunk[kMaxBlocks];
};

// Launches launch(table, num_blocks) as many times as the tensors need.
// ptrs[l][t] is list l's address of tensor t; sizes[t] its element count.
template <int kLists, int kMaxTensors, int kMaxBlocks, typename Launch>
cudaError_t MultiTensorApply(const std::vector<void*> (&ptrs)[kLists],
                             const std::vector<int64_t>& sizes, Launch launch) {
  using Table = TensorTable<kLists, kMaxTensors, kMaxBlocks>;
  Table table;
  int tensors = 0, blocks = 0;
  for (size_t t = 0; t < sizes.size(); ++t) {
    if (sizes[t] == 0) continue;
    for (int l = 0; l < kLists; ++l) table.ptr[l][tensors] = ptrs[l][t];
    table.size[tensors] = sizes[t];
    ++tensors;
    const int64_t chunks = (sizes[t] + kCudaChunk - 1) / kCudaChunk;
    for (int64_t c = 0; c < chunks; ++c) {
      table.block_tensor[blocks] = tensors - 1;
      table.block_chunk[blocks] = static_cast<int>(c);
      ++blocks;
      const bool last_chunk = c == chunks - 1;
      if (blocks == kMaxBlocks || (last_chunk && tensors == kMaxTensors)) {
        launch(table, blocks);
        if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
        blocks = 0;
        if (last_chunk) {
          tensors = 0;
        } else {  // the current tensor continues in the next launch
          for (int l = 0; l < kLists; ++l) table.ptr[l][0] = table.ptr[l][tensors - 1];
          table.size[0] = table.size[tensors - 1];
          tensors = 1;
        }
      }
    }
  }
  if (blocks > 0) launch(table, blocks);
  return cudaGetLastError();
}

}  // namespace jgsess
