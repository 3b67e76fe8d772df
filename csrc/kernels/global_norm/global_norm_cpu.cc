// Global norm on the CPU: chunks' partial sums on all cores, then the ordered total.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/ffi.h"
#include "common/multi_tensor_cpu.h"
#include "common/parallel.h"
#include "kernels/global_norm/global_norm.h"

namespace jgsess {
namespace {

struct Item {
  const void* data;
  DataType type;
  int64_t begin, end;
};

float SumSquares(const Item& item, float* scratch) {
  const int64_t n = item.end - item.begin;
  const float* x = static_cast<const float*>(item.data) + item.begin;
  if (item.type != DataType::F32) {
    LoadF32(item.type, item.data, item.begin, n, scratch);
    x = scratch;
  }
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += x[i] * x[i];
  return sum;
}

ffi::Error GlobalNormCpuImpl(ffi::ThreadPool pool, Buffer arena, Args args,
                             ffi::Result<ffi::BufferR0<ffi::F32>> norm,
                             ffi::Result<Buffer> arena_out, int64_t workspace_offset) {
  auto call = ParseNorm(arena, args, *arena_out, workspace_offset, sizeof(float));
  if (call.has_error()) return call.error();
  std::vector<Item> items;
  std::vector<int64_t> first_item;  // per tensor
  for (const auto& t : call->tensors) {
    first_item.push_back(static_cast<int64_t>(items.size()));
    for (int64_t begin = 0; begin < t.size; begin += kChunk) {
      items.push_back({t.in[0], t.in_type[0], begin, std::min(t.size, begin + kChunk)});
    }
  }
  // arena and arena_out are one buffer when aliased (always, in a planned program)
  if (arena.untyped_data() != arena_out->untyped_data()) {
    std::memcpy(arena_out->untyped_data(), arena.untyped_data(), arena.size_bytes());
  }
  float* partial = reinterpret_cast<float*>(call->workspace);
  ParallelFor(pool, static_cast<int64_t>(items.size()), [&](int64_t i) {
    thread_local std::vector<float> scratch(kChunk);
    partial[i] = SumSquares(items[i], scratch.data());
  });
  first_item.push_back(static_cast<int64_t>(items.size()));
  float total = 0.0f;
  for (size_t t = 0; t + 1 < first_item.size(); ++t) {
    float sum = 0.0f;
    for (int64_t i = first_item[t]; i < first_item[t + 1]; ++i) sum = sum + partial[i];
    total = total + sum;
  }
  *norm->typed_data() = std::sqrt(total);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jgsess

XLA_FFI_DEFINE_HANDLER_SYMBOL(GlobalNormCpu, jgsess::GlobalNormCpuImpl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::ThreadPool>()
                                  .Arg<jgsess::Buffer>()                     // arena
                                  .RemainingArgs()                           // x per tensor
                                  .Ret<xla::ffi::BufferR0<xla::ffi::F32>>()  // the norm
                                  .Ret<jgsess::Buffer>()                     // arena (aliased)
                                  .Attr<int64_t>("workspace_offset"));
