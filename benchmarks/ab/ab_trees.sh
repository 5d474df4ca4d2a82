# Sourced by ab_fmha.sh and ab_chunk.sh: build source trees under .scratch/trees side by side and
# check each one (ptxas's report, a test list, racecheck of one sanitizer script).
# start_trees LOGS TESTS SANITIZER TREE...: the argument check, the log folder, build_trees,
# then check_tree on every tree after the first (the base).
start_trees() {
  [ $# -ge 5 ] || { echo "usage: $0 BASE_TREE TREE [TREE...] (names under .scratch/trees)"; exit 2; }
  local logs=$1 tests=$2 script=$3 t
  shift 3
  mkdir -p "$logs"
  build_trees "$logs" "$@"
  for t in "${@:2}"; do check_tree "$logs" "$t" "$tests" "$script"; done
}

# build_trees LOGS TREE...: each tree built in place in parallel (JOBS build jobs each).
build_trees() {
  local logs=$1 t
  shift
  for t in "$@"; do
    (cd ".scratch/trees/$t" && MAX_JOBS=${JOBS:-6} DSV4_PTXAS_VERBOSE=1 python3 setup.py \
       build_ext --inplace > "$logs/build_$t.log" 2>&1; echo "$t: build rc=$?") &
  done
  wait
  for t in "$@"; do
    echo "$t: spills $(grep -o '[1-9][0-9]* bytes spill stores' "$logs/build_$t.log" | wc -l)," \
         "serialized wgmma $(grep -cE 'C75(10|12|14|15|17|20)' "$logs/build_$t.log")"
  done
}

# check_tree LOGS TREE TESTS SANITIZER: the tests (stopping at the first failure), then
# racecheck of the sanitizer script when RACECHECK=1. Both run under a timeout (a deadlocked
# kernel hangs its process); a tree whose tests fail or time out skips racecheck, is added to
# FAILED_TREES, and the function returns 1.
FAILED_TREES=()
check_tree() {
  local logs=$1 t=$2 tests=$3 script=$4 rc
  # shellcheck disable=SC2086  # tests is a list of paths
  (cd ".scratch/trees/$t" && PYTHONPATH=$PWD/src timeout 300 python3 -m pytest -q -x -rf \
     -p no:cacheprovider $tests > "$logs/pytest_$t.log" 2>&1)
  rc=$?
  grep -E '^FAILED' "$logs/pytest_$t.log" | head -n 3 | sed "s/^/$t: /"
  tail -n 1 "$logs/pytest_$t.log" | sed "s/^/$t: /"
  if [ $rc -ne 0 ]; then
    echo "$t: tests rc=$rc$([ $rc = 124 ] && echo ' (timed out)'); no racecheck, no timing"
    FAILED_TREES+=("$t")
    return 1
  fi
  if [ "${RACECHECK:-0}" = 1 ]; then
    (cd ".scratch/trees/$t" && PYTHONPATH=$PWD/src timeout 300 compute-sanitizer \
       --tool racecheck --error-exitcode 3 python3 "$script" > "$logs/racecheck_$t.log" 2>&1
     echo "$t: racecheck rc=$? $(grep -h 'RACECHECK SUMMARY' "$logs/racecheck_$t.log")")
  fi
}
