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
#include <type_traits>
#include <utility>
#include <vector>

#include "common/chunk.h"
#include "common/cuda_devices.h"
#include "common/launch.cuh"
#include "common/optimizer.h"
#include "common/tensor_list.h"

namespace jgsess {

using F32 = float;
using BF16 = __nv_bfloat16;
using F16 = __half;

// Success, or the last CUDA error as an FFI error naming the kernel (call after launching).
inline ffi::Error CudaStatus(const char* kernel, cudaError_t err = cudaGetLastError()) {
  if (err == cudaSuccess) return ffi::Error::Success();
  return Internal(std::string(kernel) + ": " + cudaGetErrorString(err));
}

// Loads the kernels' code now, into the context of every device the process uses
// (cuda_devices.h). Under lazy module loading (CUDA 12.2+'s default) a kernel's first launch
// would load it, and XLA may capture that launch into a CUDA graph (the handlers are
// command-buffer compatible), where loading fails. Each CUDA handler's instantiate stage calls
// this; XLA runs it once, when it builds the executable, on whichever device is current then,
// while the executable runs on every device of the process (one process driving a node's
// GPUs). The current device is restored.
template <typename... Kernels>
cudaError_t LoadKernels(Kernels*... kernels) {
  int current = 0, count = 0;
  cudaError_t err = cudaGetDevice(&current);
  if (err == cudaSuccess) err = cudaGetDeviceCount(&count);
  for (int device = 0; device < count && err == cudaSuccess; ++device) {
    if (!UsesCudaDevice(device)) continue;  // no context on a GPU this process does not use
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

__device__ __forceinline__ float Widen(float x) { return x; }
__device__ __forceinline__ float Widen(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float Widen(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T Narrow(float v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return ToBf16(v);
  } else if constexpr (std::is_same_v<T, __half>) {
    return ToF16(v);
  } else {
    return v;
  }
}

// Element i of a buffer whose type is known only at run time (Elem), widened / rounded.
__device__ __forceinline__ float LoadF32(const void* p, Elem type, int64_t i) {
  switch (type) {
    case Elem::kBF16: return Widen(static_cast<const BF16*>(p)[i]);
    case Elem::kF16: return Widen(static_cast<const F16*>(p)[i]);
    default: return static_cast<const F32*>(p)[i];
  }
}

__device__ __forceinline__ void StoreF32(void* p, Elem type, int64_t i, float v) {
  switch (type) {
    case Elem::kBF16: static_cast<BF16*>(p)[i] = Narrow<BF16>(v); break;
    case Elem::kF16: static_cast<F16*>(p)[i] = Narrow<F16>(v); break;
    default: static_cast<F32*>(p)[i] = v;
  }
}

// CUDA's limit on a kernel's parameters since 12.1, on Volta and newer (jgsess needs a 12.1
// driver: jgsess/kernels/_native.py, MIN_CUDA_DRIVER); 4 KB before.
constexpr size_t kMaxKernelParamBytes = 32764;
// A launch's table of tensors: its parameters are copied with every launch, so it is kept to
// ~9 KB, room for 320 chunks (20M elements) and, by the number of lists, 96 (adamw's 7) to 384
// (global_norm's 1) tensors; the other parameters (HyperPtrs, workspace pointers) fit beside.
constexpr size_t kTableBytes = 9472;
constexpr int kTableBlocks = 320;
// Blocks per chunk: a full table launches 640 blocks of 512 threads, at least 4 per SM on an
// H100 or H200 (132 SMs), each over a part of kChunk / kParts elements.
constexpr int kParts = 2;
constexpr int kPartElements = static_cast<int>(kChunk / kParts);

template <int kLists>
struct TensorTable {
  // each tensor takes a pointer and an element type per list, its size and its alignment
  static constexpr int kMaxTensors =
      static_cast<int>((kTableBytes - kTableBlocks * 2 * sizeof(int)) /
                       (kLists * (sizeof(void*) + sizeof(Elem)) + sizeof(int64_t) + 1));
  static constexpr int kMaxBlocks = kTableBlocks;

  void* ptr[kLists][kMaxTensors];
  Elem type[kLists][kMaxTensors];
  int64_t size[kMaxTensors];
  bool aligned[kMaxTensors];  // every list's buffer starts on a 16-byte boundary
  int block_tensor[kMaxBlocks];
  int block_chunk[kMaxBlocks];
};

// Launches launch(table, entries) as many times as the tensors need; a launch's grid is
// entries * kParts blocks. Lists 0..kIn-1 are the operands, kIn..kIn+kOut-1 the results.
template <int kIn, int kOut, typename Launch>
cudaError_t MultiTensorApply(const std::vector<TensorSlots<kIn, kOut>>& tensors, Launch launch) {
  using Table = TensorTable<kIn + kOut>;
  static_assert(sizeof(Table) <= kTableBytes && kTableBytes + 1024 <= kMaxKernelParamBytes,
                "a launch's table and its other parameters fit CUDA's parameter space");
  constexpr int kMaxTensors = Table::kMaxTensors, kMaxBlocks = Table::kMaxBlocks;
  Table table;
  int count = 0, blocks = 0;
  auto put = [&](int slot, const TensorSlots<kIn, kOut>& t) {
    bool aligned = true;
    for (int l = 0; l < kIn; ++l) {
      table.ptr[l][slot] = const_cast<void*>(t.in[l]);
      table.type[l][slot] = ElemOf(t.in_type[l]);
      aligned = aligned && reinterpret_cast<uintptr_t>(t.in[l]) % 16 == 0;
    }
    for (int l = 0; l < kOut; ++l) {
      table.ptr[kIn + l][slot] = t.out[l];
      table.type[kIn + l][slot] = ElemOf(t.out_type[l]);
      aligned = aligned && reinterpret_cast<uintptr_t>(t.out[l]) % 16 == 0;
    }
    table.size[slot] = t.size;
    table.aligned[slot] = aligned;
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

// The elements a block covers: [begin, begin + count) of table tensor `tensor` (count 0 for a
// part past the tensor's end).
struct Part {
  int tensor;
  int64_t begin;
  int count;
};

template <int kLists>
__device__ __forceinline__ Part BlockPart(const TensorTable<kLists>& table) {
  const int entry = static_cast<int>(blockIdx.x) / kParts;
  const int t = table.block_tensor[entry];
  const int64_t begin = static_cast<int64_t>(table.block_chunk[entry]) * kChunk +
                        static_cast<int64_t>(blockIdx.x % kParts) * kPartElements;
  const int64_t left = table.size[t] - begin;
  return {t, begin,
          left <= 0 ? 0 : static_cast<int>(min(left, static_cast<int64_t>(kPartElements)))};
}

// One element type per list, fixed at compile time: a kernel has an instance per tuple of its
// lists' types, and a block picks one, once, from its tensor's types.
template <typename... T>
struct Types {};

template <typename T>
constexpr Elem kElemOf = std::is_same_v<T, __nv_bfloat16> ? Elem::kBF16
                         : std::is_same_v<T, __half>      ? Elem::kF16
                                                          : Elem::kF32;

// Whether table tensor t's lists first, first + 1, ... have the types T...
template <int kLists, typename... T>
__device__ __forceinline__ bool HasTypes(const TensorTable<kLists>& table, int t, int first,
                                         Types<T...>) {
  int l = first;
  return ((table.type[l++][t] == kElemOf<T>) && ...);
}

// Elements per thread and step: 8 bf16/f16 are one 16-byte access, 8 f32 two.
constexpr int kVec = 8;

template <typename T>
__device__ __forceinline__ void LoadVec(const T* p, float (&out)[kVec]) {
  constexpr int kWords = kVec * sizeof(T) / sizeof(uint4);
  uint4 words[kWords];
#pragma unroll
  for (int w = 0; w < kWords; ++w) {
    JGSESS_CHECK_ALIGNED(reinterpret_cast<const uint4*>(p) + w, sizeof(uint4));
    words[w] = reinterpret_cast<const uint4*>(p)[w];
  }
  T values[kVec];
  memcpy(values, words, sizeof(values));
#pragma unroll
  for (int e = 0; e < kVec; ++e) out[e] = Widen(values[e]);
}

template <typename T>
__device__ __forceinline__ void StoreVec(T* p, const float (&in)[kVec]) {
  constexpr int kWords = kVec * sizeof(T) / sizeof(uint4);
  T values[kVec];
#pragma unroll
  for (int e = 0; e < kVec; ++e) values[e] = Narrow<T>(in[e]);
  uint4 words[kWords];
  memcpy(words, values, sizeof(words));
#pragma unroll
  for (int w = 0; w < kWords; ++w) {
    JGSESS_CHECK_ALIGNED(reinterpret_cast<uint4*>(p) + w, sizeof(uint4));
    reinterpret_cast<uint4*>(p)[w] = words[w];
  }
}

template <typename In, typename Out>
struct PartLoop;

// A block's part of tensor t, its operands of types I... and its results of types O...:
// op(in, out) per element, in[k] operand k's element widened to f32, out[k] rounded to result
// k's type. Pointers are read once, offsets within the part are 32-bit. A tensor whose buffers
// all start on 16-byte boundaries moves kVec elements per thread and step with 16-byte accesses,
// loading the next step's before the current step's math, and then its last count % kVec
// elements one per thread; any other tensor moves one element per thread and step.
template <typename... I, typename... O>
struct PartLoop<Types<I...>, Types<O...>> {
  static constexpr int kIn = sizeof...(I), kOut = sizeof...(O);
  static constexpr int kOutSlots = kOut > 0 ? kOut : 1;
  using In = std::make_index_sequence<kIn>;
  using Out = std::make_index_sequence<kOut>;

  template <typename Op>
  __device__ static void Run(const TensorTable<kIn + kOut>& table, const Part& part, Op op) {
    const char* in[kIn];
    char* out[kOutSlots];
    [&]<size_t... K>(std::index_sequence<K...>) {
      ((in[K] = static_cast<const char*>(table.ptr[K][part.tensor]) + part.begin * sizeof(I)), ...);
    }(In{});
    [&]<size_t... K>(std::index_sequence<K...>) {
      ((out[K] = static_cast<char*>(table.ptr[kIn + K][part.tensor]) + part.begin * sizeof(O)),
       ...);
    }(Out{});
    const int vector_end = table.aligned[part.tensor] ? part.count - part.count % kVec : 0;
    const int step = static_cast<int>(blockDim.x) * kVec;
    int i = static_cast<int>(threadIdx.x) * kVec;
    float now[kIn][kVec];
    if (i < vector_end) Load(in, i, now, In{});
    for (; i < vector_end; i += step) {
      float next[kIn][kVec];
      const bool more = i + step < vector_end;
      if (more) Load(in, i + step, next, In{});
      float results[kOutSlots][kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        float args[kIn], res[kOutSlots];
#pragma unroll
        for (int k = 0; k < kIn; ++k) args[k] = now[k][e];
        op(args, res);
#pragma unroll
        for (int k = 0; k < kOut; ++k) results[k][e] = res[k];
      }
      [&]<size_t... K>(std::index_sequence<K...>) {
        (StoreVec(reinterpret_cast<O*>(out[K]) + i, results[K]), ...);
      }(Out{});
      if (more) memcpy(now, next, sizeof(now));
    }
    for (int j = vector_end + static_cast<int>(threadIdx.x); j < part.count;
         j += static_cast<int>(blockDim.x)) {
      float args[kIn], res[kOutSlots];
      [&]<size_t... K>(std::index_sequence<K...>) {
        ((args[K] = Widen(reinterpret_cast<const I*>(in[K])[j])), ...);
      }(In{});
      op(args, res);
      [&]<size_t... K>(std::index_sequence<K...>) {
        ((reinterpret_cast<O*>(out[K])[j] = Narrow<O>(res[K])), ...);
      }(Out{});
    }
  }

 private:
  template <size_t... K>
  __device__ static void Load(const char* const (&in)[kIn], int i, float (&v)[kIn][kVec],
                              std::index_sequence<K...>) {
    (LoadVec(reinterpret_cast<const I*>(in[K]) + i, v[K]), ...);
  }
};

// The same over any types, read from the table per element: for type tuples a kernel has no
// instance for.
template <int kIn, int kOut, typename Op>
__device__ void AnyTypesPartLoop(const TensorTable<kIn + kOut>& table, const Part& part, Op op) {
  const int t = part.tensor;
  for (int j = static_cast<int>(threadIdx.x); j < part.count; j += static_cast<int>(blockDim.x)) {
    const int64_t i = part.begin + j;
    float args[kIn], res[kOut > 0 ? kOut : 1];
    for (int k = 0; k < kIn; ++k) args[k] = LoadF32(table.ptr[k][t], table.type[k][t], i);
    op(args, res);
    for (int k = 0; k < kOut; ++k)
      StoreF32(table.ptr[kIn + k][t], table.type[kIn + k][t], i, res[k]);
  }
}

// An optimizer family's launches over a member's tensors (see DispatchOptimizer), table after
// table; the CUDA status as an error naming the family.
template <typename Family, typename Launch>
ffi::Error LaunchTables(const std::vector<TensorSlots<Family::kIn, Family::kOut>>& tensors,
                        Launch launch) {
  return CudaStatus(Family::kName, MultiTensorApply<Family::kIn, Family::kOut>(tensors, launch));
}

}  // namespace jgsess
