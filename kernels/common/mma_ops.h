// The mma.sync instructions the tensor-core kernels issue, one wrapper each: on the GPU the PTX,
// in host builds over common/cuda_emu.h the emulation's model of it. The GDN mma
// kernels (gdn/gdn_mma.cu), split-K's mma kernel (gemm/gemm_cuda.cu), the tensor-core probe
// (common/mma_probe.cu) and the emulation's self-test (common/cuda_emu_selftest.cpp) call these,
// so the GPU test that compares the probe with the model checks the wrappers the kernels run.
// d += a b on this lane's fragments (the PTX ISA's layouts; common/mma_frags.h builds them from
// row-major matrices). On the host include it after common/cuda_emu.h (which defines WB_CUDA_EMU).
#pragma once
#include <cstdint>

namespace wbmma {

// mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32: A 16 x 8, B 8 x 8, float32 bit patterns of
// which the tensor cores read the tf32 part
__device__ __forceinline__ void tf32_m16n8k8(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
#ifdef WB_CUDA_EMU
  wbemu::mma_m16n8k8_tf32(d, a, b0, b1);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32: A 16 x 16, B 16 x 8, two bf16 a register
__device__ __forceinline__ void bf16_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                              uint32_t b1) {
#ifdef WB_CUDA_EMU
  wbemu::mma_m16n8k16_bf16(d, a, b0, b1);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

#ifndef WB_CUDA_EMU
// mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32, fp16 operands (no host model: GPU builds only)
__device__ __forceinline__ void f16_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif

}  // namespace wbmma
