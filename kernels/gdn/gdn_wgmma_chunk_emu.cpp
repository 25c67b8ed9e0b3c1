// kernels/gdn/gdn_wgmma_chunk.cu built for the host emulation of CUDA (common/cuda_emu.h, whose
// wgmma model runs its products), for the CPU test that its products compute the chain they time
// (tests/kernels/gdn/test_wgmma_chunk.py). The entry point is the .cu's own, with host pointers.
#define WB_MMA_EMU 1
#include "gdn/gdn_wgmma_chunk.cu"
