// JGSESS_LAUNCH(kernel, grid, block, shared_bytes, stream)(args...): a kernel launch, written
// once for nvcc (kernel<<<grid, block, shared_bytes, stream>>>(args...)) and for the SIMT
// emulator that runs the same sources on the host in tests (csrc/emulator/simt.h).
#pragma once

#if defined(JGSESS_SIMT_EMULATOR)
#define JGSESS_LAUNCH(kernel, grid, block, shared, stream) \
  ::jgsess::simt::MakeLaunch(kernel, #kernel, grid, block, shared, stream)
#else
#define JGSESS_LAUNCH(kernel, grid, block, shared, stream) kernel<<<grid, block, shared, stream>>>
#endif
