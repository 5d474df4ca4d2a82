#!/usr/bin/env bash
# One command for a Hopper machine with torch preinstalled and no network: build in place with
# all cores, run the WHOLE test suite (CPU and gpu tests: the error tests must raise, not crash,
# on this build too), compute-sanitizer, the benchmarks and the main command; logs go to $OUT
# (default ./out); a short summary is printed last.
#   scripts/gpu_check.sh [--no-bench] [--no-fmha-bench] [--no-chunk-bench] [--no-dsv4-bench]
#                        [--no-sanitizer] [--no-main] [--quick-bench]
#                        [--tests "FILES"]   (only those test files: a development run, not a check)
#                        [--no-tests]        (no tests: the benchmarks of a tree whose suite ran in
#                                             an earlier call on the same build)
#                        [--ab-base DIR]     (a refactor's proof: DIR, the base's source tree, is
#                                             built beside this one; then every kernel's SASS is
#                                             compared (scripts/kernel_sass.py) and
#                                             benchmarks/ab/ab_ops.py checks bitwise outputs and
#                                             times both builds)
# FlashAttention-3 joins bench_fmha and bench_dsv4 when .peers/fmha is carried, FlashQLA and fla
# join bench_chunk when .peers/gla is, FlashMLA joins the tests and bench_dsv4 when .peers/mla is
# (see ../shared/peers/fetch.sh). FlashInfer joins bench_chunk in two calls on one warm machine:
# `source .peers/fi1/env.sh && scripts/gpu_check.sh --no-bench` with .peers/fi1 carried, then
# `scripts/gpu_check.sh --no-tests --no-sanitizer` with .peers/fi2 (its env.sh is sourced here).
# Each bench also writes its status block for benchmarks/RESULTS.md; they are collected in
# $OUT/status.md, which `python3 benchmarks/update_status.py status.md` puts into RESULTS.md
# here. The blocks name $DSV4_COMMIT, else the commit git reports here: the GPU machine's copy of
# the tree may carry a stale .git, so pass DSV4_COMMIT=$(git rev-parse --short HEAD) with the
# command there.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
BENCH=1; FMHA_BENCH=1; CHUNK_BENCH=1; DSV4_BENCH=1; SANITIZE=1; BENCH_ARGS=(); TESTS=tests; RUN_TESTS=1
MAIN=1
AB_BASE=
while [ $# -gt 0 ]; do
  arg=$1; shift
  case "$arg" in
    --tests) TESTS=$1; shift ;;
    --no-bench) BENCH=0 ;;
    --no-tests) RUN_TESTS=0 ;;
    --no-fmha-bench) FMHA_BENCH=0 ;;
    --no-chunk-bench) CHUNK_BENCH=0 ;;
    --no-dsv4-bench) DSV4_BENCH=0 ;;
    --no-sanitizer) SANITIZE=0 ;;
    --no-main) MAIN=0 ;;  # a fresh machine's build, suite and sanitizers can fill 600 s alone
    --quick-bench) BENCH_ARGS+=(--quick) ;;
    --ab-base) AB_BASE=$1; shift ;;
    *) echo "unknown option $arg"; exit 2 ;;
  esac
done
[ "$TESTS" = tests ] || echo "NOTE: only $TESTS (not the whole suite)"
[ "$RUN_TESTS" = 1 ] || echo "NOTE: no tests in this call"
[ "$MAIN" = 1 ] || echo "NOTE: no main command in this call"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
# The commit the status blocks name, where git works in this tree (and none was given).
if [ -z "${DSV4_COMMIT:-}" ] && [ "$(git rev-parse --show-toplevel 2>/dev/null)" = "$(pwd -P)" ] &&
   commit=$(git rev-parse --short HEAD 2>/dev/null); then
  [ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] || commit+=" (dirty)"
  export DSV4_COMMIT=$commit
fi
declare -A STATUS
step() {  # step NAME LOGFILE CMD...: run, log, record pass/fail and time
  local name=$1 log=$2; shift 2
  local t0=$(date +%s)
  echo "== $name"
  "$@" > "$OUT/$log" 2>&1
  local rc=$?
  STATUS[$name]="$([ $rc -eq 0 ] && echo PASS || echo "FAIL(rc=$rc)") $(( $(date +%s) - t0 ))s $log"
  tail -n 4 "$OUT/$log"
  return $rc
}

# At most 8 files come back from the device machine: keep everything in the logs below.
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
DEVICE=$(python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())' 2>&1)
echo "$DEVICE"

if [ -n "$AB_BASE" ]; then  # the base builds beside this tree, half the cores each
  export MAX_JOBS=$(( MAX_JOBS / 2 > 1 ? MAX_JOBS / 2 : 1 ))
  (cd "$AB_BASE" && env DSV4_PTXAS_VERBOSE=1 python3 setup.py build_ext --inplace > "$OUT/build_base.log" 2>&1) &
  AB_BUILD_PID=$!
fi
step build build.log env DSV4_PTXAS_VERBOSE=1 python3 setup.py build_ext --inplace || { echo "build failed"; tail -n 60 "$OUT/build.log"; exit 1; }
if [ -n "$AB_BASE" ]; then
  wait "$AB_BUILD_PID" || { echo "the base build failed"; tail -n 40 "$OUT/build_base.log"; exit 1; }
  export MAX_JOBS=$(nproc)
fi
# The whole suite runs as two processes at once: the build, setup and compile tests (CPU
# subprocesses and inductor, ~2 minutes) beside the rest. Their log is appended to pytest.log.
CPU_TESTS="tests/test_build.py tests/test_setup.py tests/test_compile.py"
run_tests() {
  # shellcheck disable=SC2086
  if [ "$TESTS" != tests ]; then python3 -m pytest $TESTS -q --durations=15 -p no:cacheprovider; return; fi
  local ignore=() f rc rc_cpu
  for f in $CPU_TESTS; do ignore+=(--ignore="$f"); done
  # shellcheck disable=SC2086
  python3 -m pytest $CPU_TESTS -q --durations=5 -p no:cacheprovider > "$OUT/pytest_cpu.log" 2>&1 &
  local cpu_pid=$!
  python3 -m pytest tests "${ignore[@]}" -q --durations=15 -p no:cacheprovider
  rc=$?
  wait "$cpu_pid"
  rc_cpu=$?
  echo "---- $CPU_TESTS"
  cat "$OUT/pytest_cpu.log" && rm -f "$OUT/pytest_cpu.log"
  [ "$rc" -ne 0 ] && return "$rc"
  return "$rc_cpu"
}
# FlashMLA joins the tests too (test_flash_mla_compat checks the compat module against it).
# shellcheck disable=SC1091
[ -f .peers/mla/env.sh ] && source .peers/mla/env.sh
[ "$RUN_TESTS" = 1 ] && step tests pytest.log run_tests
if [ "$SANITIZE" = 1 ]; then
  sanitize() {  # sanitize TOOL: every sanitizer script under one tool, into one log
    local rc=0 script
    for script in scripts/sanitize_fmha.py scripts/sanitize_chunk.py scripts/sanitize_kv_cache.py \
                  scripts/sanitize_indexer.py; do
      echo "---- $script"
      DSV4_SANITIZER_TOOL="$1" compute-sanitizer --tool "$1" --error-exitcode 3 python3 "$script" \
        || rc=$?
    done
    return $rc
  }
  step memcheck memcheck.log sanitize memcheck
  step racecheck racecheck.log sanitize racecheck
fi
[ "$MAIN" = 1 ] && step main main.log python3 -m dsv4_attn
if [ -n "$AB_BASE" ]; then
  ab_sass() {
    python3 scripts/kernel_sass.py dump "$AB_BASE" /tmp/sass_base &&
      python3 scripts/kernel_sass.py dump . /tmp/sass_this &&
      { python3 scripts/kernel_sass.py compare /tmp/sass_base /tmp/sass_this; true; }
  }
  step ab_sass ab_sass.log ab_sass
  step ab_ops ab_ops.log python3 benchmarks/ab/ab_ops.py "$AB_BASE" .
fi
if [ "$BENCH" = 1 ]; then
  # Peers join the benchmarks only: with fla importable, transformers' Qwen3-Next routes its
  # own reference through fla's Triton kernels, which the model tests must not use.
  [ -f .peers/fmha/env.sh ] && source .peers/fmha/env.sh
  [ -f .peers/gla/env.sh ] && source .peers/gla/env.sh
  [ -f .peers/fi2/env.sh ] && source .peers/fi2/env.sh  # needs .peers/fi1's half on this machine
  rm -f "$OUT"/status_bench_*.md "$OUT/status.md"
  [ "$FMHA_BENCH" = 1 ] && step bench_fmha bench_fmha.log python3 benchmarks/bench_fmha.py --out "$OUT" \
    --status-out "$OUT/status_bench_fmha.md" "${BENCH_ARGS[@]}"
  [ "$CHUNK_BENCH" = 1 ] && step bench_chunk bench_chunk.log python3 benchmarks/bench_chunk.py \
    --status-out "$OUT/status_bench_chunk.md" "${BENCH_ARGS[@]}"
  [ "$DSV4_BENCH" = 1 ] && step bench_dsv4 bench_dsv4.log python3 benchmarks/bench_dsv4.py --out "$OUT" \
    --status-out "$OUT/status_bench_dsv4.md" "${BENCH_ARGS[@]}"
  # One file for all the blocks (few files come back from the device machine).
  if compgen -G "$OUT/status_bench_*.md" > /dev/null; then
    cat "$OUT"/status_bench_*.md > "$OUT/status.md" && rm -f "$OUT"/status_bench_*.md
  fi
fi

echo
echo "================ summary ================"
echo "$DEVICE"
echo "ptxas: $(grep -c 'spill stores' "$OUT/build.log") kernels, spills: $(grep -E 'spill' "$OUT/build.log" | grep -vc ' 0 bytes spill stores, 0 bytes spill loads'), serialized wgmma (C7510/C7512/C7514/C7515/C7517/C7520): $(grep -cE 'C75(10|12|14|15|17|20)' "$OUT/build.log")"
[ "$TESTS" = tests ] || echo "tests: only $TESTS (not the whole suite)"
if [ "$RUN_TESTS" = 1 ]; then
  grep -E "^[0-9]+ [a-z]+.* in [0-9.]+s" "$OUT/pytest.log"
  grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | head -n 20
else
  echo "tests: not run in this call"
fi
for name in build tests memcheck racecheck main ab_sass ab_ops bench_fmha bench_chunk bench_dsv4; do
  [ -n "${STATUS[$name]+x}" ] && printf '%-10s %s\n' "$name" "${STATUS[$name]}"
done
for tool in memcheck racecheck; do  # a failed sanitizer: which script, and how many reports
  [[ "${STATUS[$tool]:-}" == FAIL* ]] || continue
  echo "---- $tool, each script's summary"
  grep -E "^---- |(ERROR|RACECHECK) SUMMARY" "$OUT/$tool.log"
done
if [ -n "$AB_BASE" ]; then
  echo "---- base build: ptxas $(grep -c 'spill stores' "$OUT/build_base.log") kernels"
  echo "---- kernel_sass compare (base vs this)"; grep -v "^[0-9]* kernels from" "$OUT/ab_sass.log" | tail -n 12
  echo "---- ab_ops (base vs this)"; grep -v "^-\{4\} bitwise" "$OUT/ab_ops.log" | grep -E "DIFFER|moves|variant/base|ab_ops:|^----"
fi
if [ "$BENCH" = 1 ] && [ "$FMHA_BENCH" = 1 ] && [ -f "$OUT/bench_fmha.log" ]; then
  echo "---- bench_fmha (tail)"; tail -n 40 "$OUT/bench_fmha.log"
fi
if [ "$BENCH" = 1 ] && [ -f "$OUT/bench_chunk.log" ]; then
  echo "---- bench_chunk (tail)"; tail -n 18 "$OUT/bench_chunk.log"
fi
if [ "$BENCH" = 1 ] && [ -f "$OUT/bench_dsv4.log" ]; then
  echo "---- bench_dsv4 (tail)"; tail -n 16 "$OUT/bench_dsv4.log"
fi
if [ -f "$OUT/status.md" ]; then
  echo "status blocks: $OUT/status.md (here: python3 benchmarks/update_status.py status.md)"
fi
