"""Same-call A/B of two builds of the chunk ops: the measurement behind docs/chunk.md's
chunk-kernel steps. Each build runs in its own process, base and variant alternating, on
bench_chunk's shapes and input recipe, seeded per row (the same tensors in every process). Prints
each row's median ms per build and pass, variant / base, and whether o and final_state are
bitwise equal.

    # here: the base commit beside the working tree (git-ignored; name it in the run's carry)
    mkdir -p .scratch/base && git archive HEAD | tar -x -C .scratch/base
    # on the GPU machine: build both in place, then compare
    (cd .scratch/base && python3 setup.py build_ext --inplace) && python3 setup.py build_ext --inplace
    python3 benchmarks/ab/ab_chunk.py .scratch/base . --rows 0,4 --passes 2

A directory is a source tree built in place (src/dsv4_attn/_C*.so). Every process checks that
it imported dsv4_attn from its own tree and that the sm90 path ran. A benchmark for comparing
builds, not a test. `--device cpu --shape 1,192,2,4` runs the reference path on the CPU, which
exercises this script without a GPU.
"""
import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time

import torch

BENCHMARKS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # common, bench_chunk
OPS = ("gated_delta_rule", "simple_gla")


def digest(*tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def cpu_ms(fn, rep):
    fn()
    times = []
    for _ in range(rep):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def child(args):
    """One build, every row: a JSON line per (row, op) on stdout."""
    src = os.path.join(os.path.abspath(args.child), "src")
    sys.path.insert(0, src)
    sys.path.insert(1, BENCHMARKS)
    import bench_chunk  # noqa: E402 - after the tree's src is first on the path
    import common  # noqa: E402
    import dsv4_attn  # noqa: E402

    if not os.path.abspath(dsv4_attn.__file__).startswith(src + os.sep):
        sys.exit(f"ab_chunk: imported dsv4_attn from {dsv4_attn.__file__}, not from {src}")
    cuda = args.device == "cuda"
    device = common.require_cuda("ab_chunk") if cuda else torch.device("cpu")
    dtype = common.parse_dtype(args.dtype)
    for row, (b, t, h, hv) in zip(args.row_ids, shapes(args)):
        torch.manual_seed(row)
        cu = None
        if b == 0:  # varlen
            lens = bench_chunk.varlen_lengths()
            t, n_states, b = sum(lens), len(lens), 1
            cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int64,
                              device=device)
        else:
            n_states = b
        q, k, v, g, beta, s0 = bench_chunk.make_inputs(b, t, h, hv, n_states, dtype, device)
        path = dsv4_attn.chunk_gated_delta_rule_path(q, k, v, g, beta, cu_seqlens=cu)
        if cuda and path != "sm90":
            sys.exit(f"ab_chunk: row {row} took the {path} path, not sm90")
        for op in args.ops:
            if op == "gated_delta_rule":
                fn = lambda: dsv4_attn.chunk_gated_delta_rule(  # noqa: E731
                    q, k, v, g, beta, initial_state=s0, output_final_state=True, cu_seqlens=cu)
            else:
                fn = lambda: dsv4_attn.chunk_simple_gla(  # noqa: E731
                    q, k, v, g, initial_state=s0, output_final_state=True, cu_seqlens=cu)
            o, final = fn()
            out = digest(o, final)
            del o, final
            ms = (common.bench_ms(fn, warmup=3, rep=args.rep, budget_ms=None) if cuda
                  else cpu_ms(fn, args.rep))
            print(json.dumps({"row": row, "op": op, "shape": [b, t, h, hv], "path": path,
                              "ms": ms, "digest": out}), flush=True)
        del q, k, v, g, beta, s0
        if cuda:
            torch.cuda.empty_cache()


def shapes(args):
    if args.shape:
        return [tuple(int(x) for x in args.shape.split(","))]
    import bench_chunk  # noqa: E402
    return [bench_chunk.SHAPES[i] for i in args.row_ids]


def run_build(tree, args):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", tree, "--rows", args.rows,
           "--ops", ",".join(args.ops), "--dtype", args.dtype, "--device", args.device,
           "--rep", str(args.rep)] + (["--shape", args.shape] if args.shape else [])
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"ab_chunk: the run of {tree} failed (rc {proc.returncode}):\n"
                 f"{proc.stdout[-2000:]}{proc.stderr[-4000:]}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("base", nargs="?", help="the base source tree, built in place")
    p.add_argument("variant", nargs="?", help="the variant source tree, built in place")
    p.add_argument("--rows", default="0,1,2,3,4,5,6,7", help="indices into bench_chunk.SHAPES")
    p.add_argument("--shape", default=None, help="B,T,H,HV instead of --rows (one row)")
    p.add_argument("--ops", default=",".join(OPS), help="gated_delta_rule and/or simple_gla")
    p.add_argument("--passes", type=int, default=2, help="base, variant, base, ... this often")
    p.add_argument("--rep", type=int, default=30, help="timed calls per row (median)")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.ops = [o for o in args.ops.split(",") if o]
    for op in args.ops:
        if op not in OPS:
            p.error(f"--ops: {op!r} is not one of {', '.join(OPS)}")
    args.row_ids = [0] if args.shape else [int(i) for i in args.rows.split(",")]
    if args.child:
        return child(args)
    if not args.base or not args.variant:
        p.error("the base and variant source trees are required")

    runs = {"base": [], "variant": []}
    for _ in range(args.passes):
        for name, tree in (("base", args.base), ("variant", args.variant)):
            runs[name].append(run_build(tree, args))
    print(f"A/B: base {args.base}, variant {args.variant}; {args.passes} passes, median of "
          f"{args.rep} calls, {args.device} {args.dtype}")
    print(f"{'op':<17} {'(B, T, H, HV)':<20} {'base ms':<16} {'variant ms':<16} "
          f"{'variant/base':<12} outputs")
    for i, rec in enumerate(runs["base"][0]):
        base = [run[i]["ms"] for run in runs["base"]]
        var = [run[i]["ms"] for run in runs["variant"]]
        digests = {run[i]["digest"] for run in runs["base"] + runs["variant"]}
        same_base = len({run[i]["digest"] for run in runs["base"]}) == 1
        outputs = ("bitwise" if len(digests) == 1 else
                   "DIFFER" if same_base else "base not deterministic")
        print(f"{rec['op']:<17} {str(tuple(rec['shape'])):<20} "
              f"{' / '.join(f'{x:.3f}' for x in base):<16} "
              f"{' / '.join(f'{x:.3f}' for x in var):<16} "
              f"{statistics.median(var) / statistics.median(base):<12.3f} {outputs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
