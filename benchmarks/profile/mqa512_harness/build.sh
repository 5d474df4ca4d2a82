#!/bin/bash
# Builds bin/bench (the kernel as in csrc/) and bin/trace (the same kernel header compiled with
# -DDSV4_TRACE: its DSV4_TRACE_STAMP points record clock64 events, csrc/sm90/shared/trace.cuh)
# for an sm_90a device; no torch needed. Carry bin/ to the device machine and run, for example:
#   bin/bench B Sq Sk Hq causal reps persistent [window_left] [sinks] [compressed]
#     -> median ms, TFLOP/s and GB/s (window_left 127 with causal 1 and sinks 1 is
#     dsv4_attention's sliding layer; compressed K > 0 adds CSA's K listed rows of a 4x
#     compressed KV, -r HCA's closed rows of an r x one)
#   bin/trace 1 8192 8192 128 1 > t.txt; python3 analyze.py t.txt   -> one pair's timeline
#   bin/trace 1 8192 8192 128 1 1 1 127 > t.txt; python3 analyze.py t.txt tiles
#     -> one work tile's timeline on the persistent grid
#   (bin/trace traces CTA 0; DSV4_TRACE_CTA=N bin/trace ... traces CTA N)
#   bin/gather_bench   -> the CSA gather's cp.async rate, alone (gather_bench.cu)
#   bin/paged_gather_bench   -> the paged producer's gather of FP8 records from DRAM, alone
#   bin/paged_bench 64 64 hca; bin/paged_trace 64 64 hca > t.txt; python3 analyze.py t.txt paged
#     -> dsv4_attention_paged's decode kernel alone, and one CTA's timeline (paged.cu);
#     `analyze.py t.txt halves`: each producer warp's refill chain per stage half
set -e
cd "$(dirname "$0")"
mkdir -p bin
CSRC=${CSRC:-../../../csrc}  # another tree's csrc/ to build that kernel instead
F="-std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -lcuda -I$CSRC"
pids=()
nvcc $F harness.cu -o bin/bench & pids+=($!)
nvcc $F gather_bench.cu -o bin/gather_bench & pids+=($!)
nvcc $F paged_gather_bench.cu -o bin/paged_gather_bench & pids+=($!)
nvcc $F -DDSV4_TRACE harness.cu -o bin/trace & pids+=($!)
nvcc $F paged.cu -o bin/paged_bench & pids+=($!)
nvcc $F -DDSV4_TRACE paged.cu -o bin/paged_trace & pids+=($!)
rc=0
for pid in "${pids[@]}"; do wait "$pid" || rc=1; done  # a plain `wait` hides a failed build
exit $rc
