// Split-K GEMM, CPU build: the partials of every slice (each summed in fp32 in k order, no FMA,
// rounded once to part_dt) and their reduction.
#include "gemm/gemm_abi.h"
#include "gemm/gemm_elem.h"

// SplitkArgs: x, w, M, N, K, S, dt, part_dt -> parts. Returns WB_OK or WB_ERR_SHAPE (S < 1).
extern "C" int splitk_partials_cpu(const SplitkArgs* a) {
  if (a->S < 1) return WB_ERR_SHAPE;
  const int M = a->M, N = a->N, K = a->K, S = a->S, c = wb_slice_len(K, S);
  for (int s = 0; s < S; ++s)
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) {
        float acc = 0.0f;
        for (int k = s * c; k < K && k < (s + 1) * c; ++k)
          acc = acc + wb_load(a->x, (int64_t)m * K + k, a->dt) * wb_load(a->w, (int64_t)n * K + k, a->dt);
        a->parts[((int64_t)s * M + m) * N + n] = wb_round_to(acc, a->part_dt);
      }
  return WB_OK;
}

// SplitkArgs: parts, M, N, S, order -> y. Returns WB_OK or WB_ERR_SHAPE (S outside 1..64).
extern "C" int splitk_reduce_cpu(const SplitkArgs* a) {
  if (a->S < 1 || a->S > 64) return WB_ERR_SHAPE;
  const int MN = a->M * a->N;
  for (int i = 0; i < MN; ++i) a->y[i] = wb_reduce_partials(a->parts + i, a->S, MN, a->order);
  return WB_OK;
}

SPLITK_ARGS_LAYOUT
WB_DEFINE_STATUS_NAME
