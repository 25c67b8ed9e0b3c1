// The argument struct of the split-K GEMM entry points (gemm_cpu.cpp, gemm_cuda.cu). Mirrored by
// workbench/kernels/_abi.py SplitkArgs (tests/kernels/test_abi.py checks size and offsets).
#pragma once
#include "common/wb_abi.h"

struct SplitkArgs {
  const void* x;      // [M, K] in dt
  const void* w;      // [N, K] in dt (nn.Linear layout)
  float* parts;       // [S, M, N] float32 partials (rounded to part_dt)
  float* y;           // [M, N] float32
  void* stream;       // cudaStream_t (CUDA build)
  int M, N, K, S;
  int dt;             // WbDtype of x and w
  int part_dt;        // WbDtype the partials are rounded to
  int order;          // 0 sequential, 1 pairwise tree
  int path;           // CUDA: 0 auto, 1 CUDA cores, 2 tensor cores
};

#define SPLITK_ARGS_LAYOUT                                                                               \
  WB_LAYOUT(SplitkArgs, WB_OFF(SplitkArgs, x), WB_OFF(SplitkArgs, w), WB_OFF(SplitkArgs, parts),         \
            WB_OFF(SplitkArgs, y), WB_OFF(SplitkArgs, stream), WB_OFF(SplitkArgs, M), WB_OFF(SplitkArgs, N), \
            WB_OFF(SplitkArgs, K), WB_OFF(SplitkArgs, S), WB_OFF(SplitkArgs, dt), WB_OFF(SplitkArgs, part_dt), \
            WB_OFF(SplitkArgs, order), WB_OFF(SplitkArgs, path))
