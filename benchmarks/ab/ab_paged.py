"""Same-call A/B of the paged FP8 decode kernel (dsv4_attention_paged's mqa512 instantiation)
across source trees, without torch and without building the library: the harness
benchmarks/profile/mqa512_harness/paged.cu is compiled against each tree's csrc/ (in parallel,
seconds each), then every row runs on each tree in turn, `--passes` times. Each run prints the
main kernel's median µs (no combine kernel) and a hash of everything it wrote, so a refactor's
outputs are checked bitwise in the same call: equal hashes across trees, or DIFFER.

    # here: each tree a source copy (git-ignored; name .scratch in the run's carry)
    mkdir -p .scratch/trees/base && git archive main | tar -x -C .scratch/trees/base
    mkdir -p .scratch/trees/new && git archive next/x | tar -x -C .scratch/trees/new
    # on the GPU machine:
    python3 benchmarks/ab/ab_paged.py base new [--rows "64 64 hca; 8 64 csa512"] [--passes 2]

A tree is a directory, or a name under .scratch/trees/. A row is "B Hq kind [context]" with kind
window, csa512, csa1024 or hca (paged.cu's arguments); the split count is the plan's. A tool
for choosing between builds, not a test.
"""
import argparse
import concurrent.futures
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HARNESS = os.path.join(ROOT, "benchmarks", "profile", "mqa512_harness", "paged.cu")
DEFAULT_ROWS = ("64 64 window; 64 64 csa512; 64 64 csa1024; 64 64 hca; 64 128 window; "
                "64 128 csa512; 64 128 hca; 8 64 csa512; 8 128 hca; 64 16 hca")
LINE = re.compile(r"splits=(\d+): main kernel median ([0-9.]+) us .* output hash ([0-9a-f]+)")


def tree_dir(name):
    for path in (name, os.path.join(ROOT, ".scratch", "trees", name)):
        if os.path.isdir(os.path.join(path, "csrc")):
            return os.path.abspath(path)
    sys.exit(f"ab_paged: {name}: no csrc/ there or under .scratch/trees/")


def build(tree, out):
    cmd = ["nvcc", "-std=c++17", "-O3", "-gencode=arch=compute_90a,code=sm_90a", "-lcuda",
           f"-I{os.path.join(tree, 'csrc')}", HARNESS, "-o", out]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"ab_paged: building against {tree} failed:\n{r.stdout}{r.stderr}")
    return out


def run(binary, row, reps):
    args = row.split()
    args += ["32768"] if len(args) == 3 else []
    r = subprocess.run([binary, *args, "0", str(reps)], capture_output=True, text=True)
    m = LINE.search(r.stdout)
    if r.returncode != 0 or m is None:
        sys.exit(f"ab_paged: {binary} {row} failed (rc {r.returncode}):\n{r.stdout}{r.stderr}")
    return int(m.group(1)), float(m.group(2)), m.group(3)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trees", nargs="+", help="the base first")
    ap.add_argument("--rows", default=DEFAULT_ROWS, help="'B Hq kind [context]' rows, ';'-separated")
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--reps", type=int, default=50, help="timed launches per run")
    ap.add_argument("--bin-dir", default="/tmp/ab_paged")
    args = ap.parse_args(argv)
    trees = [tree_dir(t) for t in args.trees]
    os.makedirs(args.bin_dir, exist_ok=True)
    with concurrent.futures.ThreadPoolExecutor(len(trees)) as pool:
        bins = list(pool.map(lambda it: build(it[1], os.path.join(args.bin_dir, f"paged_{it[0]}")),
                             enumerate(trees)))
    rows = [r.strip() for r in args.rows.split(";") if r.strip()]
    names = [os.path.basename(t.rstrip("/")) for t in trees]
    print(f"ab_paged: {len(rows)} rows x {len(trees)} trees x {args.passes} passes; main kernel "
          f"median µs (no combine); trees: " + ", ".join(f"{n} = {t}" for n, t in zip(names, trees)))
    header = f"{'row':<20} {'splits':>6} " + " ".join(f"{n[:14]:>16}" for n in names)
    header += " " + " ".join(f"{n[:10] + '/base':>16}" for n in names[1:]) + "  outputs"
    print(header)
    differ = 0
    for row in rows:
        times = [[] for _ in trees]
        hashes = [set() for _ in trees]
        splits = set()
        for _ in range(args.passes):
            for i, b in enumerate(bins):  # base, variant, ... in turn within each pass
                s, us, h = run(b, row, args.reps)
                splits.add(s)
                times[i].append(us)
                hashes[i].add(h)
        med = [statistics.median(t) for t in times]
        same = len(set().union(*hashes)) == 1
        differ += 0 if same else 1
        line = f"{row:<20} {'/'.join(map(str, sorted(splits))):>6} "
        line += " ".join(f"{'-'.join(f'{x:.1f}' for x in t):>16}" for t in times)
        line += " " + " ".join(f"{m / med[0]:>16.3f}" for m in med[1:])
        line += "  bitwise" if same else "  DIFFER " + " ".join(",".join(sorted(h)) for h in hashes)
        print(line)
    print(f"ab_paged: {differ} row(s) not bitwise equal")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
