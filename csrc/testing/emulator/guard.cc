// Runs an emulated CUDA handler on guarded copies of its buffers (see simt.h):
//
//   [inaccessible page][canary .. buffer][inaccessible page]      (an empty buffer: no bytes)
//
// Each buffer ends where the inaccessible page starts (rounded to its element size; arenas of
// bytes to 16), so any access past its end faults; the canary bytes before it catch writes
// below its start. Results that alias no operand are filled with a poison value first (a
// signaling NaN of their float type, 0xa5 bytes otherwise); elements still holding it after the
// call were never written. Operands a result does not alias must come back unchanged. The
// copies go back to XLA's buffers after the call; emulated calls run one at a time (the
// kernels' __shared__ variables are one set for the process).
#include "testing/emulator/guard.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace jgsess::simt {
namespace {

constexpr uint8_t kCanary = 0xa5;

size_t Width(XLA_FFI_DataType type) {
  switch (type) {
    case XLA_FFI_DataType_PRED:
    case XLA_FFI_DataType_S8:
    case XLA_FFI_DataType_U8: return 1;
    case XLA_FFI_DataType_S16:
    case XLA_FFI_DataType_U16:
    case XLA_FFI_DataType_F16:
    case XLA_FFI_DataType_BF16: return 2;
    case XLA_FFI_DataType_S32:
    case XLA_FFI_DataType_U32:
    case XLA_FFI_DataType_F32: return 4;
    case XLA_FFI_DataType_S64:
    case XLA_FFI_DataType_U64:
    case XLA_FFI_DataType_F64: return 8;
    default: return 1;
  }
}

// The poison of one element (a signaling NaN no arithmetic produces, for float types).
uint64_t Poison(XLA_FFI_DataType type) {
  switch (type) {
    case XLA_FFI_DataType_F16: return 0x7ca5;
    case XLA_FFI_DataType_BF16: return 0x7fa5;
    case XLA_FFI_DataType_F32: return 0x7fa5a5a5;
    case XLA_FFI_DataType_F64: return 0x7ff5a5a5a5a5a5a5;
    default: return 0xa5a5a5a5a5a5a5a5;
  }
}

struct Copy {
  XLA_FFI_Buffer buffer;  // XLA's, with `data` pointing at the copy
  void* original = nullptr;
  size_t bytes = 0, width = 1;
  char* map = nullptr;
  size_t map_bytes = 0;
  char* data = nullptr;
  bool result = false;   // a result that aliases no operand
  bool written = false;  // aliased by a result: its contents go back to XLA
};

void Guard(Copy& c, const XLA_FFI_Buffer& b) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  c.buffer = b;
  c.original = b.data;
  c.width = Width(b.dtype);
  size_t elements = 1;
  for (int64_t d = 0; d < b.rank; ++d) elements *= static_cast<size_t>(b.dims[d]);
  c.bytes = elements * c.width;
  const size_t align = b.dtype == XLA_FFI_DataType_U8 ? 16 : c.width;
  const size_t padded = (c.bytes + align - 1) / align * align;
  const size_t body = (padded + page - 1) / page * page;
  c.map_bytes = body + 2 * page;
  c.map = static_cast<char*>(
      mmap(nullptr, c.map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  mprotect(c.map, page, PROT_NONE);
  mprotect(c.map + page + body, page, PROT_NONE);
  c.data = c.map + page + body - padded;
  std::memset(c.map + page, kCanary, body);
  c.buffer.data = c.data;
}

void Fill(Copy& c, XLA_FFI_DataType type) {
  const uint64_t poison = Poison(type);
  for (size_t i = 0; i < c.bytes; i += c.width) std::memcpy(c.data + i, &poison, c.width);
}

// The first element of `c` still holding the poison, or -1.
int64_t Unwritten(const Copy& c) {
  const uint64_t poison = Poison(c.buffer.dtype);
  for (size_t i = 0; i < c.bytes; i += c.width) {
    if (std::memcmp(c.data + i, &poison, c.width) == 0) return static_cast<int64_t>(i / c.width);
  }
  return -1;
}

// Where the canary bytes around `c` were overwritten, or "".
std::string Trampled(const Copy& c) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const char* low = c.map + page;
  const char* high = c.map + c.map_bytes - page;
  for (const char* p = low; p < c.data; ++p) {
    if (static_cast<uint8_t>(*p) != kCanary) {
      return "written " + std::to_string(c.data - p) + " bytes before its start";
    }
  }
  for (const char* p = c.data + c.bytes; p < high; ++p) {
    if (static_cast<uint8_t>(*p) != kCanary) {
      return "written " + std::to_string(p - (c.data + c.bytes)) + " bytes past its end";
    }
  }
  return "";
}

XLA_FFI_Error* ErrorOf(const XLA_FFI_Api* api, const std::string& message) {
  XLA_FFI_Error_Create_Args args;
  args.struct_size = XLA_FFI_Error_Create_Args_STRUCT_SIZE;
  args.extension_start = nullptr;
  args.message = message.c_str();
  args.errc = XLA_FFI_Error_Code_INTERNAL;
  return api->XLA_FFI_Error_Create(&args);
}

std::mutex calls;
// the copies of the call running (for DescribeAddress)
std::vector<Copy>* running_args = nullptr;
std::vector<Copy>* running_rets = nullptr;

}  // namespace

std::string DescribeAddress(uintptr_t address) {
  char text[64];
  std::snprintf(text, sizeof(text), "%p", reinterpret_cast<void*>(address));
  for (auto [copies, kind] : {std::pair{running_args, "operand"}, {running_rets, "result"}}) {
    if (copies == nullptr) continue;
    for (size_t i = 0; i < copies->size(); ++i) {
      const Copy& c = (*copies)[i];
      const auto begin = reinterpret_cast<uintptr_t>(c.data);
      if (c.map == nullptr || address < reinterpret_cast<uintptr_t>(c.map) ||
          address >= reinterpret_cast<uintptr_t>(c.map) + c.map_bytes) {
        continue;
      }
      const bool past = address >= begin + c.bytes;
      const uintptr_t bytes = past ? address - (begin + c.bytes) : begin - address;
      return std::string(text) + ", " + std::to_string(bytes) + " bytes " +
             (past ? "past the end" : "before the start") + " of " + kind + " " +
             std::to_string(i) + " (" + std::to_string(c.bytes) + " bytes)";
    }
  }
  return text;
}

XLA_FFI_Error* RunGuarded(XLA_FFI_Handler* handler, const char* name, XLA_FFI_CallFrame* frame) {
  if (frame->stage != XLA_FFI_ExecutionStage_EXECUTE) return handler(frame);
  std::lock_guard<std::mutex> lock(calls);
  const int64_t num_args = frame->args.size, num_rets = frame->rets.size;
  std::vector<Copy> args(num_args), rets(num_rets);
  std::vector<void*> arg_ptrs(frame->args.args, frame->args.args + num_args);
  std::vector<void*> ret_ptrs(frame->rets.rets, frame->rets.rets + num_rets);
  for (int64_t i = 0; i < num_args; ++i) {
    if (frame->args.types[i] != XLA_FFI_ArgType_BUFFER) continue;
    Guard(args[i], *static_cast<XLA_FFI_Buffer*>(frame->args.args[i]));
    std::memcpy(args[i].data, args[i].original, args[i].bytes);
    arg_ptrs[i] = &args[i].buffer;
  }
  for (int64_t r = 0; r < num_rets; ++r) {
    if (frame->rets.types[r] != XLA_FFI_RetType_BUFFER) continue;
    const auto& b = *static_cast<XLA_FFI_Buffer*>(frame->rets.rets[r]);
    Copy* alias = nullptr;
    for (Copy& a : args) {
      if (a.map != nullptr && a.original == b.data && b.data != nullptr) alias = &a;
    }
    if (alias != nullptr) {  // in place: the result is the operand's copy
      alias->written = true;
      ret_ptrs[r] = &alias->buffer;
      continue;
    }
    Guard(rets[r], b);
    rets[r].result = true;
    Fill(rets[r], b.dtype);
    ret_ptrs[r] = &rets[r].buffer;
  }
  XLA_FFI_CallFrame guarded = *frame;
  guarded.args.args = arg_ptrs.data();
  guarded.rets.rets = ret_ptrs.data();
  running_args = &args;
  running_rets = &rets;
  XLA_FFI_Error* error = handler(&guarded);
  running_args = running_rets = nullptr;

  std::string problem;
  const auto note = [&](const char* kind, int64_t i, const std::string& what) {
    if (problem.empty())
      problem = std::string(name) + ": " + kind + " " + std::to_string(i) + " " + what;
  };
  for (int64_t i = 0; i < num_args; ++i) {
    Copy& c = args[i];
    if (c.map == nullptr) continue;
    if (std::string t = Trampled(c); !t.empty()) note("operand", i, t);
    if (!c.written && std::memcmp(c.data, c.original, c.bytes) != 0) {
      note("operand", i, "changed, though no result aliases it");
    }
    if (c.written) std::memcpy(c.original, c.data, c.bytes);
  }
  for (int64_t r = 0; r < num_rets; ++r) {
    Copy& c = rets[r];
    if (c.map == nullptr) continue;
    if (std::string t = Trampled(c); !t.empty()) note("result", r, t);
    if (error == nullptr) {
      if (int64_t at = Unwritten(c); at >= 0) {
        note("result", r, "element " + std::to_string(at) + " was never written");
      }
    }
    std::memcpy(c.original, c.data, c.bytes);
  }
  for (auto* copies : {&args, &rets}) {
    for (Copy& c : *copies) {
      if (c.map != nullptr) munmap(c.map, c.map_bytes);
    }
  }
  if (error != nullptr || problem.empty()) return error;
  return ErrorOf(frame->api, problem);
}

}  // namespace jgsess::simt
