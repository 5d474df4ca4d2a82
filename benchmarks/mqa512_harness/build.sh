#!/bin/bash
# Builds bin/bench (the kernel as in csrc/) and bin/trace (with clock64 trace points) for an
# sm_90a device; no torch needed. Carry bin/ to the device machine and run, for example:
#   bin/bench B Sq Sk Hq causal reps persistent [window_left] [sinks] [compressed]
#     -> median ms, TFLOP/s and GB/s (window_left 127 with causal 1 and sinks 1 is
#     dsv4_attention's sliding layer; compressed K > 0 adds CSA's K listed rows of a 4x
#     compressed KV, -r HCA's closed rows of an r x one)
#   bin/trace 1 8192 8192 128 1 > t.txt; python3 analyze.py t.txt   -> one pair's timeline
#   bin/trace 1 8192 8192 128 1 1 1 127 > t.txt; python3 analyze.py t.txt tiles
#     -> one work tile's timeline on the persistent grid
#   bin/gather_bench   -> the CSA gather's cp.async rate, alone (gather_bench.cu)
set -e
cd "$(dirname "$0")"
python3 make_traced.py
mkdir -p bin
F="-std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -lcuda"
nvcc $F -I../../csrc -DKERNEL_HEADER='"sm90/mqa512/kernel.cuh"' harness.cu -o bin/bench &
nvcc $F -I../../csrc gather_bench.cu -o bin/gather_bench &
nvcc $F -Itraced -I../../csrc -DTRACE -DKERNEL_HEADER='"traced/mqa512/mqa512_sm90_kernel.cuh"' \
  harness.cu -o bin/trace &
wait
