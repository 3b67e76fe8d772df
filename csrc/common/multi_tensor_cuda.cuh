// Multi-tensor apply for CUDA, in the style of Apex's multi_tensor_apply.cuh.
//
// The tensors of one call are cut into chunks of kChunk elements; one CUDA block handles
// one chunk. Addresses, element types, sizes and the block -> (tensor, chunk) table travel by
// value as the kernel's argument (no host-to-device copy, so the launch can be captured in a
// CUDA graph). When a launch's table fills up, it is launched and filling starts over, carrying
// a tensor that was only partly covered into the next launch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/chunk.h"
#include "common/launch.cuh"
#include "common/optimizer.h"
#include "common/tensor_list.h"

namespace jgsess {

// Success, or the last CUDA error as an FFI error naming the kernel (call after launching).
inline ffi::Error CudaStatus(const char* kernel, cudaError_t err = cudaGetLastError()) {
  if (err == cudaSuccess) return ffi::Error::Success();
  return Internal(std::string(kernel) + ": " + cudaGetErrorString(err));
}

// Loads the kernels' code now, into every device's context. Under lazy module loading (CUDA
// 12.2+'s default) a kernel's first launch would load it, and XLA may capture that launch into a
// CUDA graph (the handlers are command-buffer compatible), where loading fails. Each CUDA
// handler's instantiate stage calls this; XLA runs it once, when it builds the executable, on
// whichever device is current then, while the executable runs on every device of the process
// (one process driving a node's GPUs). The current device is restored.
template <typename... Kernels>
cudaError_t LoadKernels(Kernels*... kernels) {
  int current = 0, count = 0;
  cudaError_t err = cudaGetDevice(&current);
  if (err == cudaSuccess) err = cudaGetDeviceCount(&count);
  for (int device = 0; device < count && err == cudaSuccess; ++device) {
    err = cudaSetDevice(device);
    cudaFuncAttributes attributes;
    ((err = err == cudaSuccess
                ? cudaFuncGetAttributes(&attributes, reinterpret_cast<const void*>(kernels))
                : err),
     ...);
  }
  const cudaError_t restored = cudaSetDevice(current);
  return err == cudaSuccess ? restored : err;
}

// The binding of a CUDA handler's instantiate stage, which loads its kernels (`load`): it reads
// nothing of the call, whose operands and attributes some XLA versions pass to it.
inline auto LoadBinding() {
  return ffi::Ffi::BindInstantiate().RemainingArgs().RemainingRets().Attrs();
}

template <ffi::Error (*kLoad)()>
ffi::Error Load(Args, Rets, ffi::Dictionary) {
  return kLoad();
}

constexpr int kCudaBlock = 512;

enum class Elem : int8_t { kF32, kBF16, kF16 };

inline Elem ElemOf(DataType type) {
  return type == DataType::BF16 ? Elem::kBF16 : type == DataType::F16 ? Elem::kF16 : Elem::kF32;
}

__device__ __forceinline__ float LoadF32(const void* p, Elem type, int64_t i) {
  switch (type) {
    case Elem::kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case Elem::kF16: return __half2float(static_cast<const __half*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

// f32 -> bf16 / f16 rounding to nearest even; a NaN keeps its sign and the top of its payload,
// quieted, as the CPU kernels' conversions do (the GPU's own make every NaN 0x7fff).
__device__ __forceinline__ __nv_bfloat16 ToBf16(float v) {
  if (v != v) return __ushort_as_bfloat16((__float_as_uint(v) >> 16) | 0x40u);
  return __float2bfloat16_rn(v);
}

__device__ __forceinline__ __half ToF16(float v) {
  if (v != v) {
    const unsigned bits = __float_as_uint(v);
    return __ushort_as_half(((bits >> 16) & 0x8000u) | 0x7e00u | ((bits >> 13) & 0x3ffu));
  }
  return __float2half_rn(v);
}

__device__ __forceinline__ void StoreF32(void* p, Elem type, int64_t i, float v) {
  switch (type) {
    case Elem::kBF16: static_cast<__nv_bfloat16*>(p)[i] = ToBf16(v); break;
    case Elem::kF16: static_cast<__half*>(p)[i] = ToF16(v); break;
    default: static_cast<float*>(p)[i] = v;
  }
}

// f(q) with q the element math's rounding (common/optimizer.h): each operation rounded to the
// tensor's `type` (bf16 or f16) under a narrow-math flag, none otherwise.
template <bool kNarrow, typename F>
__device__ __forceinline__ void WithRounding(Elem type, F&& f) {
  if constexpr (kNarrow) {
    if (type == Elem::kBF16) {
      f(InBf16{});
    } else {
      f(InF16{});
    }
  } else {
    f(InF32{});
  }
}

// CUDA's limit on a kernel's parameters since 12.1, on Volta and newer (jgsess needs a 12.1
// driver: jgsess/kernels/_native.py, MIN_CUDA_DRIVER); 4 KB before.
constexpr size_t kMaxKernelParamBytes = 32764;
// A launch's table of tensors: its parameters are copied with every launch, so it is kept to
// ~9 KB, room for 320 chunks (20M elements) and, by the number of lists, 97 (adamw's 7) to 406
// (global_norm's 1) tensors; the other parameters (HyperPtrs, workspace pointers) fit beside.
constexpr size_t kTableBytes = 9472;
constexpr int kTableBlocks = 320;

template <int kLists>
struct TensorTable {
  // each tensor takes a pointer and an element type per list, and its size
  static constexpr int kMaxTensors =
      static_cast<int>((kTableBytes - kTableBlocks * 2 * sizeof(int)) /
                       (kLists * (sizeof(void*) + sizeof(Elem)) + sizeof(int64_t)));
  static constexpr int kMaxBlocks = kTableBlocks;

  void* ptr[kLists][kMaxTensors];
  Elem type[kLists][kMaxTensors];
  int64_t size[kMaxTensors];
  int block_tensor[kMaxBlocks];
  int block_chunk[kMaxBlocks];
};

// Launches launch(table, num_blocks) as many times as the tensors need. Lists 0..kIn-1 are the
// operands, kIn..kIn+kOut-1 the results.
template <int kIn, int kOut, typename Launch>
cudaError_t MultiTensorApply(const std::vector<TensorSlots<kIn, kOut>>& tensors, Launch launch) {
  using Table = TensorTable<kIn + kOut>;
  static_assert(sizeof(Table) <= kTableBytes && kTableBytes + 1024 <= kMaxKernelParamBytes,
                "a launch's table and its other parameters fit CUDA's parameter space");
  constexpr int kMaxTensors = Table::kMaxTensors, kMaxBlocks = Table::kMaxBlocks;
  Table table;
  int count = 0, blocks = 0;
  auto put = [&](int slot, const TensorSlots<kIn, kOut>& t) {
    for (int l = 0; l < kIn; ++l) {
      table.ptr[l][slot] = const_cast<void*>(t.in[l]);
      table.type[l][slot] = ElemOf(t.in_type[l]);
    }
    for (int l = 0; l < kOut; ++l) {
      table.ptr[kIn + l][slot] = t.out[l];
      table.type[kIn + l][slot] = ElemOf(t.out_type[l]);
    }
    table.size[slot] = t.size;
  };
  for (const auto& t : tensors) {
    if (t.size == 0) continue;
    put(count++, t);
    const int64_t chunks = (t.size + kChunk - 1) / kChunk;
    for (int64_t c = 0; c < chunks; ++c) {
      table.block_tensor[blocks] = count - 1;
      table.block_chunk[blocks] = static_cast<int>(c);
      ++blocks;
      const bool last_chunk = c == chunks - 1;
      if (blocks == kMaxBlocks || (last_chunk && count == kMaxTensors)) {
        launch(table, blocks);
        if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
        blocks = 0;
        count = 0;
        if (!last_chunk) put(count++, t);  // the tensor continues in the next launch
      }
    }
  }
  if (blocks > 0) launch(table, blocks);
  return cudaGetLastError();
}

// An optimizer family's launches over a member's tensors (see DispatchOptimizer), table after
// table; the CUDA status as an error naming the family.
template <typename Family, typename Launch>
ffi::Error LaunchTables(const std::vector<TensorSlots<Family::kIn, Family::kOut>>& tensors,
                        Launch launch) {
  return CudaStatus(Family::kName, MultiTensorApply<Family::kIn, Family::kOut>(tensors, launch));
}

}  // namespace jgsess
