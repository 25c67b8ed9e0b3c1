// The CUDA build's tensor-core chunked path (gdn_mma.cu, its kernels and launchers unchanged but
// for the PTX helpers) built for the host under the emulation of common/cuda_emu.h: the same entry
// points as the CUDA build, taking host pointers. For tests on machines without a GPU (slow: every
// CUDA thread a fiber); the arithmetic differs from the GPU's where the hardware's own rounding
// does (the tensor cores' sums, expf), not where the kernels' code decides it.
#define WB_MMA_EMU 1
#include "gdn/gdn_mma.cu"

GDN_ARGS_LAYOUT
WB_DEFINE_STATUS_NAME

extern "C" {
// Why the last failed launch of this thread failed ("" if none did).
const char* wb_emu_last_failure(void) { return wbemu::last_failure().c_str(); }
}
