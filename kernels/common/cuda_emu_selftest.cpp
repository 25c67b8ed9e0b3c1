// Checks of the host emulation of common/cuda_emu.h against the PTX ISA's definitions, written
// independently of the kernels that use it (tests/kernels/emu/test_cuda_emu.py): the fragment
// layouts of mma.sync m16n8k8 tf32 and m16n8k16 bf16 and ldmatrix .x4 (.trans), shuffles, cp.async groups, named
// barriers, and that a barrier some threads never reach ends the launch with an error.
#include "common/cuda_emu.h"
#include "common/mma_frags.h"
#include "common/mma_ops.h"
#include "common/wgmma_probe.h"

namespace {

// D (16 x 8) = A (16 x 8) B (8 x 8) + C by one mma, fragments built from the PTX ISA's tables
// (row-major A, B and D in global memory), one warp.
__global__ void mma_kernel(const float* A, const float* B, const float* C, float* D) {
  const int lane = threadIdx.x % 32;
  uint32_t a[4], b0, b1;
  wbfrag::ab_k8(A, B, lane, a, b0, b1);
  float d[4];
  wbfrag::c_frag(C, d, lane);
  wbmma::tf32_m16n8k8(d, a, b0, b1);
  wbfrag::d_store(D, d, lane);
}

// D (16 x 8) = A (16 x 16) B (16 x 8) + C by one bf16 mma (A and B given as bf16 bits, row-major),
// fragments built from the PTX ISA's tables for m16n8k16 .bf16, one warp.
__global__ void mma16_kernel(const uint16_t* A, const uint16_t* B, const float* C, float* D) {
  const int lane = threadIdx.x % 32;
  uint32_t a[4], b0, b1;
  wbfrag::ab_k16(A, B, lane, a, b0, b1);
  float d[4];
  wbfrag::c_frag(C, d, lane);
  wbmma::bf16_m16n8k16(d, a, b0, b1);
  wbfrag::d_store(D, d, lane);
}

// Four 8 x 8 tiles of 16-bit values v(m, row, col) = 64 m + 8 row + col in shared memory (rows of
// 16 elements, tile m at rows 8 m..); out[lane][m] the registers of an ldmatrix .x4 (TRANS).
template <bool TRANS>
__global__ void ldsm_kernel(uint32_t* out) {
  WB_DYNAMIC_SMEM(uint16_t, sm);
  const int lane = threadIdx.x % 32;
  for (int i = lane; i < 32 * 16; i += 32) {
    const int row = i / 16, col = i % 16;
    sm[i] = col < 8 ? (uint16_t)(64 * (row / 8) + 8 * (row % 8) + col) : 0xffff;
  }
  __syncwarp();
  uint32_t r[4];
  wbemu::ldmatrix_x4<TRANS>(r, sm + lane * 16);  // lane l: row l % 8 of tile l / 8
  for (int m = 0; m < 4; ++m) out[lane * 4 + m] = r[m];
}

__global__ void shfl_kernel(float* out) {
  const int lane = threadIdx.x % 32;
  out[lane] = __shfl_xor_sync(0xffffffffu, (float)lane, 5);
  out[32 + lane] = __shfl_up_sync(0xffffffffu, (float)lane, 3);
}

// cp.async: the copy lands at the wait (late) or at the issue (eager); out[0] what the thread read
// before waiting, out[1] after.
__global__ void cp_kernel(const float* src, float* out) {
  WB_DYNAMIC_SMEM(float, sm);
  if (threadIdx.x == 0) {
    sm[0] = -1.f;
    sm[1] = sm[2] = sm[3] = 0.f;
    wbemu::cp_async(sm, src, 16);
    wbemu::cp_async_commit();
    out[0] = sm[0];
    wbemu::cp_async_wait(0);
    out[1] = sm[0];
  }
}

// Two pairs of warps at named barriers 1 and 2; each warp adds to a counter of its pair before
// the barrier and reads it after: every reader sees both warps' additions.
__global__ void named_kernel(int* out) {
  WB_DYNAMIC_SMEM(int, sm);
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32, pair = w / 2;
  if (threadIdx.x < 2) sm[threadIdx.x] = 0;
  __syncthreads();
  if (lane == 0) sm[pair] += 1;
  wbemu::named_barrier(1 + pair, 64);
  if (lane == 0) out[w] = sm[pair];
}

// Warps 1.. leave before the block barrier warp 0 waits at.
__global__ void deadlock_kernel(int* out) {
  if (threadIdx.x >= 32) return;
  __syncthreads();
  out[0] = 1;
}

// the wgmma model's asynchrony (one warpgroup, B = ones 8 x 8 tf32 at shared 0, A = ones): out[t]
// is thread t's D register 0 read before the wait (the old value, 5) and out[128 + t] after it
// (5 + 8); with never_wait the wgmma is issued and left, which fails the launch
__global__ void wgmma_async_kernel(float* out, int never_wait) {
  WB_DYNAMIC_SMEM(float, sm);
  const int t = threadIdx.x;
  for (int i = t; i < 64; i += 128) sm[i] = 1.0f;
  __syncthreads();
  float d[4] = {5.0f, 5.0f, 5.0f, 5.0f};
  const uint32_t a[4] = {__float_as_uint(1.0f), __float_as_uint(1.0f), __float_as_uint(1.0f), __float_as_uint(1.0f)};
  wbmma::wgmma_fence();
  wbmma::wgmma_tf32<8>(d, a, wbmma::smem_desc(wbmma::smem_u32(sm), 128, 256, 0), true);
  wbmma::wgmma_commit();
  out[t] = d[0];
  if (never_wait) return;
  wbmma::wgmma_wait<0>();
  out[128 + t] = d[0];
}

}  // namespace

extern "C" {

// D = A B + C for the given 16 x 8, 8 x 8, 16 x 8 row-major matrices; status
int emu_mma(const float* A, const float* B, const float* C, float* D) {
  WB_LAUNCH(1, 32, 0, nullptr, mma_kernel)(A, B, C, D);
  return cudaGetLastError();
}
// D = A B + C for 16 x 16 and 16 x 8 row-major bf16 matrices (their bits) and 16 x 8 float C
int emu_mma16(const uint16_t* A, const uint16_t* B, const float* C, float* D) {
  WB_LAUNCH(1, 32, 0, nullptr, mma16_kernel)(A, B, C, D);
  return cudaGetLastError();
}
int emu_ldmatrix(int trans, uint32_t* out) {
  if (trans) WB_LAUNCH(1, 32, 32 * 16 * 2, nullptr, ldsm_kernel<true>)(out);
  else WB_LAUNCH(1, 32, 32 * 16 * 2, nullptr, ldsm_kernel<false>)(out);
  return cudaGetLastError();
}
int emu_shfl(float* out) {
  WB_LAUNCH(1, 32, 0, nullptr, shfl_kernel)(out);
  return cudaGetLastError();
}
int emu_cp_async(const float* src, float* out) {
  WB_LAUNCH(1, 32, 16, nullptr, cp_kernel)(src, out);
  return cudaGetLastError();
}
int emu_named_barriers(int* out) {
  WB_LAUNCH(1, 128, 8, nullptr, named_kernel)(out);
  return cudaGetLastError();
}
int emu_deadlock(int* out) {
  WB_LAUNCH(1, 64, 0, nullptr, deadlock_kernel)(out);
  return cudaGetLastError();
}
// one wgmma (common/wgmma_probe.h, as the GPU probe runs it) under the emulation; status, -1 for
// an N not built, -2 for an image over kWgImage bytes
int emu_wgmma(int n, int kind, const uint32_t* image, int words, int start, int lbo, int sbo,
              int swizzle, const uint32_t* A, const float* C, float* D, int scale_d) {
  if (words * 4 > wbprobe::kWgImage) return -2;
  return wbprobe::wgmma_probe_launch(n, kind, [&](auto kernel, size_t bytes) {
    wbemu::Launch<std::remove_pointer_t<decltype(kernel)>>{kernel, dim3(1), dim3(128), bytes}(
        image, words, start, lbo, sbo, swizzle, A, C, D, scale_d);
    return (int)cudaGetLastError();
  });
}
// the wgmma model's asynchrony (wgmma_async_kernel); status
int emu_wgmma_async(float* out, int never_wait) {
  WB_LAUNCH(1, 128, 1024, nullptr, wgmma_async_kernel)(out, never_wait);
  return cudaGetLastError();
}
const char* emu_last_failure(void) { return wbemu::last_failure().c_str(); }
}
