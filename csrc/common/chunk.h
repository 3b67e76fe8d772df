// The unit multi-tensor work is cut into, on every platform: chunks of kChunk elements across
// tensor boundaries. On the CPU a chunk is a thread's share (256 KiB of f32 per stream: long
// runs for the hardware prefetchers, while two to a few dozen threads still balance); on a GPU
// one CUDA block's; in global_norm one partial sum's (jgsess/kernels/global_norm.py: CHUNK,
// tested against _C.CHUNK).
#pragma once

#include <cstdint>

namespace jgsess {

constexpr int64_t kChunk = 65536;

}  // namespace jgsess
