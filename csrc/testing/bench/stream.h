// Memory-bandwidth probes for the benchmarks.
#pragma once

#include <cstdint>

namespace jgsess {

// Best-of-`repeats` STREAM triad bandwidth in GB/s over three f32 arrays of n elements,
// counting 12 bytes per element (STREAM's convention), on every hardware thread.
double StreamTriadGbps(int64_t n, int repeats);

// Best-of-`repeats` bandwidth in GB/s of an in-place multi-stream update with exactly an
// optimizer's traffic: `reads` arrays of n elements are read and the first `writes` of them
// written back in place (AdamW: p, g, m, v read, p, m, v written; momentum: p, g, acc read, p,
// acc written). Arrays 0 and 1 (the parameter and the gradient) hold `param_bytes` bytes per
// element (4: f32, 2: bf16), array 2 (m, acc: optax's mu_dtype / accumulator_dtype)
// `state_bytes`, the others (v) `rest_bytes`. Every hardware thread streams its slice; bytes
// counted are the bytes read plus the bytes written (no write-allocate traffic: an in-place store
// hits lines just read).
double StreamInplaceGbps(int64_t n, int reads, int writes, int param_bytes, int state_bytes,
                         int repeats, int rest_bytes);

}  // namespace jgsess
