#!/bin/bash
# Builds bin/topk_bench (the indexer's top-k kernels as in csrc/, topk_bench.cu) for an sm_90a
# device; no torch needed. CSRC=<another tree's csrc> builds that tree's kernels instead, for an
# A/B in one call:
#   CSRC=/base/csrc OUTBIN=bin/topk_base ./build.sh && ./build.sh
#   bin/topk_base 8192 gauss; bin/topk_bench 8192 gauss   (same hash: the same picks)
set -e
cd "$(dirname "$0")"
mkdir -p bin
CSRC=${CSRC:-../../../csrc}
nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I"$CSRC" topk_bench.cu \
  -o "${OUTBIN:-bin/topk_bench}"
