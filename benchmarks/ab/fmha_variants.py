"""Time launch-time variants of the sm90 fmha kernel against each other and FlashAttention-3 in
one process: the sweeps behind docs/fmha.md. A tool for choosing, not a test.

    python benchmarks/ab/fmha_variants.py --env DSV4_FMHA_D128_BLOCK_N=176,128 --dims 128
    python benchmarks/ab/fmha_variants.py --env DSV4_FMHA_GRID=per_tile,persistent --causal 0
    python benchmarks/ab/fmha_variants.py --env DSV4_FMHA_GRID=per_tile,dynamic --varlen

Each variant is one value of an environment variable the launcher reads on every call. Rows:
bf16, B*S = 16k tokens, Hq = 2048 / D (plus GQA 32/8 at D = 128), S in --seqs, causal and not;
with --varlen, bench_fmha.py's mixed-length batches instead (FA3's varlen call beside them).
The variants of a row run alternately, --rounds times, each time the median of 20 event-timed
calls; a row prints the median over rounds in TFLOP/s (causal counted as half), each variant's
ratio to the first and to FA3's rate when fa3_fwd_interface imports (`source .peers/fmha/env.sh`),
and whether the variants' outputs are bitwise equal.
"""
import argparse
import os
import statistics
import sys

import torch

import dsv4_attn

try:
    from fa3_fwd_interface import flash_attn_func as fa3_func
    from fa3_fwd_interface import flash_attn_varlen_func as fa3_varlen_func
except ImportError:
    fa3_func = fa3_varlen_func = None


def median_ms(fn, reps=20, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(reps)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events)


def dense_rows(dims, seqs, causals):
    """(label, flops, ours(), fa3() or None) per row."""
    for d in dims:
        heads = [(2048 // d, 2048 // d)] + ([(32, 8)] if d == 128 else [])
        for hq, hkv in heads:
            for causal in causals:
                for s in seqs:
                    b = 16384 // s
                    gen = torch.Generator(device="cuda").manual_seed(s + d + hq)
                    q = torch.randn(b, s, hq, d, device="cuda", generator=gen).bfloat16()
                    k, v = [torch.randn(b, s, hkv, d, device="cuda", generator=gen).bfloat16()
                            for _ in range(2)]
                    label = (f"{b:>3} {s:>6} {f'{hq}/{hkv}':>7} {d:>4} {str(causal):>6} "
                             f"{dsv4_attn.fmha_path(q, k, v, causal=causal):>6}")
                    yield (label, 4 * b * hq * s * s * d / (2 if causal else 1),
                           lambda: dsv4_attn.fmha(q, k, v, causal=causal),
                           (lambda: fa3_func(q, k, v, causal=causal)) if fa3_func else None)


def varlen_rows():
    # benchmarks/bench_fmha.py: the same batches as its varlen table
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import bench_fmha
    gen = torch.Generator().manual_seed(5)
    for name, lens, hq, hkv, d, causal in bench_fmha.VARLEN_ROWS:
        if lens is None:
            lens = torch.randint(64, 4097, (64,), generator=gen).tolist()
        total = sum(lens)
        q = torch.randn(total, hq, d, device="cuda").bfloat16()
        k, v = [torch.randn(total, hkv, d, device="cuda").bfloat16() for _ in range(2)]
        cu = torch.tensor([0] + lens, device="cuda").cumsum(0).to(torch.int32)
        mx = max(lens)
        kw = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=mx, max_seqlen_k=mx,
                  causal=causal)
        pairs = sum(n * (n + 1) // 2 if causal else n * n for n in lens)
        label = f"{name:<16} {f'{hq}/{hkv}':>7} {d:>4} {str(causal):>6} " + \
            f"{dsv4_attn.fmha_path(q, k, v, causal=causal, cu_seqlens_q=cu, cu_seqlens_k=cu):>6}"
        yield (label, 4.0 * pairs * hq * d, lambda: dsv4_attn.fmha(q, k, v, **kw),
               (lambda: fa3_varlen_func(q, k, v, cu, cu, mx, mx, causal=causal))
               if fa3_varlen_func else None)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", required=True, help="NAME=V1,V2,...: the variants, first is the base")
    ap.add_argument("--dims", default="64,128,256")
    ap.add_argument("--seqs", default="1024,2048,4096,8192,16384")
    ap.add_argument("--causal", default="0,1", help="0, 1 or 0,1")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--varlen", action="store_true", help="bench_fmha.py's varlen batches")
    args = ap.parse_args()
    name, values = args.env.split("=", 1)
    values = values.split(",")
    print(f"{torch.cuda.get_device_name()} | torch {torch.__version__} | variants {name}="
          f"{'|'.join(values)} | FA3 {'yes' if fa3_func else 'n/a'} | TFLOP/s, causal as half")
    head = " ".join(f"{v:>8}" for v in values)
    print(f"{'row':<40} {head} {'FA3':>7}  to {values[0]:<15} {'to FA3':<18} bitwise")
    if args.varlen:
        rows = varlen_rows()
    else:
        rows = dense_rows([int(x) for x in args.dims.split(",")],
                          [int(x) for x in args.seqs.split(",")],
                          [x == "1" for x in args.causal.split(",")])
    for label, flops, ours, fa3 in rows:
        times = {v_: [] for v_ in values}
        outs = {}
        for _ in range(args.rounds):
            for value in values:
                os.environ[name] = value
                outs[value] = ours()
                times[value].append(median_ms(ours))
        os.environ.pop(name)
        rate = {v_: flops / statistics.median(t) / 1e9 for v_, t in times.items()}
        fa3_rate = flops / median_ms(fa3) / 1e9 if fa3 else float("nan")
        same = all(torch.equal(outs[values[0]], o) for o in outs.values())
        ratios = " ".join(f"{rate[v_] / rate[values[0]]:.3f}" for v_ in values[1:])
        to_fa3 = " ".join(f"{rate[v_] / fa3_rate:.3f}" for v_ in values)
        cells = " ".join(f"{rate[v_]:8.1f}" for v_ in values)
        print(f"{label:<40} {cells} {fa3_rate:7.1f}  {ratios:<18} {to_fa3:<18} {same}",
              flush=True)


if __name__ == "__main__":
    main()
