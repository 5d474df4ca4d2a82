"""One profiled call of dsv4_attn's chunk op and one of FlashQLA on the same inputs
(bench_chunk's rows and input recipe), for Nsight Compute: every kernel of each call is
captured, so the delta rule shows its inverse kernel beside the chunk kernel. A tool for
choosing, not a test.

    ncu --profile-from-start off --kernel-name-base demangled --set full -o prof \\
        python benchmarks/profile/chunk_profile.py --shape 4,8192,16,32 --op gated_delta_rule

    ncu --import prof.ncu-rep --page details --csv > details.csv
    python benchmarks/profile/chunk_profile.py --summarize details.csv

Each implementation is warmed up unprofiled (FlashQLA compiles on first use); only the call
between profiler start and stop is captured. FlashQLA joins the delta rule when it imports
(`source .peers/gla/env.sh`). --summarize prints the details page's metrics with the kernels
side by side.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
import bench_chunk  # noqa: E402
import common  # noqa: E402


def owner(kernel_name):
    """Whose kernel, with its short name: FlashQLA's are TileLang's, every other one in this
    process is ours (ncu's demangled base name drops the namespace)."""
    who = "FlashQLA" if "tilelang" in kernel_name.lower() else "dsv4"
    base = kernel_name.removeprefix("void ").split("<")[0].split("(")[0]
    return f"{who} {base}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="4,8192,16,32", help="B,T,H,HV (B = 0: bench_chunk's "
                                                            "varlen row)")
    ap.add_argument("--op", default="gated_delta_rule", choices=["gated_delta_rule", "simple_gla"])
    ap.add_argument("--summarize", metavar="CSV", help="print an ncu details CSV side by side")
    args = ap.parse_args()
    if args.summarize:
        return common.print_ncu_side_by_side(args.summarize, owner)
    import dsv4_attn

    torch.manual_seed(0)
    shape = tuple(int(x) for x in args.shape.split(","))
    q, k, v, g, beta, s0, cu, *_ = bench_chunk.row_inputs(shape, torch.bfloat16,
                                                          torch.device("cuda"))
    path = dsv4_attn.chunk_gated_delta_rule_path(q, k, v, g, beta, cu_seqlens=cu)
    if path != "sm90":
        sys.exit(f"chunk_profile: dsv4 took the {path} path, not sm90")
    if args.op == "gated_delta_rule":
        calls = {"dsv4": lambda: dsv4_attn.chunk_gated_delta_rule(
            q, k, v, g, beta, initial_state=s0, output_final_state=True, cu_seqlens=cu)}
    else:
        calls = {"dsv4": lambda: dsv4_attn.chunk_simple_gla(
            q, k, v, g, initial_state=s0, output_final_state=True, cu_seqlens=cu)}
    qla = bench_chunk.peer_calls(args.op, q, k, v, g, beta, s0, cu).get("FlashQLA")
    if qla is not None:
        calls["FlashQLA"] = qla
    common.profile_calls(calls, f" ({args.op}, {shape})")


if __name__ == "__main__":
    main()
