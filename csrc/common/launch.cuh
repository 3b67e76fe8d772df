// JGSESS_LAUNCH(kernel, grid, block, shared_bytes, stream)(args...): a kernel launch, written
// once for nvcc (kernel<<<grid, block, shared_bytes, stream>>>(args...)) and for the SIMT
// emulator that runs the same sources on the host in tests (csrc/testing/emulator/simt.h).
// JGSESS_CHECK_ALIGNED(address, bytes): before a vector access; the emulator checks what the GPU
// requires (the address a multiple of `bytes`), nvcc's build checks nothing.
#pragma once

#if defined(JGSESS_SIMT_EMULATOR)
#define JGSESS_LAUNCH(kernel, grid, block, shared, stream) \
  ::jgsess::simt::MakeLaunch(kernel, #kernel, grid, block, shared, stream)
#define JGSESS_CHECK_ALIGNED(address, bytes) ::jgsess::simt::CheckAligned(address, bytes)
#else
#define JGSESS_LAUNCH(kernel, grid, block, shared, stream) kernel<<<grid, block, shared, stream>>>
#define JGSESS_CHECK_ALIGNED(address, bytes) ((void)0)
#endif
