// The CUDA build's scalar GDN kernels (gdn_cuda.cu: the recurrence, prefill and decode, and the
// three-launch chunked form) built for the host under the emulation of common/cuda_emu.h: the
// same entry points as the CUDA build, taking host pointers. For tests on machines without a GPU.
#define WB_CUDA_EMU 1
#include "gdn/gdn_cuda.cu"

extern "C" {
// Why the last failed launch of this thread failed ("" if none did).
const char* wb_emu_last_failure(void) { return wbemu::last_failure().c_str(); }
}
