#!/usr/bin/env bash
# One device call's worth of GDN mma checks, results written under $OUT with their headers
# (command, device, versions, date, commit), ready to copy into benchmarks/results/.
#
#   COMMIT=$(git rev-parse --short HEAD) (here) names the commit in the headers
#   OUT=$OUT bash benchmarks/gdn_gpu_session.sh tests    # the mma path's GPU tests, every pass forced,
#                                                       # and the CPU emulation against the GPU
#   OUT=$OUT bash benchmarks/gdn_gpu_session.sh tests NODE...  # those tests only
#                                                       # (TESTS_K="a or b": -k; TESTS_NAME=x:
#                                                       # gpu-tests-DAY-x.txt)
#   OUT=$OUT bash benchmarks/gdn_gpu_session.sh ab [shape filters...]
#                                                       # gdn_pass_ab: smem smem16 warp pair auto vs fla
#   OUT=$OUT bash benchmarks/gdn_gpu_session.sh matrix [shape filters...]
#                                                       # gdn_matrix prefill rows vs fla;
#                                                       # MATRIX_ARGS=--kernels adds GPU time per kernel
#   OUT=$OUT bash benchmarks/gdn_gpu_session.sh clocks [shape filters...]
#                                                       # gdn_clocks: cycles a chunk per phase of
#                                                       # prepare and the passes (a build with
#                                                       # -DWB_GDN_CLOCKS); CLOCKS_PASSES="smem warp"
#   OUT=$OUT bash benchmarks/gdn_gpu_session.sh env VAR "v1 v2" [shape filters...]
#                                                       # gdn_pass_ab --env VAR --variants v1 v2
#                                                       # (rounds 2, ENV_ROUNDS=n: n): any variable
#                                                       # the launcher reads, e.g.
#                                                       # WORKBENCH_GDN_MMA_PDL "off wait"; a value
#                                                       # VAR=v,VAR2=w sets those variables
#   FI_UNPACK=1 OUT=$OUT bash benchmarks/gdn_gpu_session.sh flashinfer    # call 1 (.whl1 carried)
#   OUT=$OUT bash benchmarks/gdn_gpu_session.sh flashinfer [shape filters...]
#                                                       # call 2 (.whl2 carried, the same warm
#                                                       # machine): gdn_flashinfer.py, ours, fla
#                                                       # and FlashInfer; FI_ARGS="--accuracy
#                                                       # --kernels" adds FP64 errors, kernel times
#   OUT=$OUT bash benchmarks/gdn_gpu_session.sh wgmma    # the wgmma work in one call: the wgmma
#                                                       # model against the tensor cores (every
#                                                       # layout, MN-major included), the wgmma
#                                                       # passes' GPU tests, the wgmma pass's three
#                                                       # forms and the column wgmma pass against
#                                                       # the rule's (A/B, small grids, then large:
#                                                       # WG_SMALL / WG_LARGE "a|b" shape filters);
#                                                       # WG_CHUNK=1 adds the chunk-step timing;
#                                                       # WG_PARTS="small tests large" another order
#   OUT=$OUT bash benchmarks/gdn_gpu_session.sh phases [passes...]
#                                                       # prepare / pass GPU time at B1 T8192 HV32,
#                                                       # each pass forced (default: all four);
#                                                       # PHASES_ARGS="--T 4096 --K 64 --V 64" another shape
#
# Run from the repository root with the packages of ../shared/GPU.md on PYTHONPATH (numpy 2.4,
# fla 0.6.0). Each mode stops at its own time limit (SESSION_LIMIT seconds, default 500) so that
# what was measured comes back from a device call of 600 s.
set -u
mode=${1:-tests}
shift || true
out=${OUT:?set OUT to the folder the results go to}
limit=${SESSION_LIMIT:-500}
day=$(date -u +%Y%m%d)
# the device's copy of the tree may carry older git metadata than its files: COMMIT=... names the
# local commit, and the header adds the hash of gdn_mma.cu as it is in the copied tree
commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
commit="$commit, gdn_mma.cu sha256 $(sha256sum kernels/gdn/gdn_mma.cu 2>/dev/null | cut -c1-12)"
header() {
  python3 - "$1" "$commit" <<'PY'
import datetime, sys, platform
import torch
try:
    import triton
    tv = triton.__version__
except Exception:
    tv = "none"
dev = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
print(f"# command: {sys.argv[1]}")
print(f"# device: {dev}, Python {platform.python_version()}, torch {torch.__version__}, "
      f"CUDA {torch.version.cuda}, triton {tv}; date "
      f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; commit {sys.argv[2]}")
PY
}
stamp() {  # the commit line of the headers into a JSON result
  [ -f "$1" ] && python3 - "$1" "$commit" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["commit"] = sys.argv[2]
open(sys.argv[1], "w").write(json.dumps(d, indent=1))
PY
}
case "$mode" in
  tests)
    cmd="pytest -q -m gpu tests/kernels/gdn/test_varlen.py tests/kernels/test_graph_capture.py tests/kernels/gdn/test_ext.py tests/kernels/gdn/test_mma_emu.py tests/kernels/gdn/test_cuda_scalar_emu.py -k 'mma or packed or capturable or emul'"
    # or the tests named (node ids and pytest options, each argument kept whole: -k "a or b")
    [ $# -gt 0 ] && cmd="pytest -q -m gpu$(printf ' %q' "$@")"
    # TESTS_K: a -k expression for the tests named (spaces allowed); TESTS_NAME: the result
    # file's name instead of mma-passes (several test runs in one call)
    [ $# -gt 0 ] && [ -n "${TESTS_K:-}" ] && cmd="$cmd -k '$TESTS_K'"
    f="$out/gpu-tests-$day-${TESTS_NAME:-mma-passes}.txt"
    { header "$cmd"; timeout "$limit" bash -c "python3 -m $cmd -p no:cacheprovider" 2>&1; echo "# rc=$?"; } > "$f"
    tail -5 "$f"
    ;;
  ab)
    f="$out/gdn-pass-ab-$day.json"
    args=(--variants smem smem16 warp pair auto --out "$f")
    [ $# -gt 0 ] && args+=(--only "$@")
    timeout "$limit" python3 benchmarks/gdn_pass_ab.py "${args[@]}" 2>&1 | tail -20
    stamp "$f"
    ;;
  env)
    var=${1:?env VAR "v1 v2" [shape filters]}
    vals=${2:?env VAR "v1 v2" [shape filters]}
    shift 2
    f="$out/gdn-env-ab-$day-$var.json"
    args=(--env "$var" --variants $vals --rounds "${ENV_ROUNDS:-2}" --out "$f")
    [ $# -gt 0 ] && args+=(--only "$@")
    timeout "$limit" python3 benchmarks/gdn_pass_ab.py "${args[@]}" 2>&1 | grep -E '^\{|summary' | cut -c1-600
    stamp "$f"
    ;;
  matrix)
    f="$out/gdn-matrix-$day.json"
    args=(--skip decode --out "$f" ${MATRIX_ARGS:-})
    [ $# -gt 0 ] && args+=(--only "$@")
    timeout "$limit" python3 benchmarks/gdn_matrix.py "${args[@]}" 2>&1 | tail -20
    stamp "$f"
    ;;
  phases)
    f="$out/gdn-phases-$day.txt"
    passes=("$@")
    [ ${#passes[@]} -eq 0 ] && passes=(smem smem16 warp pair)
    { header "python3 benchmarks/gdn_phases.py ${PHASES_ARGS:---T 8192} --kernels (WORKBENCH_GDN_MMA_PASS each of ${passes[*]})"
      for p in "${passes[@]}"; do
        echo "## WORKBENCH_GDN_MMA_PASS=$p"
        WORKBENCH_GDN_MMA_PASS=$p timeout "$limit" python3 benchmarks/gdn_phases.py ${PHASES_ARGS:---T 8192} --kernels 2>&1 | tail -12
      done; } > "$f"
    cat "$f"
    ;;
  flashinfer)
    # FlashInfer's archives (benchmarks/flashinfer_carry.py) come in two calls of one warm machine:
    # FI_UNPACK=1 with .whl1 (fi1.tar.xz) carried, then this mode with .whl2 (fi2.tar.xz) carried;
    # the bundled captures moved out of the tree for both (a call carries the tree, 64 MiB in all)
    if [ -n "${FI_UNPACK:-}" ]; then
      mkdir -p /tmp/fi && tar xJf .whl1/fi1.tar.xz -C /tmp/fi && echo "fi1 unpacked"
      exit 0
    fi
    [ -d /tmp/fi/nvidia_cutlass_dsl ] || { echo "fi1 not unpacked on this machine: run FI_UNPACK=1 first" >&2; exit 3; }
    tar xJf .whl2/fi2.tar.xz -C /tmp/fi
    f="$out/gdn-flashinfer-$day.json"
    args=(--site /tmp/fi --out "$f" ${FI_ARGS:-})
    [ $# -gt 0 ] && args+=(--only "$@")
    timeout "$limit" python3 benchmarks/gdn_flashinfer.py "${args[@]}" 2>&1 | grep -E '^\{|summary|Error' | cut -c1-400
    stamp "$f"
    ;;
  wgmma)
    # WG_PARTS: the parts and their order (default "tests small large"; e.g. "small tests large"
    # puts the A/B where the column pass's blocks matter before the GPU tests)
    w=WORKBENCH_GDN_MMA_PASS=wgmma
    for what in ${WG_PARTS:-tests small large}; do
      case "$what" in
        tests)
          # the tests mode, for the wgmma tests (gpu-tests-DAY-wgmma.txt)
          # (WG_TESTS: the test files, default the model's probe, the passes' tests and the
          # chunk-step kernel's)
          TESTS_K="wgmma or wgcols" TESTS_NAME=wgmma SESSION_LIMIT=${WG_TESTS_LIMIT:-200} bash "$0" tests -s -rA \
            ${WG_TESTS:-tests/kernels/test_cuda_emu.py tests/kernels/gdn/test_mma_emu.py tests/kernels/gdn/test_wgmma_chunk.py}
          grep -E "passed|failed|wgmma \(" "$out/gpu-tests-$day-wgmma.txt" | cut -c1-200 | tail -24
          if [ -n "${WG_CHUNK:-}" ]; then  # the chunk-step products' timing (measured on 2026-12-06)
            timeout 60 python3 benchmarks/gdn_wgmma_chunk.py --blocks 132 --chunks 256 --out "$out/gdn-wgmma-chunk-$day.json" 2>&1 | tail -2 | cut -c1-300
            stamp "$out/gdn-wgmma-chunk-$day.json"
          fi
          ;;
        small|large)
          # the wgmma pass's three forms (WORKBENCH_GDN_MMA_WG: sync, ws, pingpong), the column
          # wgmma pass (with and without its copy warp), then the rule's pass: the small grids
          # (where the column pass's blocks matter), the large ones (a block of the wgmma pass an
          # SM), each part its own file
          if [ "$what" = small ]; then only=${WG_SMALL:-K64|B1 T8192|HV48|B2 T3001}; part=1
          else only=${WG_LARGE:-B4 T4096|B8 T1000|5 seqs|64 seqs}; part=2; fi
          f="$out/gdn-pass-ab-$day-wgmma-$part.json"
          IFS='|' read -r -a shapes <<< "$only"
          timeout "${WG_AB_LIMIT:-170}" python3 benchmarks/gdn_pass_ab.py --env X --rounds "${WG_ROUNDS:-1}" \
            --variants "$w" "$w,WORKBENCH_GDN_MMA_WG=ws" "$w,WORKBENCH_GDN_MMA_WG=pingpong" \
            WORKBENCH_GDN_MMA_PASS=wgcols WORKBENCH_GDN_MMA_PASS=wgcols,WORKBENCH_GDN_MMA_COPY=warps \
            WORKBENCH_GDN_MMA_PASS=auto --out "$f" --only "${shapes[@]}" 2>&1 \
            | grep -E '^\{|summary' | cut -c1-700
          stamp "$f"
          ;;
        *) echo "WG_PARTS: tests, small or large, not $what" >&2; exit 2 ;;
      esac
    done
    ;;
  clocks)
    f="$out/gdn-clocks-$day.json"
    args=(--out "$f" --passes ${CLOCKS_PASSES:-smem smem16 warp})
    [ $# -gt 0 ] && args+=(--only "$@")
    timeout "$limit" python3 benchmarks/gdn_clocks.py "${args[@]}" 2>&1 | tail -3 | cut -c1-400
    stamp "$f"
    ;;
  *)
    echo "usage: OUT=dir bash benchmarks/gdn_gpu_session.sh tests|ab|env|matrix|phases|clocks|flashinfer|wgmma [args...]" >&2
    exit 2
    ;;
esac
