"""The machine code of every kernel a build compiled, for proving that a change moved none of it.

    python3 scripts/kernel_sass.py dump TREE OUT      # after `python3 setup.py build_ext --inplace` in TREE
    python3 scripts/kernel_sass.py compare OUT_A OUT_B

`dump` reads the objects of TREE's last build (build/temp.*/**/*.o), disassembles each kernel
with cuobjdump and writes OUT/<kernel>.sass plus OUT/summary.tsv (kernel, registers, stack bytes,
instructions, a hash of the SASS). `compare` says, kernel by kernel, whether two dumps are the same
machine code. Kernels are matched by their mangled names, so a kernel that keeps its name and
template arguments can move between files. Identical SASS means identical outputs and
registers; any difference needs the GPU proof (bitwise tests, same-call A/B). Runs without a GPU.
"""
import glob
import hashlib
import os
import re
import subprocess
import sys


def _objects(tree):
    objs = sorted(glob.glob(os.path.join(tree, "build", "temp.*", "**", "*.o"), recursive=True))
    if not objs:
        sys.exit(f"kernel_sass: no objects under {tree}/build/temp.*; build the tree first")
    return objs


def _run(args):
    r = subprocess.run(args, capture_output=True, text=True)
    if "does not contain device code" in r.stdout + r.stderr:  # a host-only object
        return ""
    if r.returncode != 0:
        sys.exit(f"kernel_sass: {' '.join(args)} failed:\n{r.stderr}")
    return r.stdout


def _kernels(obj):
    """{mangled name: SASS text without addresses} for one object file."""
    text = _run(["cuobjdump", "-sass", obj])
    out, name, lines = {}, None, []
    for line in text.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            if name:
                out[name] = "\n".join(lines)
            name, lines = m.group(1), []
            continue
        if name is None:
            continue
        # keep the instruction (drop the /*addr*/ column and the encoding lines)
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s*(.*?)\s*;?\s*/\*", line)
        if m:
            lines.append(m.group(1))
    if name:
        out[name] = "\n".join(lines)
    return out


def _resources(obj):
    """{mangled name: (registers, stack bytes)}."""
    res = {}
    for m in re.finditer(r"Function (\S+):\s*REG:(\d+)\s+STACK:(\d+)", _run(["cuobjdump", "-res-usage", obj])):
        res[m.group(1)] = (int(m.group(2)), int(m.group(3)))
    return res


def dump(tree, out):
    os.makedirs(out, exist_ok=True)
    rows = []
    for obj in _objects(tree):
        res = _resources(obj)
        for name, sass in _kernels(obj).items():
            with open(os.path.join(out, name[:200] + ".sass"), "w") as f:
                f.write(sass + "\n")
            regs, stack = res.get(name, (-1, -1))
            digest = hashlib.sha1(sass.encode()).hexdigest()[:16]
            rows.append((name, regs, stack, sass.count("\n") + 1, digest))
    with open(os.path.join(out, "summary.tsv"), "w") as f:
        f.write("kernel\tregisters\tstack\tinstructions\tsha1\n")
        for row in sorted(rows):
            f.write("\t".join(map(str, row)) + "\n")
    print(f"{len(rows)} kernels from {tree} -> {out}")


def _summary(out):
    with open(os.path.join(out, "summary.tsv")) as f:
        next(f)
        return {r[0]: r[1:] for r in (line.rstrip("\n").split("\t") for line in f)}


def _demangled(names):
    text = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout
    return dict(zip(names, text.splitlines())) if text else {n: n for n in names}


def compare(a, b):
    sa, sb = _summary(a), _summary(b)
    names = sorted(set(sa) | set(sb))
    pretty = _demangled(names)
    same = differ = 0
    for n in names:
        if n not in sa or n not in sb:
            print(f"only in {a if n in sa else b}: {pretty[n]}")
            differ += 1
        elif sa[n][3] != sb[n][3]:
            print(f"differs: {pretty[n]}: registers {sa[n][0]} -> {sb[n][0]}, stack {sa[n][1]} -> "
                  f"{sb[n][1]}, instructions {sa[n][2]} -> {sb[n][2]}")
            differ += 1
        else:
            same += 1
    print(f"{same} kernels identical, {differ} different or unmatched")
    return 1 if differ else 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "dump":
        dump(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    else:
        sys.exit(__doc__)
