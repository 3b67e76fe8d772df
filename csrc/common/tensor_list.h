// The operand checker of the multi-tensor kernels, shared by their CPU and CUDA handlers.
//
// A call's operands are the family's hyper-parameters (rank-0 f32, see Hyper below), then kIn
// buffers per tensor; its remaining results are kOut buffers per tensor, tensor after tensor.
// Every buffer of a tensor has the same number of elements; each may be f32, bf16 or f16
// (kernels compute in f32: narrower operands are widened exactly, narrower results rounded to
// nearest even, as XLA's convert does). Everything
// is checked before a handler writes anything: a malformed call is an error, never a crash.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "common/dispatch.h"
#include "common/ffi.h"
#include "common/host_device.h"

namespace jgsess {

inline bool IsKernelFloat(DataType t) {
  return t == DataType::F32 || t == DataType::BF16 || t == DataType::F16;
}

// A dtype's name as jax prints it, for error messages.
inline std::string TypeName(DataType t) {
  switch (t) {
    case DataType::F32: return "float32";
    case DataType::BF16: return "bfloat16";
    case DataType::F16: return "float16";
    case DataType::F64: return "float64";
    case DataType::S8: return "int8";
    case DataType::S16: return "int16";
    case DataType::S32: return "int32";
    case DataType::S64: return "int64";
    case DataType::U8: return "uint8";
    case DataType::U16: return "uint16";
    case DataType::U32: return "uint32";
    case DataType::U64: return "uint64";
    case DataType::PRED: return "bool";
    default: return "dtype #" + std::to_string(static_cast<int>(t));
  }
}

// "bfloat16[3,4]": a buffer's dtype and shape as jax prints them, for error messages (`type`
// for a buffer typed at compile time).
template <typename B>
std::string Describe(const B& b, DataType type) {
  std::string text = TypeName(type) + "[";
  const auto dims = b.dimensions();
  for (size_t i = 0; i < dims.size(); ++i) text += (i ? "," : "") + std::to_string(dims[i]);
  return text + "]";
}

inline std::string Describe(const Buffer& b) { return Describe(b, b.element_type()); }

// The first failed check of a buffer, as "<what> is <dtype[shape]>; expected <expected>";
// `expected()` makes its text, only for a check that failed.
class FirstProblem {
 public:
  template <typename B, typename Expected>
  void Check(bool ok, const char* what, const B& b, DataType type, Expected&& expected) {
    if (!ok && problem_.empty())
      problem_ = std::string(what) + " is " + Describe(b, type) + "; expected " + expected();
  }
  template <typename Expected>
  void Check(bool ok, const char* what, const Buffer& b, Expected&& expected) {
    Check(ok, what, b, b.element_type(), expected);
  }
  bool found() const { return !problem_.empty(); }
  const std::string& text() const { return problem_; }

 private:
  std::string problem_;
};

template <int kIn, int kOut>
struct TensorSlots {
  const void* in[kIn];
  DataType in_type[kIn];
  void* out[kOut > 0 ? kOut : 1];
  DataType out_type[kOut > 0 ? kOut : 1];
  int64_t size;
};

// A family's hyper-parameters are one struct of floats, in operand order: the only list of them
// in C++. CPU handlers read the values on the host; CUDA kernels get the device pointers and
// read them inside the kernel (no host synchronization).
template <typename Hyper>
constexpr int kHyperCount = sizeof(Hyper) / sizeof(float);

// Under jax.vmap a hyper-parameter may hold one value per member of the batch (an ensemble's
// step counts): then every hyper-parameter holds `members` values and every tensor `members`
// equal consecutive parts (the batch axis leads), and member b's part gets Member(hyper, b).
template <typename Hyper>
struct HyperPtrs {
  static_assert(std::is_trivially_copyable_v<Hyper> && sizeof(Hyper) % sizeof(float) == 0,
                "hyper-parameters are a struct of floats");
  const float* ptr[kHyperCount<Hyper>];
  int64_t members;
};

template <typename Hyper>
JGSESS_HOST_DEVICE Hyper LoadHyper(const HyperPtrs<Hyper>& p) {
  float values[kHyperCount<Hyper>];
  for (int i = 0; i < kHyperCount<Hyper>; ++i) values[i] = *p.ptr[i];
  Hyper h;
  memcpy(&h, values, sizeof(h));
  return h;
}

// Member b's hyper-parameters (see HyperPtrs).
template <typename Hyper>
HyperPtrs<Hyper> Member(HyperPtrs<Hyper> hyper, int64_t b) {
  for (auto& ptr : hyper.ptr) ptr += b;
  hyper.members = 1;
  return hyper;
}

// args[0, kHyperCount<Hyper>): f32 buffers, each rank 0, or all with the same number of values
// (one per member).
template <typename Hyper>
ffi::ErrorOr<HyperPtrs<Hyper>> ParseHyper(const char* kernel, Args& args) {
  if (args.size() < static_cast<size_t>(kHyperCount<Hyper>)) {
    return Invalid(kernel, "missing hyper-parameters");
  }
  HyperPtrs<Hyper> hyper;
  for (int i = 0; i < kHyperCount<Hyper>; ++i) {
    auto arg = args.get<Buffer>(i);
    if (arg.has_error()) return ffi::Unexpected(arg.error());
    const auto count = static_cast<int64_t>(arg->element_count());
    if (i == 0) hyper.members = arg->dimensions().size() == 0 ? 1 : count;
    if (arg->element_type() != DataType::F32 || count != hyper.members || count == 0) {
      return Invalid(kernel, "hyper-parameter " + std::to_string(i) + " is " + Describe(*arg) +
                                 "; expected float32, rank 0 or one per member (as " +
                                 "hyper-parameter 0: " + std::to_string(hyper.members) + ")");
    }
    hyper.ptr[i] = static_cast<const float*>(arg->untyped_data());
  }
  return hyper;
}

// A buffer of `size` elements (any size when size < 0) of a kernel float type; `what()` names it
// in the error ("tensor 3's operand 1 (call operand 17)"), made only for a buffer that fails.
template <typename What>
ffi::Error CheckFloat(const char* kernel, const Buffer& b, int64_t size, What&& what) {
  const bool sized = size < 0 || static_cast<int64_t>(b.element_count()) == size;
  if (IsKernelFloat(b.element_type()) && sized) return ffi::Error::Success();
  return InvalidArgument(
      std::string(kernel) + ": " + what() + " is " + Describe(b) +
      "; expected float32, bfloat16 or float16" +
      (size < 0 ? std::string() : " of " + std::to_string(size) + " elements, as the first"));
}

// "tensor 3's operand 1 (call operand 17)"
inline std::string Slot(size_t tensor, const char* kind, int k, size_t position) {
  return "tensor " + std::to_string(tensor) + "'s " + kind + " " + std::to_string(k) + " (call " +
         kind + " " + std::to_string(position) + ")";
}

// Parses args[first..] (kIn per tensor) and rets[0..] (kOut per tensor; none when rets is
// null).
template <int kIn, int kOut>
ffi::ErrorOr<std::vector<TensorSlots<kIn, kOut>>> ParseTensors(const char* kernel, Args& args,
                                                               size_t first, Rets* rets) {
  if (args.size() < first) return Invalid(kernel, "too few operands");
  const size_t operands = args.size() - first, results = rets ? rets->size() : 0;
  if (operands % kIn != 0 || results * kIn != operands * kOut) {
    return Invalid(kernel, std::to_string(operands) + " tensor operands and " +
                               std::to_string(results) + " results do not pair up; expected " +
                               std::to_string(kIn) + " operands and " + std::to_string(kOut) +
                               " results per tensor");
  }
  std::vector<TensorSlots<kIn, kOut>> tensors(operands / kIn);
  for (size_t t = 0; t < tensors.size(); ++t) {
    auto& slots = tensors[t];
    for (int k = 0; k < kIn; ++k) {
      auto arg = args.get<Buffer>(first + kIn * t + k);
      if (arg.has_error()) return ffi::Unexpected(arg.error());
      if (k == 0) slots.size = static_cast<int64_t>(arg->element_count());
      const size_t position = first + kIn * t + k;
      auto ok =
          CheckFloat(kernel, *arg, slots.size, [&] { return Slot(t, "operand", k, position); });
      if (ok.failure()) return ffi::Unexpected(ok);
      slots.in[k] = arg->untyped_data();
      slots.in_type[k] = arg->element_type();
    }
    for (int k = 0; k < kOut; ++k) {
      auto ret = rets->get<Buffer>(kOut * t + k);
      if (ret.has_error()) return ffi::Unexpected(ret.error());
      auto ok =
          CheckFloat(kernel, **ret, slots.size, [&] { return Slot(t, "result", k, kOut * t + k); });
      if (ok.failure()) return ffi::Unexpected(ok);
      slots.out[k] = (*ret)->untyped_data();
      slots.out_type[k] = (*ret)->element_type();
    }
  }
  return tensors;
}

// A call under a kernel's narrow-math flag (an update written in bf16 or f16): every buffer of a
// tensor is of one type, bf16 or f16.
template <int kIn, int kOut>
ffi::Error CheckNarrow(const char* kernel, const std::vector<TensorSlots<kIn, kOut>>& tensors) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    const DataType type = t.in_type[0];
    auto each = [&](int k) { return k < kIn ? t.in_type[k] : t.out_type[k - kIn]; };
    bool ok = type == DataType::BF16 || type == DataType::F16;
    for (int k = 0; k < kIn + kOut; ++k) ok = ok && each(k) == type;
    if (!ok) {
      std::string types;
      for (int k = 0; k < kIn + kOut; ++k) types += (k ? ", " : "") + TypeName(each(k));
      return InvalidArgument(std::string(kernel) + ": tensor " + std::to_string(i) +
                             "'s operands and results are " + types +
                             "; narrow math expects them all bfloat16, or all float16");
    }
  }
  return ffi::Error::Success();
}

// The binding of a multi-tensor kernel with a `flags` attribute (adamw, momentum), shared by the
// CPU and CUDA handlers: the hyper-parameters, then the tensors' operands, as the remaining
// operands; the tensors' results as the remaining results. Platform is the handler's context:
// XLA's thread pool (CPU) or the CUDA stream.
template <typename Platform>
auto MultiTensorBinding() {
  return xla::ffi::Ffi::Bind()
      .Ctx<Platform>()
      .RemainingArgs()
      .RemainingRets()
      .template Attr<int64_t>("flags");
}

// Calls f(hyper, tensors) once per member of the call (see HyperPtrs), each with the member's
// hyper-parameters and its part of every tensor; once, as given, for an unbatched call. An error
// when a tensor does not split into equal parts, before f runs at all.
template <typename Hyper, int kIn, int kOut, typename F>
ffi::Error ForEachMember(const char* kernel, const HyperPtrs<Hyper>& hyper,
                         const std::vector<TensorSlots<kIn, kOut>>& tensors, F&& f) {
  if (hyper.members == 1) return f(hyper, tensors);
  for (const auto& t : tensors) {
    if (t.size % hyper.members != 0) {
      return InvalidArgument(std::string(kernel) + ": tensors do not split into members");
    }
  }
  auto bytes = [](DataType t) -> int64_t { return t == DataType::F32 ? 4 : 2; };
  for (int64_t b = 0; b < hyper.members; ++b) {
    auto part = tensors;
    for (auto& t : part) {
      t.size /= hyper.members;
      for (int k = 0; k < kIn; ++k) {
        t.in[k] = static_cast<const char*>(t.in[k]) + b * t.size * bytes(t.in_type[k]);
      }
      for (int k = 0; k < kOut; ++k) {
        t.out[k] = static_cast<char*>(t.out[k]) + b * t.size * bytes(t.out_type[k]);
      }
    }
    ffi::Error status = f(Member(hyper, b), part);
    if (status.failure()) return status;
  }
  return ffi::Error::Success();
}

// The front every optimizer handler shares, CPU and CUDA. A Family (adamw.h, momentum.h) names
// its kernel (kName), Hyper, tensor layout (kIn operands, kOut results), forms (kForms flags,
// Valid) and its operand check per form (Check<kFlags>). Parses the hyper-parameters and the
// tensors, dispatches `flags` to its form, checks the form's operands, then calls
// f.template operator()<kFlags>(hyper, tensors) once per member of the call (ForEachMember).
// Everything is checked before f first runs.
template <typename Family, typename F>
ffi::Error DispatchOptimizer(Args& args, Rets& rets, int64_t flags, F&& f) {
  using Hyper = typename Family::Hyper;
  auto hyper = ParseHyper<Hyper>(Family::kName, args);
  if (hyper.has_error()) return hyper.error();
  auto tensors =
      ParseTensors<Family::kIn, Family::kOut>(Family::kName, args, kHyperCount<Hyper>, &rets);
  if (tensors.has_error()) return tensors.error();
  return DispatchFlags<Family::kForms, Family::Valid>(flags, Family::kName, [&]<int64_t kFlags>() {
    ffi::Error checked = Family::template Check<kFlags>(*tensors);
    if (checked.failure()) return checked;
    return ForEachMember(Family::kName, *hyper, *tensors,
                         [&](const auto& member, const auto& part) {
                           return f.template operator()<kFlags>(member, part);
                         });
  });
}

}  // namespace jgsess
