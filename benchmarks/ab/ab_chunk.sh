#!/usr/bin/env bash
# Same-call A/B of source trees of the sm90 chunk kernels, the chunk counterpart of ab_fmha.sh:
# every tree is built in parallel, each tree after the first runs the chunk tests (and
# racecheck of sanitize_chunk.py with RACECHECK=1), then benchmarks/ab/ab_chunk.py times each tree
# against the first on bench_chunk's rows.
#
#   # here: each tree is a source copy (git-ignored; name .scratch in the run's carry)
#   mkdir -p .scratch/trees/base && git archive main | tar -x -C .scratch/trees/base
#   mkdir -p .scratch/trees/new && git archive next/x | tar -x -C .scratch/trees/new
#   # on the GPU machine, one call:
#   RACECHECK=1 bash benchmarks/ab/ab_chunk.sh base new
#
# Environment: OPS (ab_chunk.py's --ops, default both), ROWS (its --rows), TESTS (pytest paths),
# JOBS (build jobs each), RACECHECK=1. Logs go to /tmp/ab_chunk. A tool for choosing between
# builds, not a test.
set -u
LOGS=/tmp/ab_chunk
source "$(dirname "$0")/ab_trees.sh"
start_trees "$LOGS" "${TESTS:-tests/test_chunk_sm90.py tests/test_chunk.py}" \
  scripts/sanitize_chunk.py "$@"
for t in "${@:2}"; do
  [[ " ${FAILED_TREES[*]} " == *" $t "* ]] && continue
  echo "== $t against $1"
  python3 benchmarks/ab/ab_chunk.py ".scratch/trees/$1" ".scratch/trees/$t" --passes 2 \
    --ops "${OPS:-gated_delta_rule,simple_gla}" ${ROWS:+--rows "$ROWS"} 2>&1 | tail -n 16
done
