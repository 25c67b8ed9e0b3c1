// The tensor cores' own mma.sync m16n8k8 tf32 and m16n8k16 bf16 on given matrices, for the GPU
// test that checks the host emulation's models of them (common/cuda_emu.h; CPU side:
// cuda_emu_selftest.cpp; both build their fragments with common/mma_frags.h and issue the
// kernels' own wrappers, common/mma_ops.h):
// tests/kernels/test_cuda_emu.py. One warp a problem, row-major matrices in device memory. And
// one wgmma of a warpgroup (common/wgmma_probe.h, the source the emulation's side runs too).
#include <cstdint>
#include <cuda_runtime.h>

#include "common/mma_frags.h"
#include "common/mma_ops.h"
#define WB_DYNAMIC_SMEM(T, name) extern __shared__ __align__(16) T name[]
#include "common/wgmma_probe.h"

namespace {

// problem p: D_p (16 x 8) = A_p (16 x 8) B_p (8 x 8) + C_p, A and B float32 bit patterns as given
// (the tensor cores read their tf32 part)
__global__ void mma8_kernel(const float* A, const float* B, const float* C, float* D) {
  const int p = blockIdx.x, lane = threadIdx.x % 32;
  uint32_t a[4], b0, b1;
  wbfrag::ab_k8(A + p * 128, B + p * 64, lane, a, b0, b1);
  float d[4];
  wbfrag::c_frag(C + p * 128, d, lane);
  wbmma::tf32_m16n8k8(d, a, b0, b1);
  wbfrag::d_store(D + p * 128, d, lane);
}

// problem p: D_p (16 x 8) = A_p (16 x 16) B_p (16 x 8) + C_p, A and B as bf16 bits
__global__ void mma16_kernel(const uint16_t* A, const uint16_t* B, const float* C, float* D) {
  const int p = blockIdx.x, lane = threadIdx.x % 32;
  uint32_t a[4], b0, b1;
  wbfrag::ab_k16(A + p * 256, B + p * 128, lane, a, b0, b1);
  float d[4];
  wbfrag::c_frag(C + p * 128, d, lane);
  wbmma::bf16_m16n8k16(d, a, b0, b1);
  wbfrag::d_store(D + p * 128, d, lane);
}

// a launch's status: the launch error, else the kernel's
int status() {
  const cudaError_t e = cudaGetLastError();
  return e != cudaSuccess ? (int)e : (int)cudaDeviceSynchronize();
}

}  // namespace

extern "C" {

// n problems of mma8_kernel / mma16_kernel on device pointers; a CUDA status
int probe_mma8(const float* A, const float* B, const float* C, float* D, int n) {
  mma8_kernel<<<n, 32>>>(A, B, C, D);
  return status();
}
int probe_mma16(const uint16_t* A, const uint16_t* B, const float* C, float* D, int n) {
  mma16_kernel<<<n, 32>>>(A, B, C, D);
  return status();
}

// one wgmma (common/wgmma_probe.h) of N columns, kind 0 tf32 / 1 bf16 / 2 bf16 with B MN-major,
// on device pointers; a CUDA
// status, -1 for an N not built, -2 for an image over kWgImage bytes
int probe_wgmma(int n, int kind, const uint32_t* image, int words, int start, int lbo, int sbo,
                int swizzle, const uint32_t* A, const float* C, float* D, int scale_d) {
  if (words * 4 > wbprobe::kWgImage) return -2;
  return wbprobe::wgmma_probe_launch(n, kind, [&](auto kernel, size_t bytes) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (e != cudaSuccess) return (int)e;
    kernel<<<1, 128, bytes>>>(image, words, start, lbo, sbo, swizzle, A, C, D, scale_d);
    return status();
  });
}

}  // extern "C"
