// CPU build of split-K GEMM: y[m, n] = sum_k x[m, k] w[n, k]; every sum sequential.
#include "gemm/gemm_elem.h"

extern "C" void splitk_partials_cpu(const void* x, const void* w, int M, int N, int K, int S, int dt, int part_dt,
                                     float* parts) {
  const int c = wb_slice_len(K, S);
  for (int s = 0; s < S; ++s)
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) {
        float acc = 0.0f;
        for (int k = s * c; k < K && k < (s + 1) * c; ++k)
          acc = acc + wb_load(x, (int64_t)m * K + k, dt) * wb_load(w, (int64_t)n * K + k, dt);
        parts[((int64_t)s * M + m) * N + n] = wb_round_to(acc, part_dt);
      }
}

extern "C" void splitk_reduce_cpu(const float* parts, int MN, int S, int order, float* y) {
  for (int i = 0; i < MN; ++i) y[i] = wb_reduce_partials(parts + i, S, MN, order);
}
