"""One profiled call of dsv4_attn.fmha and one of FlashAttention-3 on the same inputs, for Nsight
Compute: which of the two kernels spends what where. A tool for choosing, not a test.

    ncu --profile-from-start off --kernel-name-base demangled \\
        --kernel-name regex:"fmha_sm90_kernel|FlashAttnFwdSm90" --set full -o prof \\
        python benchmarks/profile/fmha_profile.py --batch 4 --seq 4096 --heads 16 --dim 128 \\
        --causal 0

    ncu --import prof.ncu-rep --page details --csv > details.csv
    python benchmarks/profile/fmha_profile.py --summarize details.csv

Each implementation is warmed up unprofiled; only the call between profiler start and stop is
captured. FlashAttention-3 joins when fa3_fwd_interface imports (`source .peers/fmha/env.sh`).
--summarize prints the details page's metrics with the kernels side by side.
"""
import argparse
import os
import sys

import torch

import dsv4_attn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402  (benchmarks/common.py)

try:
    from fa3_fwd_interface import flash_attn_func as fa3_func
except ImportError:
    fa3_func = None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=0, help="default: --heads")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--causal", type=int, default=0)
    ap.add_argument("--summarize", metavar="CSV", help="print an ncu details CSV side by side")
    args = ap.parse_args()
    if args.summarize:
        return summarize(args.summarize)
    hkv = args.kv_heads or args.heads
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rand(h):
        return torch.randn(args.batch, args.seq, h, args.dim, generator=gen, device="cuda",
                           dtype=torch.bfloat16)

    q, k, v = rand(args.heads), rand(hkv), rand(hkv)
    causal = bool(args.causal)
    calls = {"dsv4": lambda: dsv4_attn.fmha(q, k, v, causal=causal)}
    assert dsv4_attn.fmha_path(q, k, v, causal=causal) == "sm90"
    if fa3_func is not None:
        calls["FA3"] = lambda: fa3_func(q, k, v, causal=causal)
    common.profile_calls(calls)


def summarize(path):
    """Kernels as columns (ours first), one row per (section, metric)."""
    common.print_ncu_side_by_side(path, lambda name: "dsv4" if "fmha_sm90" in name else "FA3")


if __name__ == "__main__":
    main()
