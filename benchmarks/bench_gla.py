"""Chunked linear attention forward: dsv4's sm90 kernel against the reference path and against
the floor of this GPU, all measured in one process.

    python benchmarks/bench_gla.py            # the issue's five shapes, both ops
    python benchmarks/bench_gla.py --quick    # two shapes (smoke run)

Floor = max(FLOPs / bf16 GEMM rate, bytes / copy bandwidth), both ceilings measured in this run.
  FLOPs: 183k per (head, token) for chunk_gated_delta_rule, 98k for chunk_simple_gla (64-token
         chunks, K = V = 128: QK^T, KK^T, the WY products, Q S, K S, the state update).
  bytes: q, k, v, o, g (and beta) read or written once, plus the initial and final states.
Every row also reports which path ran and the rel-RMS difference between the kernel and the
reference path, so a fast wrong kernel shows up next to its speed. Prints one table (last) and
appends it to benchmarks/RESULTS.md unless --no-append.
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402

FLOPS_PER_HEAD_TOKEN = {"gated_delta_rule": 183e3, "simple_gla": 98e3}
TARGET = {"gated_delta_rule": 2.0, "simple_gla": 1.6}  # our time / floor, first four shapes
SHAPES = [  # (B, T, H, HV)
    (1, 32768, 16, 32),
    (4, 8192, 16, 32),
    (1, 8192, 16, 64),
    (8, 4096, 32, 32),
    (1, 65536, 2, 8),
]
QUICK_SHAPES = [(1, 8192, 16, 32), (1, 16384, 2, 8)]
D = 128


def make_inputs(b, t, h, hv, dtype, device):
    q = F.normalize(torch.randn(b, t, h, D, device=device), dim=-1).to(dtype)
    k = F.normalize(torch.randn(b, t, h, D, device=device), dim=-1).to(dtype)
    v = torch.randn(b, t, hv, D, device=device).to(dtype)
    g = -0.5 * torch.rand(b, t, hv, device=device)
    beta = torch.rand(b, t, hv, device=device).clamp_min(1e-3)
    s0 = torch.randn(b, hv, D, D, device=device)
    return q, k, v, g, beta, s0


def count_bytes(op, b, t, h, hv, elem):
    qk = 2 * b * t * h * D * elem
    vo = 2 * b * t * hv * D * elem
    gates = (2 if op == "gated_delta_rule" else 1) * b * t * hv * 4
    states = 2 * b * hv * D * D * 4
    return qk + vo + gates + states


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="two shapes only (smoke run)")
    p.add_argument("--no-append", action="store_true", help="do not append to RESULTS.md")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    args = p.parse_args(argv)

    device = common.require_cuda("bench_gla")
    import dsv4_attn as dsv4  # after the CUDA check

    dtype = common.parse_dtype(args.dtype)
    torch.manual_seed(0)
    header = common.env_header(device)
    print(header)
    gemm = common.gemm_tflops(device, dtype)
    copy_gbs = common.copy_bandwidth(device)
    ceilings = (f"ceilings this run: {common.dtype_name(dtype)} GEMM 8192^3 {gemm:.0f} TFLOP/s | "
                f"D2D copy {copy_gbs:.0f} GB/s (read + write)")
    print(ceilings)

    rows = []
    for shape_i, (b, t, h, hv) in enumerate(QUICK_SHAPES if args.quick else SHAPES):
        q, k, v, g, beta, s0 = make_inputs(b, t, h, hv, dtype, device)
        path = dsv4.chunk_gla_path(q, k, v)
        for op in ("gated_delta_rule", "simple_gla"):
            if op == "gated_delta_rule":
                fn = lambda: dsv4.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=s0,
                                                         output_final_state=True)
            else:
                fn = lambda: dsv4.chunk_simple_gla(q, k, v, g, initial_state=s0,
                                                   output_final_state=True)
            ours_ms = common.bench_ms(fn, warmup=2, rep=10, budget_ms=300.0)
            o, final = fn()
            os.environ["DSV4_DISABLE_SM90"] = "1"
            try:
                ref_ms = common.bench_ms(fn, warmup=1, rep=3, budget_ms=1.0)
                o_ref, final_ref = fn()
            finally:
                del os.environ["DSV4_DISABLE_SM90"]
            diff = max(((o.float() - o_ref.float()).norm() / o_ref.float().norm()).item(),
                       ((final - final_ref).norm() / final_ref.norm()).item())
            del o, final, o_ref, final_ref
            flops = FLOPS_PER_HEAD_TOKEN[op] * b * t * hv
            nbytes = count_bytes(op, b, t, h, hv, q.element_size())
            compute_ms = flops / (gemm * 1e12) * 1e3
            memory_ms = nbytes / (copy_gbs * 1e9) * 1e3
            floor_ms = max(compute_ms, memory_ms)
            ratio = ours_ms / floor_ms
            targeted = shape_i < 4 and not args.quick
            verdict = (("met" if ratio <= TARGET[op] else "MISSED") + f" (<= {TARGET[op]})"
                       if targeted else "report")
            rows.append([op, f"({b}, {t}, {h}, {hv})", path, f"{ours_ms:.3f}", f"{ref_ms:.2f}",
                         f"{ref_ms / ours_ms:.0f}x",
                         f"{floor_ms:.3f} ({'mem' if memory_ms >= compute_ms else 'mma'})",
                         f"{ratio:.2f}", verdict, f"{diff:.1e}"])
            print("  ".join(rows[-1]), flush=True)
        del q, k, v, g, beta, s0
        torch.cuda.empty_cache()

    headers = ["op", "(B, T, H, HV)", "path", "ours ms", "reference ms", "speedup",
               "floor ms (bound)", "ours / floor", "target", "rel-RMS vs ref"]
    units = ("ms: median per call with initial and final state; floor: max(FLOPs / GEMM rate, "
             "bytes / copy bandwidth); rel-RMS vs ref: max over o and final_state of "
             "||ours - reference path|| / ||reference path||")
    md = "\n".join([header, "", ceilings, "", units, "",
                    common.format_table(headers, rows, markdown=True)])
    print()
    print(md)
    print()
    print(common.format_table(headers, rows))
    if not args.no_append:
        common.append_results(os.path.join(HERE, "RESULTS.md"),
                              f"chunked linear attention, {common.dtype_name(dtype)}"
                              + (" (quick)" if args.quick else ""), md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
