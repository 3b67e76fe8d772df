// Global norm on the CPU: chunks' partial sums on all cores, then the ordered total.
#include <cmath>
#include <vector>

#include "common/convert.h"
#include "common/ffi.h"
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
  std::vector<Item> items;
  std::vector<int64_t> first_item;  // per tensor
  for (size_t t = 0; t < args.size(); ++t) {
    auto x = args.get<Buffer>(t);
    if (x.has_error()) return x.error();
    if (!IsKernelFloat(x->element_type())) return InvalidArgument("global_norm: unsupported dtype");
    first_item.push_back(static_cast<int64_t>(items.size()));
    const auto size = static_cast<int64_t>(x->element_count());
    for (int64_t begin = 0; begin < size; begin += kNormChunk) {
      items.push_back({x->untyped_data(), x->element_type(), begin, std::min(size, begin + kNormChunk)});
    }
  }
  if (workspace_offset + sizeof(float) * items.size() > arena.size_bytes()) {
    return InvalidArgument("global_norm: the workspace does not fit the arena");
  }
  // arena and arena_out are one buffer (aliased): the partials live in it
  float* partial = reinterpret_cast<float*>(static_cast<char*>(arena_out->untyped_data()) +
                                            workspace_offset);
  ParallelFor(pool, static_cast<int64_t>(items.size()), [&](int64_t i) {
    thread_local std::vector<float> scratch(kNormChunk);
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
                                  .Arg<jgsess::Buffer>()                        // arena
                                  .RemainingArgs()                              // x per tensor
                                  .Ret<xla::ffi::BufferR0<xla::ffi::F32>>()  // the norm
                                  .Ret<jgsess::Buffer>()                        // arena (aliased)
                                  .Attr<int64_t>("workspace_offset"));
