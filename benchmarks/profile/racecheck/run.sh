#!/bin/bash
# Builds cluster_handoff.cu and runs each of its modes under compute-sanitizer's racecheck on an
# sm_90a device; prints one line a mode: the hazards racecheck reported and the program's own
# check (see the header of cluster_handoff.cu for what each mode tells).
set -u
cd "$(dirname "$0")"
bin=${TMPDIR:-/tmp}/cluster_handoff
nvcc -std=c++17 -O2 -gencode=arch=compute_90a,code=sm_90a -I../../../csrc cluster_handoff.cu \
  -o "$bin" || exit 1
printf '%-26s %-10s %s\n' mode hazards result
for mode in cp_async cp_async_shifted generic_shifted cp_async_shifted_synced cp_async_cluster_synced \
            unsynced; do
  log=$(compute-sanitizer --tool racecheck "$bin" "$mode" 2>&1)
  hazards=$(printf '%s\n' "$log" | sed -n 's/.*RACECHECK SUMMARY: \([0-9]*\) hazard.*/\1/p')
  result=$(printf '%s\n' "$log" | grep '^cluster_handoff' || echo "no result")
  printf '%-26s %-10s %s\n' "$mode" "${hazards:-?}" "$result"
done
