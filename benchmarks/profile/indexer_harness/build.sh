#!/bin/bash
# Builds bin/topk_bench (the indexer's top-k kernels as in csrc/, topk_bench.cu) and
# bin/score_bench (its score kernel and the whole call's kernels, score_bench.cu) for an sm_90a
# device; no torch needed. BENCH=topk_bench or score_bench builds that one alone, to OUTBIN if
# given; CSRC=<another tree's csrc> builds that tree's kernels instead, for an A/B in one call
# (benchmarks/ab/ab_indexer.sh):
#   BENCH=topk_bench CSRC=/base/csrc OUTBIN=bin/topk_base ./build.sh && ./build.sh
#   bin/topk_base 8192 gauss; bin/topk_bench 8192 gauss   (same hash: the same picks)
set -e
cd "$(dirname "$0")"
mkdir -p bin
CSRC=${CSRC:-../../../csrc}
F="-std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -I$CSRC"
if [ -n "${BENCH:-}" ]; then
  nvcc $F "$BENCH.cu" -o "${OUTBIN:-bin/$BENCH}"
  exit
fi
pids=()
nvcc $F topk_bench.cu -o bin/topk_bench & pids+=($!)
nvcc $F score_bench.cu -o bin/score_bench & pids+=($!)
rc=0
for pid in "${pids[@]}"; do wait "$pid" || rc=1; done  # a plain `wait` hides a failed build
exit $rc
