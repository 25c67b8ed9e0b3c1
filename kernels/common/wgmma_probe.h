// One wgmma on given operands, the same source for the tensor cores (common/mma_probe.cu, nvcc,
// sm_90a) and the host emulation (common/cuda_emu_selftest.cpp, over common/cuda_emu.h), for the
// tests that check the emulation's wgmma model (tests/kernels/test_cuda_emu.py): B's shared-memory
// image and descriptor fields come from the caller (so the layout under test is the caller's),
// copied to a 1024-byte aligned shared-memory address; A's fragments and C as each thread's
// registers. Include after common/mma_ops.h, with WB_DYNAMIC_SMEM defined.
#pragma once
#include <cstdint>

namespace wbprobe {

constexpr int kWgImage = 16384;  // B's shared-memory image, bytes at most

// one warpgroup (128 threads): D (thread t's N / 2 registers at D[t * N / 2 ..]) from C's, A's
// four registers a thread (A[4 t ..]) and B at image[start ..] (descriptor: start, lbo, sbo,
// swizzle 0 / 32 / 64 / 128); kind 0 tf32 (m64nNk8), 1 bf16 (m64nNk16), 2 bf16 with B MN-major
// (the transpose flag); scale_d 0: D = A B
template <int N, int KIND>
__global__ void wgmma_probe(const uint32_t* image, int words, int start, int lbo, int sbo, int swizzle,
                            const uint32_t* A, const float* C, float* D, int scale_d) {
  WB_DYNAMIC_SMEM(uint32_t, sm);
  const int t = threadIdx.x;
  // the image at the first 1024-byte aligned shared-memory address (the 128-byte swizzle's period)
  const uint32_t base = wbmma::smem_u32(sm), pad = (1024 - base % 1024) % 1024;
  uint32_t* img = sm + pad / 4;
  for (int i = t; i < words; i += 128) img[i] = image[i];
  wbmma::fence_async_smem();
  __syncthreads();
  float d[N / 2];
  uint32_t a[4];
  for (int i = 0; i < N / 2; ++i) d[i] = C[t * (N / 2) + i];
  for (int i = 0; i < 4; ++i) a[i] = A[4 * t + i];
  const uint64_t desc = wbmma::smem_desc(base + pad + (uint32_t)start, (uint32_t)lbo, (uint32_t)sbo, swizzle);
  wbmma::wgmma_fence();
  if constexpr (KIND == 0) wbmma::wgmma_tf32<N>(d, a, desc, scale_d != 0);
  else wbmma::wgmma_bf16<N, KIND == 2>(d, a, desc, scale_d != 0);
  wbmma::wgmma_commit();
  wbmma::wgmma_wait<0>();
  for (int i = 0; i < N / 2; ++i) D[t * (N / 2) + i] = d[i];
}

// the launch for (N, kind): shared memory of the image and its alignment; -1 for an N not built
template <typename Launch>
int wgmma_probe_launch(int n, int kind, Launch&& launch) {
  const size_t bytes = kWgImage + 1024;
  if (kind == 0) {
    if (n == 8) return launch(wgmma_probe<8, 0>, bytes);
    if (n == 16) return launch(wgmma_probe<16, 0>, bytes);
    if (n == 32) return launch(wgmma_probe<32, 0>, bytes);
    if (n == 64) return launch(wgmma_probe<64, 0>, bytes);
  } else if (kind == 1) {
    if (n == 8) return launch(wgmma_probe<8, 1>, bytes);
    if (n == 16) return launch(wgmma_probe<16, 1>, bytes);
    if (n == 32) return launch(wgmma_probe<32, 1>, bytes);
    if (n == 64) return launch(wgmma_probe<64, 1>, bytes);
  } else if (kind == 2) {
    if (n == 8) return launch(wgmma_probe<8, 2>, bytes);
    if (n == 16) return launch(wgmma_probe<16, 2>, bytes);
    if (n == 32) return launch(wgmma_probe<32, 2>, bytes);
    if (n == 64) return launch(wgmma_probe<64, 2>, bytes);
  }
  return -1;
}

}  // namespace wbprobe
