"""Same-call A/B of two builds over every op and kernel family: bitwise-equal outputs on cases
that reach every sm90 kernel instantiation, and the time of each family's benchmark rows. The
proof a refactor owes (docs/ARCHITECTURE.md, "Changing a kernel safely").

    # here: the base commit beside the working tree (git-ignored; name it in the run's carry)
    mkdir -p .scratch/base && git archive BASE | tar -x -C .scratch/base
    # on the GPU machine: build both in place, then compare
    (cd .scratch/base && python3 setup.py build_ext --inplace) && python3 setup.py build_ext --inplace
    python3 benchmarks/ab/ab_ops.py .scratch/base . [--only bitwise|timing] [--passes 2]

Each build runs in its own process (base, variant, base, ...), on the same seeded inputs. Every
case prints the sha256 of its outputs per build ("bitwise" when all runs agree), and each timed
row its median ms per run (CUDA-graph replays) and variant / base. Every process checks that it
imported dsv4_attn from its own tree. Only the ops' public calls and DSV4_* knobs are used, so
any two builds compare. A tool for choosing between builds, not a test.
"""
import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys

import torch

BENCHMARKS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cu(*lens, device="cuda"):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32,
                        device=device)


def rnd(*shape, dtype=torch.bfloat16, scale=1.0):
    return (torch.randn(*shape, device="cuda") * scale).to(dtype)


def fmha_case(b, sq, sk, hq, hkv, d, dtype=torch.bfloat16, varlen=None, sinks=False, **kw):
    import dsv4_attn
    if varlen:
        q, k, v = rnd(sum(varlen), hq, d, dtype=dtype), rnd(sum(varlen), hkv, d, dtype=dtype), \
            rnd(sum(varlen), hkv, d, dtype=dtype)
        c = cu(*varlen)
        kw.update(cu_seqlens_q=c, cu_seqlens_k=c, max_seqlen_q=max(varlen), max_seqlen_k=max(varlen))
    else:
        q, k, v = rnd(b, sq, hq, d, dtype=dtype), rnd(b, sk, hkv, d, dtype=dtype), \
            rnd(b, sk, hkv, d, dtype=dtype)
    if d == 512:
        v = k
    if sinks:
        kw["sinks"] = torch.randn(hq, device="cuda")
    return lambda: dsv4_attn.fmha(q, k, v, return_lse=True, **kw)


def dsv4_case(kind, b, sq, s, hq, window=128, varlen=None):
    import dsv4_attn
    ratio = {"sliding": 0, "CSA": 4, "HCA": 128}[kind]
    kw = dict(sinks=torch.randn(hq, device="cuda"), window=window)
    if varlen:  # (sq, skv) per sequence
        q, kv = rnd(sum(a for a, _ in varlen), hq, 512), rnd(sum(c for _, c in varlen), 512)
        kw.update(cu_seqlens_q=cu(*[a for a, _ in varlen]), cu_seqlens_kv=cu(*[c for _, c in varlen]),
                  max_seqlen_q=max(a for a, _ in varlen), max_seqlen_kv=max(c for _, c in varlen))
        if ratio:
            lens_c = [c // ratio for _, c in varlen]
            kw.update(compressed_kv=rnd(sum(lens_c), 512), compress_ratio=ratio,
                      cu_seqlens_compressed=cu(*lens_c))
            if kind == "CSA":
                kw["topk_indices"] = torch.randint(-1, max(lens_c) + 1, (q.shape[0], 128),
                                                   device="cuda", dtype=torch.int32)
    else:
        q, kv = rnd(b, sq, hq, 512), rnd(b, s, 512)
        if ratio:
            sc = s // ratio
            kw.update(compressed_kv=rnd(b, sc, 512), compress_ratio=ratio)
            if kind == "CSA":
                kw["topk_indices"] = torch.stack([torch.randperm(sc, device="cuda")[:512]
                                                  for _ in range(b * sq)]).view(b, sq, 512).int()
    return lambda: dsv4_attn.dsv4_attention(q, kv, return_lse=True, **kw)


def indexer_case(s=0, paged=None, dtype=torch.float8_e4m3fn):
    """dsv4_indexer_topk on a fresh prompt of s tokens, or with paged = (b, rows) the paged
    decode step (bench_dsv4's inputs)."""
    import bench_dsv4
    import dsv4_attn
    kw = dict(topk=bench_dsv4.INDEXER_TOPK, compress_ratio=4)
    if paged:
        args = bench_dsv4.indexer_paged_inputs(*paged, "cuda")
        return lambda: dsv4_attn.dsv4_indexer_topk_paged(*args, **kw)
    q, k, w, pos, k_scale = bench_dsv4.indexer_inputs(s, "cuda", dtype)
    return lambda: dsv4_attn.dsv4_indexer_topk(q, k, w, pos, k_scale=k_scale, **kw)


def merge_case(shape, dtype, offset=0):
    import dsv4_attn
    n = 1
    for x in shape:
        n *= x
    a = rnd(n + offset, dtype=dtype)[offset:].view(*shape)
    b = rnd(*shape, dtype=dtype)
    lse_shape = (shape[0], shape[2], shape[1]) if len(shape) == 4 else (shape[1], shape[0])
    la, lb = torch.randn(*lse_shape, device="cuda"), torch.randn(*lse_shape, device="cuda")
    return lambda: dsv4_attn.merge_attn_states(a, la, b, lb)


def chunk_case(op, b, t, h, hv, varlen=None, dtype=torch.bfloat16):
    import dsv4_attn
    import torch.nn.functional as F
    q = F.normalize(torch.randn(b, t, h, 128, device="cuda"), dim=-1).to(dtype)
    k = F.normalize(torch.randn(b, t, h, 128, device="cuda"), dim=-1).to(dtype)
    v = rnd(b, t, hv, 128, dtype=dtype)
    g = -torch.rand(b, t, hv, device="cuda") * 0.1
    beta = torch.rand(b, t, hv, device="cuda")
    n = len(varlen) if varlen else b
    kw = dict(initial_state=torch.randn(n, hv, 128, 128, device="cuda"), output_final_state=True)
    if varlen:
        kw["cu_seqlens"] = cu(*varlen)
    if op == "gdr":
        return lambda: dsv4_attn.chunk_gated_delta_rule(q, k, v, g, beta, **kw)
    return lambda: dsv4_attn.chunk_simple_gla(q, k, v, g, **kw)


H, F16 = torch.bfloat16, torch.float16
# (name, env, make): small cases for the bitwise check, over every instantiation.
BITWISE = [
    *[(f"fmha d={d} {dt} {'causal' if c else 'full'}", {}, lambda d=d, dt=dt, c=c: fmha_case(
        2, 300, 300, 4, 2, d, dtype=dt, causal=c)) for d in (64, 128, 256) for dt in (H, F16)
      for c in (False, True)],
    *[(f"fmha d={d} varlen window", {}, lambda d=d: fmha_case(
        0, 0, 0, 4, 2, d, varlen=[0, 200, 517], causal=True, window_left=70, sinks=True))
      for d in (64, 128, 256)],
    ("fmha d=128 decode splits + packed gqa", {}, lambda: fmha_case(3, 1, 4000, 16, 4, 128)),
    ("fmha d=128 n=128 dense non-causal", {"DSV4_FMHA_D128_BLOCK_N": "128"},
     lambda: fmha_case(2, 300, 300, 4, 2, 128)),
    ("fmha d=128 per_tile grid", {"DSV4_FMHA_GRID": "per_tile"},
     lambda: fmha_case(2, 300, 300, 4, 2, 128, causal=True)),
    ("fmha d=512 causal window sinks", {}, lambda: fmha_case(
        1, 700, 700, 64, 1, 512, causal=True, window_left=127, sinks=True)),
    ("fmha d=512 fp16 gqa 16/2", {}, lambda: fmha_case(2, 129, 300, 16, 2, 512, dtype=F16)),
    ("fmha d=512 decode splits", {}, lambda: fmha_case(4, 1, 3000, 128, 1, 512)),
    ("fmha d=512 varlen", {}, lambda: fmha_case(0, 0, 0, 64, 1, 512, varlen=[5, 0, 300],
                                                causal=True)),
    ("dsv4 sliding", {}, lambda: dsv4_case("sliding", 2, 300, 300, 64)),
    ("dsv4 CSA", {}, lambda: dsv4_case("CSA", 1, 257, 2048, 64)),
    ("dsv4 HCA 128 heads", {}, lambda: dsv4_case("HCA", 1, 300, 4096, 128)),
    ("dsv4 HCA 16 heads", {}, lambda: dsv4_case("HCA", 2, 100, 2048, 16)),
    ("dsv4 CSA decode", {}, lambda: dsv4_case("CSA", 8, 1, 4096, 64)),
    ("dsv4 HCA decode", {}, lambda: dsv4_case("HCA", 8, 1, 4096, 128)),
    ("dsv4 CSA varlen", {}, lambda: dsv4_case("CSA", 0, 0, 0, 64, varlen=[(3, 700), (0, 10), (200, 900)])),
    ("dsv4 HCA varlen", {}, lambda: dsv4_case("HCA", 0, 0, 0, 64, varlen=[(1, 700), (200, 900)])),
    ("dsv4 sliding forced split", {"DSV4_SPLIT_KV": "3"}, lambda: dsv4_case("sliding", 1, 4, 3000, 64)),
    ("indexer fp8 2k", {}, lambda: indexer_case(2048)),
    ("indexer bf16 2k", {}, lambda: indexer_case(2048, dtype=H)),
    ("indexer paged B=4 12k", {}, lambda: indexer_case(paged=(4, 3000))),
    *[(f"merge {dt}", {}, lambda dt=dt: merge_case((2, 300, 8, 128), dt)) for dt in (H, F16, torch.float32)],
    ("merge misaligned varlen", {}, lambda: merge_case((700, 8, 64), H, offset=1)),
    *[(f"chunk {op} {dt}", {"DSV4_CHUNK_SEGMENTS": "1"}, lambda op=op, dt=dt: chunk_case(
        op, 2, 333, 2, 4, dtype=dt)) for op in ("gdr", "gla") for dt in (H, F16)],
    *[(f"chunk {op} fused={f}", {"DSV4_CHUNK_SEGMENTS": "1", "DSV4_CHUNK_FUSED": f},
       lambda op=op: chunk_case(op, 2, 333, 2, 4)) for op in ("gdr",) for f in ("0", "1")],
    *[(f"chunk {op} fp16 fused", {"DSV4_CHUNK_SEGMENTS": "1", "DSV4_CHUNK_FUSED": "1"},
       lambda op=op: chunk_case(op, 2, 333, 2, 4, dtype=F16)) for op in ("gdr",)],
    *[(f"chunk {op} segments warmup={w}", {"DSV4_CHUNK_SEGMENTS": "3", "DSV4_CHUNK_WARMUP": w},
       lambda op=op: chunk_case(op, 1, 1500, 1, 2)) for op in ("gdr", "gla") for w in ("0", "1")],
    *[(f"chunk {op} fp16 segments", {"DSV4_CHUNK_SEGMENTS": "3"},
       lambda op=op: chunk_case(op, 1, 1500, 1, 2, dtype=F16)) for op in ("gdr", "gla")],
    *[(f"chunk {op} varlen", {}, lambda op=op: chunk_case(op, 1, 1200, 2, 4, varlen=[1, 64, 0, 900, 235]))
      for op in ("gdr", "gla")],
]
# (name, env, make): each family's benchmark rows, timed.
TIMING = [
    ("fmha d=128 causal 8k", {}, lambda: fmha_case(1, 8192, 8192, 16, 16, 128, causal=True)),
    ("fmha d=128 full 4k", {}, lambda: fmha_case(2, 4096, 4096, 16, 16, 128)),
    ("fmha d=64 causal 8k", {}, lambda: fmha_case(1, 8192, 8192, 32, 32, 64, causal=True)),
    ("fmha d=256 full 4k", {}, lambda: fmha_case(2, 4096, 4096, 8, 8, 256)),
    ("fmha d=128 decode B=1 8k gqa 32/8", {}, lambda: fmha_case(1, 1, 8192, 32, 8, 128)),
    ("fmha d=512 causal 8k Hq=128", {}, lambda: fmha_case(1, 8192, 8192, 128, 1, 512, causal=True)),
    ("fmha d=512 decode B=64 4k Hq=128", {}, lambda: fmha_case(64, 1, 4096, 128, 1, 512)),
    ("dsv4 sliding 8k Hq=128", {}, lambda: dsv4_case("sliding", 1, 8192, 8192, 128)),
    ("dsv4 CSA 8k Hq=64", {}, lambda: dsv4_case("CSA", 1, 8192, 8192, 64)),
    ("dsv4 HCA 8k Hq=128", {}, lambda: dsv4_case("HCA", 1, 8192, 8192, 128)),
    ("dsv4 CSA decode B=64 4k Hq=128", {}, lambda: dsv4_case("CSA", 64, 1, 4096, 128)),
    ("dsv4 CSA decode B=64 4k Hq=64 (split)", {}, lambda: dsv4_case("CSA", 64, 1, 4096, 64)),
    ("dsv4 HCA decode B=64 4k Hq=64 (split)", {}, lambda: dsv4_case("HCA", 64, 1, 4096, 64)),
    ("dsv4 HCA decode B=8 4k Hq=16 (split)", {}, lambda: dsv4_case("HCA", 8, 1, 4096, 16)),
    ("indexer fp8 8k", {}, lambda: indexer_case(8192)),
    ("indexer paged B=64 64k", {}, lambda: indexer_case(paged=(64, 16384))),
    ("indexer paged B=8 64k", {}, lambda: indexer_case(paged=(8, 16384))),
    ("indexer paged B=64 8k", {}, lambda: indexer_case(paged=(64, 2048))),
    ("merge bf16 8x4096x32x128", {}, lambda: merge_case((8, 4096, 32, 128), H)),
    ("chunk gdr (1, 32768, 16, 32)", {}, lambda: chunk_case("gdr", 1, 32768, 16, 32)),
    ("chunk gdr (4, 8192, 16, 32)", {}, lambda: chunk_case("gdr", 4, 8192, 16, 32)),
    ("chunk gdr (8, 4096, 32, 32)", {}, lambda: chunk_case("gdr", 8, 4096, 32, 32)),
    ("chunk gla (1, 65536, 2, 8)", {}, lambda: chunk_case("gla", 1, 65536, 2, 8)),
]


def digest(out):
    h = hashlib.sha256()
    for t in (out if isinstance(out, (tuple, list)) else (out,)):
        if t is not None:
            h.update(t.detach().contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def child(tree, which):
    src = os.path.join(os.path.abspath(tree), "src")
    sys.path.insert(0, src)
    sys.path.insert(1, BENCHMARKS)
    import common  # noqa: E402
    import dsv4_attn  # noqa: E402
    if not os.path.abspath(dsv4_attn.__file__).startswith(src + os.sep):
        sys.exit(f"ab_ops: imported dsv4_attn from {dsv4_attn.__file__}, not from {src}")
    cases = BITWISE if which == "bitwise" else TIMING
    for i, (name, env, make) in enumerate(cases):
        os.environ.update(env)
        torch.manual_seed(1000 + i)
        fn = make()
        rec = {"case": name, "digest": digest(fn())}
        if which == "timing":
            rec["ms"] = common.bench_ms(fn, warmup=3, rep=30, budget_ms=None, cuda_graph=True)
        for key in env:
            del os.environ[key]
        del fn
        torch.cuda.empty_cache()
        print(json.dumps(rec), flush=True)


def run(tree, which):
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", tree, which],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"ab_ops: {which} in {tree} failed (rc {proc.returncode}):\n"
                 f"{proc.stdout[-2000:]}{proc.stderr[-4000:]}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def report(which, runs, trees):
    base, variant = runs[trees[0]], runs[trees[1]]
    differ = 0
    print(f"---- {which}: base {trees[0]}, variant {trees[1]}, {len(base)} passes")
    for i, rec in enumerate(base[0]):
        digests = {r[i]["digest"] for r in base + variant}
        same_base = len({r[i]["digest"] for r in base}) == 1
        outputs = "bitwise" if len(digests) == 1 else ("DIFFER" if same_base else "base moves")
        differ += outputs != "bitwise"
        line = f"{rec['case']:<40} {outputs:<10}"
        if which == "timing":
            b = [r[i]["ms"] for r in base]
            v = [r[i]["ms"] for r in variant]
            line += (f" base {' / '.join(f'{x:.3f}' for x in b):<18} variant "
                     f"{' / '.join(f'{x:.3f}' for x in v):<18} variant/base "
                     f"{statistics.median(v) / statistics.median(b):.3f}")
        print(line)
    return differ


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("base", nargs="?")
    p.add_argument("variant", nargs="?")
    p.add_argument("--only", choices=["bitwise", "timing"], default=None)
    p.add_argument("--passes", type=int, default=2)
    p.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(*args.child)
    if not args.base or not args.variant:
        p.error("the base and variant source trees are required")
    differ = 0
    for which in ([args.only] if args.only else ["bitwise", "timing"]):
        runs = {args.base: [], args.variant: []}
        for _ in range(args.passes if which == "timing" else 1):
            for tree in (args.base, args.variant):
                runs[tree].append(run(tree, which))
        differ += report(which, runs, [args.base, args.variant])
    print(f"ab_ops: {differ} case(s) not bitwise equal")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
