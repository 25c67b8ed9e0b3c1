// The mma.sync and wgmma instructions the tensor-core kernels issue, one wrapper each: on the GPU the PTX,
// in host builds over common/cuda_emu.h the emulation's model of it. The GDN mma
// kernels (gdn/gdn_mma.cu), split-K's mma kernel (gemm/gemm_cuda.cu), the tensor-core probe
// (common/mma_probe.cu) and the emulation's self-test (common/cuda_emu_selftest.cpp) call these,
// so the GPU test that compares the probe with the model checks the wrappers the kernels run.
// d += a b on this lane's fragments (the PTX ISA's layouts; common/mma_frags.h builds them from
// row-major matrices). On the host include it after common/cuda_emu.h (which defines WB_CUDA_EMU).
#pragma once
#include <cstdint>

namespace wbmma {

// cvt.rna.tf32.f32: x rounded to nearest tf32 (ties away from zero), an operand for the tensor
// cores (which read its tf32 part; sm_90's conversion clears the low 13 bits, the model does too)
__device__ __forceinline__ uint32_t tf32_rna(float x) {
#ifdef WB_CUDA_EMU
  return wbemu::cvt_rna_tf32(x);
#else
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
#endif
}

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

// ----------------------------------------------------------- wgmma (warpgroup MMA, sm_90a only)
// A warpgroup's (four warps, 128 threads) D (64 x N, float32) += A (64 x K) B (K x N): A from
// registers (each warp's 16 rows in mma.sync's m16n8k8 tf32 / m16n8k16 bf16 A fragment), B from
// shared memory through a matrix descriptor (K-major: element (k, n) in row n; see smem_desc),
// D's register i of lane (g, t) of warp w: row 16 w + g + 8 ((i / 2) % 2), column
// 8 (i / 4) + 2 t + i % 2. Asynchronous: wgmma_fence() before the first (after the accumulators or
// A's registers were written), wgmma_commit() to close a group, wgmma_wait<n>() until all but n
// groups are done; only then may D, A's registers or B's shared memory be touched. Shared memory
// written by ordinary stores must be made visible to the wgmma (async) proxy first:
// fence_async_smem() and a barrier. The host model (common/cuda_emu.h) performs an operation at
// its wait, from A as it was at issue.

// the shared-memory address (sm_90: a 32-bit offset in the shared window; host: from the block's
// dynamic shared memory's start)
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
#ifdef WB_CUDA_EMU
  return wbemu::smem_offset(p);
#else
  return (uint32_t)__cvta_generic_to_shared(p);
#endif
}

// A matrix descriptor: the start address, the leading and stride byte offsets (16-byte units
// in the descriptor), swizzle 0 none, 128, 64 or 32 (bytes); base offset 0 (the start's pattern
// aligned: 1024 bytes for 128-byte swizzle, 512 for 64, 256 for 32)
__device__ __forceinline__ uint64_t smem_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo, int swizzle) {
  const uint64_t mode = swizzle == 128 ? 1 : swizzle == 64 ? 2 : swizzle == 32 ? 3 : 0;
  return (uint64_t)((saddr >> 4) & 0x3fff) | ((uint64_t)((lbo >> 4) & 0x3fff) << 16) |
         ((uint64_t)((sbo >> 4) & 0x3fff) << 32) | (mode << 62);
}

// The wgmma PTX exists for sm_90a only (its arch-specific features): built for another target
// (WORKBENCH_CUDA_ARCH), the wrappers trap if reached, so the files that hold them still build.
#if defined(WB_CUDA_EMU) || !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WB_WGMMA_PTX 1
#else
#define WB_WGMMA_PTX 0
#endif

__device__ __forceinline__ void fence_async_smem() {
#if !defined(WB_CUDA_EMU) && WB_WGMMA_PTX
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}
// setmaxnreg.{inc,dec}.sync.aligned.u32 N: the executing warpgroup's registers a thread become N
// (a multiple of 8 in 24 .. 256), so that a warp-specialised block moves registers from a
// warpgroup that only copies to those that compute; all four warps of the warpgroup run it. The
// host model has no register file: nothing.
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg's count");
#if !defined(WB_CUDA_EMU) && WB_WGMMA_PTX
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N));
#endif
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg's count");
#if !defined(WB_CUDA_EMU) && WB_WGMMA_PTX
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N));
#endif
}
__device__ __forceinline__ void wgmma_fence() {
#if !defined(WB_CUDA_EMU) && WB_WGMMA_PTX
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#ifdef WB_CUDA_EMU
  wbemu::wgmma_commit();
#elif WB_WGMMA_PTX
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#else
  __trap();
#endif
}
template <int n>
__device__ __forceinline__ void wgmma_wait() {
#ifdef WB_CUDA_EMU
  wbemu::wgmma_wait(n);
#elif WB_WGMMA_PTX
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(n) : "memory");
#else
  __trap();
#endif
}

// wgmma.mma_async.sync.aligned.m64nNk8.f32.tf32.tf32 (A's registers: float32 bit patterns, their
// tf32 part read), and .m64nNk16.f32.bf16.bf16 (two bf16 a register, the lower k in the low half);
// scale_d false: D = A B
template <int N>
__device__ __forceinline__ void wgmma_tf32(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc,
                                           bool scale_d) {
  static_assert(N == 8 || N == 16 || N == 32 || N == 64, "wgmma_tf32: N of 8, 16, 32 or 64");
#ifdef WB_CUDA_EMU
  wbemu::wgmma_issue<N>(d, a, desc, scale_d, 0);
#elif !WB_WGMMA_PTX
  __trap();
#else
  if constexpr (N == 8) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k8.f32.tf32.tf32 "
        "{%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, %8, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"((int)scale_d));
  }
  else if constexpr (N == 16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k8.f32.tf32.tf32 "
        "{%0, %1, %2, %3, %4, %5, %6, %7}, "
        "{%8, %9, %10, %11}, %12, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"((int)scale_d));
  }
  else if constexpr (N == 32) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
        "{%16, %17, %18, %19}, %20, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"((int)scale_d));
  }
  else if constexpr (N == 64) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"((int)scale_d));
  }
#endif
}

// TB: B MN-major (its n contiguous: the instruction's transpose flag for B, bf16 only; the
// descriptor's layouts as the PTX ISA's MN-major canonical ones)
template <int N, bool TB = false>
__device__ __forceinline__ void wgmma_bf16(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc,
                                           bool scale_d) {
  static_assert(N == 8 || N == 16 || N == 32 || N == 64, "wgmma_bf16: N of 8, 16, 32 or 64");
#ifdef WB_CUDA_EMU
  wbemu::wgmma_issue<N>(d, a, desc, scale_d, TB ? 2 : 1);
#elif !WB_WGMMA_PTX
  __trap();
#else
  if constexpr (N == 8) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, %8, p, 1, 1, %10;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"((int)scale_d), "n"((int)TB));
  }
  else if constexpr (N == 16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7}, "
        "{%8, %9, %10, %11}, %12, p, 1, 1, %14;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"((int)scale_d), "n"((int)TB));
  }
  else if constexpr (N == 32) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
        "{%16, %17, %18, %19}, %20, p, 1, 1, %22;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"((int)scale_d), "n"((int)TB));
  }
  else if constexpr (N == 64) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"((int)scale_d), "n"((int)TB));
  }
#endif
}

}  // namespace wbmma
