// The argument structs of the QSA entry points (qsa_cpu.cpp, qsa_cuda.cu). Mirrored by
// workbench/kernels/_abi.py QsaDecodeArgs / QsaMergeArgs (tests/kernels/test_abi.py checks them).
#pragma once
#include "common/wb_abi.h"

struct QsaDecodeArgs {
  const void* q;          // [B, HQ, D] in dt
  const void* k;          // [pages, ps, HKV, D] in dt
  const void* v;
  const int32_t* idx;     // [B, L] logical token indices (mode 0) or physical slots (mode 1); -1 skipped
  const int32_t* bt;      // [B, max_pages] block table
  float* o_parts;         // [B, HQ, S, D] split partials
  float* lse_parts;       // [B, HQ, S] (base 2)
  float* o;               // [B, HQ, D] merged (the CUDA build)
  float* lse;             // [B, HQ]
  void* stream;           // cudaStream_t (CUDA build)
  int mode, B, HQ, HKV, D, ps, max_pages, L, S, P;
  float qscale;           // the query scale times log2(e)
  int dt;                 // WbDtype of q, k, v
  int prob_dt;            // WbDtype the probabilities are rounded to before P.V
  int warps;              // CUDA: warps per block of the fast kernel (0: automatic)
  int kernel;             // CUDA: 0 automatic, 1 fast, 2 generic
};

struct QsaMergeArgs {
  const float* o_parts;   // [rows, S, D]
  const float* lse_parts; // [rows, S]
  float* o;               // [rows, D]
  float* lse;             // [rows]
  void* stream;
  int rows, S, D;
};

#define QSA_ARGS_LAYOUT                                                                                     \
  WB_LAYOUT(QsaDecodeArgs, WB_OFF(QsaDecodeArgs, q), WB_OFF(QsaDecodeArgs, k), WB_OFF(QsaDecodeArgs, v),     \
            WB_OFF(QsaDecodeArgs, idx), WB_OFF(QsaDecodeArgs, bt), WB_OFF(QsaDecodeArgs, o_parts),           \
            WB_OFF(QsaDecodeArgs, lse_parts), WB_OFF(QsaDecodeArgs, o), WB_OFF(QsaDecodeArgs, lse),          \
            WB_OFF(QsaDecodeArgs, stream), WB_OFF(QsaDecodeArgs, mode), WB_OFF(QsaDecodeArgs, B),            \
            WB_OFF(QsaDecodeArgs, HQ), WB_OFF(QsaDecodeArgs, HKV), WB_OFF(QsaDecodeArgs, D),                 \
            WB_OFF(QsaDecodeArgs, ps), WB_OFF(QsaDecodeArgs, max_pages), WB_OFF(QsaDecodeArgs, L),           \
            WB_OFF(QsaDecodeArgs, S), WB_OFF(QsaDecodeArgs, P), WB_OFF(QsaDecodeArgs, qscale),               \
            WB_OFF(QsaDecodeArgs, dt), WB_OFF(QsaDecodeArgs, prob_dt), WB_OFF(QsaDecodeArgs, warps),         \
            WB_OFF(QsaDecodeArgs, kernel))                                                                 \
  WB_LAYOUT(QsaMergeArgs, WB_OFF(QsaMergeArgs, o_parts), WB_OFF(QsaMergeArgs, lse_parts),                    \
            WB_OFF(QsaMergeArgs, o), WB_OFF(QsaMergeArgs, lse), WB_OFF(QsaMergeArgs, stream),                \
            WB_OFF(QsaMergeArgs, rows), WB_OFF(QsaMergeArgs, S), WB_OFF(QsaMergeArgs, D))
