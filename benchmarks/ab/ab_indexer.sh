#!/usr/bin/env bash
# Same-call A/B of the indexer's kernels across source trees, without torch: a harness of
# benchmarks/profile/indexer_harness/ (BENCH=topk_bench, the default: the top-k kernels alone;
# BENCH=score_bench: the score kernel alone or the whole call's kernels) is built against each
# tree's csrc/ (in parallel, seconds each), then each row runs on every tree in turn, twice.
# Each run prints the median time and a hash of the output, so the trees' outputs are compared
# bitwise in the same call (equal hashes).
#
#   # here: each tree a source copy (git-ignored; name its folder in the run's carry)
#   mkdir -p .scratch/trees/base && git archive main csrc | tar -x -C .scratch/trees/base
#   mkdir -p .scratch/trees/new && cp -r csrc .scratch/trees/new/
#   # on the GPU machine:
#   ROWS="65536 gauss 10; 8192 gauss 20" bash benchmarks/ab/ab_indexer.sh base new
#   BENCH=score_bench ROWS="65536 fp8 5; 65536 fp8 5 call" bash benchmarks/ab/ab_indexer.sh base new
#
# A tree is a directory with csrc/, or a name under .scratch/trees/; one that carries its own
# benchmarks/profile/indexer_harness/ (a launch that differs) is built with that. A row is the
# harness's arguments (the headers of topk_bench.cu and score_bench.cu say what they mean). A
# tool for choosing between builds, not a test.
set -u
cd "$(dirname "$0")/../.." || exit 1
BENCH=${BENCH:-topk_bench}
case "$BENCH" in
  topk_bench) default_rows="65536 gauss 10; 65536 ties 10; 131072 gauss 3; 16384 gauss 10 1024; \
32768 gauss 10 2048; 8192 gauss 20; 8192 gauss 20 512 0 cta; 4096 gauss 20 512 65536" ;;
  score_bench) default_rows="8192 fp8 20; 65536 fp8 5; 65536 fp8 5 call; 65536 bf16 5" ;;
  *) echo "ab_indexer: BENCH must be topk_bench or score_bench (got $BENCH)"; exit 2 ;;
esac
ROWS=${ROWS:-$default_rows}
harness=benchmarks/profile/indexer_harness
declare -A csrc bin build
for t in "$@"; do
  bin[$t]=/tmp/ab_${BENCH}_$(basename "$t")
  for dir in "$t" ".scratch/trees/$t"; do
    [ -d "$dir/csrc" ] || continue
    csrc[$t]=$(cd "$dir" && pwd)/csrc
    build[$t]=$harness/build.sh
    [ -f "$dir/$harness/build.sh" ] && build[$t]=$dir/$harness/build.sh
    break
  done
  [ -n "${csrc[$t]:-}" ] || { echo "ab_indexer: $t: no csrc/ there or under .scratch/trees/"; exit 2; }
done
pids=()
for t in "$@"; do
  BENCH=$BENCH CSRC=${csrc[$t]} OUTBIN=${bin[$t]} bash "${build[$t]}" & pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid" || { echo "ab_indexer: a build failed"; exit 1; }; done
IFS=';' read -ra rows <<< "$ROWS"
for _ in 1 2; do
  for row in "${rows[@]}"; do
    for t in "$@"; do
      # shellcheck disable=SC2086
      printf '%-10s %s\n' "$(basename "$t")" "$(${bin[$t]} $row | sed 's/^[a-z]* S=//; s/ (median of [0-9]*)//')"
    done
  done
done
