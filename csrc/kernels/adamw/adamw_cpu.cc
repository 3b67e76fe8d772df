// Multi-tensor Adam / AdamW on the CPU: all cores (XLA's intra-op pool), SIMD inner loops.
#include <vector>

#include "common/ffi.h"
#include "common/parallel.h"
#include "kernels/adamw/adamw.h"

namespace jgsess {
namespace {

struct AdamwTensor {
  const float* p;
  const float* g;
  const float* m;
  const float* v;
  float* p_out;
  float* m_out;
  float* v_out;
};

// One contiguous piece. Outputs may be their inputs (in-place updates) but never overlap them
// otherwise, and element i only reads and writes index i: no dependence between iterations.
template <int64_t kFlags>
void AdamwRange(const AdamwHyper& h, const AdamwTensor& t, int64_t begin, int64_t end) {
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) {
    AdamwElement<kFlags>(h, t.p[i], t.g[i], t.m[i], t.v[i], &t.p_out[i], &t.m_out[i],
                         &t.v_out[i]);
  }
}

ffi::Error AdamwCpuImpl(ffi::ThreadPool pool, Scalar b1, Scalar omb1, Scalar b2, Scalar omb2,
                        Scalar bc1, Scalar bc2, Scalar eps, Scalar eps_root, Scalar wd, Scalar lr,
                        Args args, Rets rets, int64_t flags) {
  const AdamwHyper h{*b1.typed_data(),  *omb1.typed_data(), *b2.typed_data(),
                     *omb2.typed_data(), *bc1.typed_data(),  *bc2.typed_data(),
                     *eps.typed_data(),  *eps_root.typed_data(), *wd.typed_data(),
                     *lr.typed_data()};
  if (args.size() % 4 != 0 || rets.size() * 4 != args.size() * 3) {
    return InvalidArgument("adamw: expected (p, g, m, v) per tensor and (p', m', v') results");
  }
  const size_t n = args.size() / 4;
  std::vector<AdamwTensor> tensors(n);
  std::vector<int64_t> sizes(n);
  for (size_t t = 0; t < n; ++t) {
    const float* in[4] = {};
    for (size_t k = 0; k < 4; ++k) {
      auto arg = args.get<Buffer>(4 * t + k);
      if (arg.has_error()) return arg.error();
      const auto count = static_cast<int64_t>(arg->element_count());
      if (arg->element_type() != DataType::F32 || (k > 0 && count != sizes[t])) {
        return InvalidArgument("adamw: p, g, m, v must be f32 of one size");
      }
      sizes[t] = count;
      in[k] = static_cast<const float*>(arg->untyped_data());
    }
    float* out[3] = {};
    for (size_t k = 0; k < 3; ++k) {
      auto ret = rets.get<Buffer>(3 * t + k);
      if (ret.has_error()) return ret.error();
      if (static_cast<int64_t>((*ret)->element_count()) != sizes[t]) {
        return InvalidArgument("adamw: results must match their operands");
      }
      out[k] = static_cast<float*>((*ret)->untyped_data());
    }
    tensors[t] = {in[0], in[1], in[2], in[3], out[0], out[1], out[2]};
  }
  const TensorGroup group(sizes);
  return DispatchAdamwFlags(flags, [&]<int64_t kFlags>() {
    ParallelFor(pool, group.num_chunks(), [&](int64_t c) {
      group.ForChunk(c, [&](size_t t, int64_t begin, int64_t end) {
        AdamwRange<kFlags>(h, tensors[t], begin, end);
      });
    });
    return ffi::Error::Success();
  });
}

}  // namespace
}  // namespace jgsess

XLA_FFI_DEFINE_HANDLER_SYMBOL(AdamwCpu, jgsess::AdamwCpuImpl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::ThreadPool>()
                                  .Arg<jgsess::Scalar>()  // b1
                                  .Arg<jgsess::Scalar>()  // omb1 = 1 - b1
                                  .Arg<jgsess::Scalar>()  // b2
                                  .Arg<jgsess::Scalar>()  // omb2 = 1 - b2
                                  .Arg<jgsess::Scalar>()  // bc1 = 1 - b1^t
                                  .Arg<jgsess::Scalar>()  // bc2 = 1 - b2^t
                                  .Arg<jgsess::Scalar>()  // eps
                                  .Arg<jgsess::Scalar>()  // eps_root
                                  .Arg<jgsess::Scalar>()  // weight decay
                                  .Arg<jgsess::Scalar>()  // learning rate
                                  .RemainingArgs()        // (p, g, m, v) per tensor
                                  .RemainingRets()        // (p', m', v') per tensor
                                  .Attr<int64_t>("flags"));
