#!/usr/bin/env bash
# Same-call A/B of source trees of the sm90 fmha kernel: the measurement behind
# docs/fmha.md's fmha steps. The fmha counterpart of ab_chunk.sh.
#
#   # here: each tree is a source copy (git-ignored; name .scratch in the run's carry)
#   mkdir -p .scratch/trees/base && git archive HEAD | tar -x -C .scratch/trees/base
#   mkdir -p .scratch/trees/new && git archive next/x | tar -x -C .scratch/trees/new
#   # on the GPU machine, one call (about 3 min for three trees, dense rows):
#   source .peers/fmha/env.sh; bash benchmarks/ab/ab_fmha.sh base new
#
# Builds every tree in place in parallel, runs the fmha tests on each tree after the first,
# then times the trees' benchmarks/ab/fmha_variants.py rows (this checkout's script, each tree's
# build on PYTHONPATH) in alternating processes over two passes. Prints each row's TFLOP/s per
# tree and pass, the best pass of each tree over the first's, and FA3's best rate when it
# imports. Logs go to /tmp/ab_fmha. Environment: DIMS, SEQS, CAUSAL (fmha_variants' rows),
# VARLEN=1 (bench_fmha's varlen batches as well), TESTS (pytest paths), JOBS (build jobs each),
# RACECHECK=1 (compute-sanitizer racecheck of scripts/sanitize_fmha.py per tree, ~40 s each).
# A tool for choosing between builds, not a test.
set -u
LOGS=/tmp/ab_fmha
source "$(dirname "$0")/ab_trees.sh"
start_trees "$LOGS" "${TESTS:-tests/test_fmha_sm90.py tests/test_fmha_varlen_sm90.py tests/test_fmha.py}" \
  scripts/sanitize_fmha.py "$@"
run_pass() {  # run_pass TAG [fmha_variants args...]
  local tag=$1 pass t
  shift
  for pass in 1 2; do
    for t in "${TREES[@]}"; do
      PYTHONPATH=$PWD/.scratch/trees/$t/src${PYTHONPATH:+:$PYTHONPATH} python3 \
        benchmarks/ab/fmha_variants.py --env "DSV4_AB_TREE=$t" --rounds 2 "$@" \
        > "$LOGS/${tag}_${t}_$pass.txt" 2>&1 || echo "$t pass $pass failed: $LOGS/${tag}_${t}_$pass.txt"
    done
  done
  python3 - "$LOGS" "$tag" "${TREES[@]}" <<'PY'
import re, statistics, sys
logs, tag, trees = sys.argv[1], sys.argv[2], sys.argv[3:]
def load(tree, p):  # row label -> (TFLOP/s, FA3 TFLOP/s or nan)
    rows = {}
    for line in open(f"{logs}/{tag}_{tree}_{p}.txt"):
        m = re.match(r"(.*?)\s+sm90\s+([\d.]+)\s+(\S+)", line)
        if m:
            rows[m.group(1).strip()] = (float(m.group(2)), float(m.group(3)))
    return rows
runs = {t: [load(t, p) for p in (1, 2)] for t in trees}
base = trees[0]
print(f"{'row':38}" + "".join(f"{t + ' p1,p2':>16}" for t in trees)
      + "".join(f"{t + '/' + base:>12}" for t in trees[1:]) + f"{'FA3':>8}")
ratios = {t: [] for t in trees[1:]}
for row in runs[base][0]:
    best = {t: max(r[row][0] for r in runs[t]) for t in trees}
    fa3 = max(r[row][1] for t in trees for r in runs[t])
    for t in trees[1:]:
        ratios[t].append(best[t] / best[base])
    print(f"{row:38}" + "".join(f"{runs[t][0][row][0]:8.1f},{runs[t][1][row][0]:7.1f}" for t in trees)
          + "".join(f"{best[t] / best[base]:12.3f}" for t in trees[1:]) + f"{fa3:8.1f}")
print("median " + ", ".join(f"{t}/{base} {statistics.median(r):.3f}" for t, r in ratios.items()))
PY
}
TREES=("$@")
run_pass dense --dims "${DIMS:-64,128,256}" --seqs "${SEQS:-1024,4096,16384}" --causal "${CAUSAL:-0,1}"
[ "${VARLEN:-0}" = 1 ] && run_pass varlen --varlen
exit 0
