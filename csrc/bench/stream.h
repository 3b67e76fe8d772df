// Memory-bandwidth probe for the benchmarks.
#pragma once

#include <cstdint>

namespace jgsess {

// Best-of-`repeats` STREAM triad bandwidth in GB/s over three f32 arrays of n elements,
// counting 12 bytes per element (STREAM's convention), on every hardware thread.
double StreamTriadGbps(int64_t n, int repeats);

}  // namespace jgsess
