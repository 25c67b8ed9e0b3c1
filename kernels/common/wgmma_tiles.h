// Operand tiles and fragments of wgmma kernels (common/mma_ops.h's wrappers): the K-major B tile
// in the 128-byte swizzle and its descriptors, A fragments formed from float32 accumulators
// (tf32, bf16, and bf16 in two halves). Shared by the GDN wgmma pass (gdn/gdn_mma.cu) and the
// chunk-step timing kernel (gdn/gdn_wgmma_chunk.cu). Include after common/mma_ops.h, with the
// bf16 types (cuda_bf16.h, or common/cuda_emu.h on the host).
#pragma once
#include <stdint.h>
#include <string.h>

namespace wbtile {

// bytes of a B tile of N rows and KC of contraction, e bytes an element, 128-byte swizzle atoms
// of 8 rows x 128 bytes: [k atom][row group][8 rows][128 bytes]
template <int E>
__host__ __device__ constexpr int tile_bytes(int N, int KC) { return N * KC * E; }

// the logical k (the A fragment's) that physical k p occupies in B's rows (tf32): see above
__device__ __forceinline__ int kperm(int p) { return (p & ~7) | ((p & 1) ? 4 + ((p & 7) >> 1) : ((p & 7) >> 1)); }

// byte offset of B's element (k logical, n) in a tile of N rows, E bytes an element
template <int E>
__device__ __forceinline__ uint32_t b_offset(int k, int n, int N) {
  constexpr int per = 128 / E;  // elements of k in a 128-byte row
  uint32_t a = (uint32_t)(k / per) * (N / 8) * 1024 + (uint32_t)(n / 8) * 1024 + (n % 8) * 128 + (k % per) * E;
  return a ^ (((a >> 7) & 7) << 4);
}

// the descriptor of k step j (32 bytes of k) of a tile of N rows at shared address sa, columns
// n0.. (a multiple of 8) of it
__device__ __forceinline__ uint64_t b_desc(uint32_t sa, int j, int N, int n0) {
  const uint32_t at = sa + (uint32_t)(j * 32 / 128) * (N / 8) * 1024 + (uint32_t)(n0 / 8) * 1024 + (j * 32) % 128;
  return wbmma::smem_desc(at, 16, 1024, 128);
}

// the descriptor of k step j (16 rows of k) of a bf16 operand read MN-major (the transpose flag)
// from a K-major 128-byte-swizzled tile of `rows` rows: the tile's rows are the product's k and
// its contraction the product's n; columns n0.. (a multiple of 64: one swizzle atom of n). By the
// ISA's canonical layouts the K-major tile is byte for byte this MN-major operand (tested in
// tests/kernels/test_cuda_emu.py), so one tile serves A B and A B^T without a transposed copy.
__device__ __forceinline__ uint64_t bt_desc(uint32_t sa, int j, int rows, int n0) {
  const uint32_t atom = (uint32_t)(rows / 8) * 1024;  // bytes of 64 n (one 128-byte k column)
  return wbmma::smem_desc(sa + (uint32_t)(n0 / 64) * atom + (uint32_t)j * 2048, atom, 1024, 128);
}

// x minus its bf16 rounding (the low half of a two-bf16 split: x = hi + lo to 16 bits)
__device__ __forceinline__ float bf16_rest(float x) { return x - __bfloat162float(__float2bfloat16_rn(x)); }
__device__ __forceinline__ uint32_t bf16x2(float lo, float hi) {
  const __nv_bfloat162 p = __floats2bfloat162_rn(lo, hi);
  uint32_t r;
  memcpy(&r, &p, 4);
  return r;
}

// the A fragment of k step j from accumulators d (a 64 x 8 NT tile's registers)
template <int KIND, int NR>
__device__ __forceinline__ void a_frag(const float (&d)[NR], int j, uint32_t (&a)[4]) {
  if constexpr (KIND == 0) {
    a[0] = wbmma::tf32_rna(d[4 * j]), a[1] = wbmma::tf32_rna(d[4 * j + 2]);
    a[2] = wbmma::tf32_rna(d[4 * j + 1]), a[3] = wbmma::tf32_rna(d[4 * j + 3]);
  } else {
    a[0] = bf16x2(d[8 * j], d[8 * j + 1]), a[1] = bf16x2(d[8 * j + 2], d[8 * j + 3]);
    a[2] = bf16x2(d[8 * j + 4], d[8 * j + 5]), a[3] = bf16x2(d[8 * j + 6], d[8 * j + 7]);
  }
}

// the low halves' fragment of k step j (bf16 of what the bf16 rounding of d left)
template <int NR>
__device__ __forceinline__ void a_frag_lo(const float (&d)[NR], int j, uint32_t (&a)[4]) {
  auto r = [&](int i) { return bf16_rest(d[8 * j + i]); };
  a[0] = bf16x2(r(0), r(1)), a[1] = bf16x2(r(2), r(3)), a[2] = bf16x2(r(4), r(5)), a[3] = bf16x2(r(6), r(7));
}

// keeps the compiler from moving accumulator registers across the asynchronous region (what ptxas
// would otherwise serialize the wgmma for)
template <int NR>
__device__ __forceinline__ void fence_regs(float (&r)[NR]) {
#ifndef WB_CUDA_EMU
#pragma unroll
  for (int i = 0; i < NR; ++i) asm volatile("" : "+f"(r[i])::"memory");
#endif
}

template <int KIND>
__device__ __forceinline__ void mma64(float (&d)[32], const uint32_t (&a)[4], uint64_t desc, bool acc) {
  if constexpr (KIND == 0) wbmma::wgmma_tf32<64>(d, a, desc, acc);
  else wbmma::wgmma_bf16<64>(d, a, desc, acc);
}

// A fragments of the KC / k-step steps of a 64 x KC operand held as accumulators (src: its
// registers, 64 x 8 NR / 4), formed before the wgmma.fence of the products that read them: a
// register written between two wgmma would make ptxas fence (serialize) each of them
template <int KIND, int KC, int NR, int ST>
__device__ __forceinline__ void frags(const float (&src)[NR], uint32_t (&a)[ST][4], int j0 = 0) {
#pragma unroll
  for (int j = 0; j < KC / (KIND == 0 ? 8 : 16); ++j) a_frag<KIND>(src, j, a[j0 + j]);
}
template <int KC, int NR, int ST>
__device__ __forceinline__ void frags_lo(const float (&src)[NR], uint32_t (&a)[ST][4], int j0 = 0) {
#pragma unroll
  for (int j = 0; j < KC / 16; ++j) a_frag_lo(src, j, a[j0 + j]);
}

// d (64 x 64) (+)= A (64 x KC, fragments a) B (tile at sa, N rows, columns n0..n0+63); acc false:
// d's old values are not read (zeroed here, so that they are not live before the product)
template <int KIND, int KC, int ST>
__device__ __forceinline__ void product(float (&d)[32], const uint32_t (&a)[ST][4], uint32_t sa, int N, int n0,
                                        bool acc) {
#pragma unroll
  for (int j = 0; j < KC / (KIND == 0 ? 8 : 16); ++j) mma64<KIND>(d, a[j], b_desc(sa, j, N, n0), acc || j > 0);
}

// d (64 x 64) (+)= A (64 x KC, fragments a) B, B(k, n) = element (row k, contraction n0 + n) of
// the K-major bf16 tile of `rows` rows at sa, read MN-major (bt_desc)
template <int KC, int ST>
__device__ __forceinline__ void product_t(float (&d)[32], const uint32_t (&a)[ST][4], uint32_t sa, int rows, int n0,
                                          bool acc) {
#pragma unroll
  for (int j = 0; j < KC / 16; ++j) wbmma::wgmma_bf16<64, true>(d, a[j], bt_desc(sa, j, rows, n0), acc || j > 0);
}

}  // namespace wbtile
