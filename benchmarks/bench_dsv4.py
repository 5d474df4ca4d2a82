"""DeepSeek-V4 shapes at head_dim 512: fmha with one KV head read as K and V, and
dsv4_attention layers, beside FlashAttention-3 and the same run's ceilings.

FlashAttention-3 (an optional import, `source .peers/fmha/env.sh`, see ../shared/peers) runs
its MLA path: q and k of head_dim 64 set to zero plus qv = q (512) and v = kv, so that its
scores are q . kv, the same attention as ours. Rows without FA3 say "n/a".

Every row prints the path ours took, its time, FA3's, the ratio, and our fraction of the
ceiling: the bf16 GEMM rate (useful FLOPs: 4 * rows * visible keys * 512) for prefill rows,
the copy bandwidth for the bytes a decode row must read (the K/V rows once, q and out).
    python benchmarks/bench_dsv4.py [--quick] [--markdown]   (--markdown appends to RESULTS.md)
"""
import argparse
import math
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402

import dsv4_attn  # noqa: E402

try:
    from fa3_fwd_interface import flash_attn_func as fa3_func  # noqa: E402
    from fa3_fwd_interface import flash_attn_with_kvcache as fa3_kvcache  # noqa: E402
except ImportError:
    fa3_func = fa3_kvcache = None

D = 512
SCALE = 1.0 / math.sqrt(D)


def causal_pairs(sq, sk):
    """(query, key) pairs a bottom-right causal mask keeps (Sq <= Sk)."""
    return sq * (sk - sq) + sq * (sq + 1) // 2


def fa3_mla(q, kv, causal, decode):
    """FA3's MLA path computing softmax(q . kv^T) kv: zero 64-dim q/k, qv = q, v = kv."""
    b, sq, h, _ = q.shape
    q64 = torch.zeros(b, sq, h, 64, dtype=q.dtype, device=q.device)
    k64 = torch.zeros(b, kv.shape[1], 1, 64, dtype=q.dtype, device=q.device)
    if decode:
        return lambda: fa3_kvcache(q64, k64, kv, qv=q, softmax_scale=SCALE, causal=causal)
    return lambda: fa3_func(q64, k64, kv, qv=q, softmax_scale=SCALE, causal=causal)


def row_fmha(b, sq, sk, h, causal, ceil, device, dtype):
    q = common.randn((b, sq, h, D), dtype, device)
    kv = common.randn((b, sk, 1, D), dtype, device)
    path = dsv4_attn.fmha_path(q, kv, kv, causal=causal)
    ours_ms = common.bench_ms(lambda: dsv4_attn.fmha(q, kv, kv, causal=causal), cuda_graph=True)
    decode = sq <= 8
    peer_ms = None
    if fa3_func is not None:
        fn = fa3_mla(q, kv, causal, decode)
        out = fn()
        out = out[0] if isinstance(out, tuple) else out
        ref = dsv4_attn.fmha(q, kv, kv, causal=causal)
        err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
        assert err < 2e-2, f"FA3 MLA path disagrees with ours: rel {err:.2e}"
        peer_ms = common.bench_ms(fn, cuda_graph=True)
    kind = "decode" if decode else ("causal prefill" if causal else "prefill")
    name = f"fmha MQA {kind} B={b} Sq={sq} Sk={sk} Hq={h}"
    if decode:  # memory-bound: K/V read once, q and out
        nbytes = (b * sk * D + 2 * b * sq * h * D) * q.element_size()
        ours = nbytes / (ours_ms * 1e-3) / 1e9
        peer = None if peer_ms is None else nbytes / (peer_ms * 1e-3) / 1e9
        frac = ours / ceil["copy"]
        unit = "GB/s"
    else:
        pairs = causal_pairs(sq, sk) if causal else sq * sk
        flops = 4.0 * b * h * pairs * D
        ours = flops / (ours_ms * 1e-3) / 1e12
        peer = None if peer_ms is None else flops / (peer_ms * 1e-3) / 1e12
        frac = ours / ceil["gemm"]
        unit = "TFLOP/s"
    return [name, path, f"{ours_ms:.3f}", "n/a" if peer_ms is None else f"{peer_ms:.3f}",
            f"{ours:.0f} {unit}", "n/a" if peer is None else f"{peer:.0f} {unit}",
            "n/a" if peer_ms is None else f"{peer_ms / ours_ms:.2f}x",
            f"{100 * frac:.0f}% {'copy' if decode else 'GEMM'}"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--markdown", action="store_true", help="append the table to RESULTS.md")
    args = ap.parse_args(argv)
    device = common.require_cuda("bench_dsv4")
    dtype = torch.bfloat16
    torch.manual_seed(0)
    ceil = {"gemm": common.gemm_tflops(device), "copy": common.copy_bandwidth(device)}
    header = (f"{common.env_header(device)}\nceilings this run: bf16 GEMM 8192^3 "
              f"{ceil['gemm']:.0f} TFLOP/s | D2D copy {ceil['copy']:.0f} GB/s (read + write)\n"
              f"FlashAttention-3: {'MLA path (qv = q, v = kv)' if fa3_func else 'not installed'}")
    shapes = [  # (B, Sq, Sk, Hq, causal)
        (1, 4096, 4096, 64, True), (1, 4096, 4096, 128, True),
        (1, 8192, 8192, 64, True), (1, 8192, 8192, 128, True),
        (64, 1, 4096, 128, True), (64, 2, 4096, 128, True), (32, 1, 8192, 64, True),
    ]
    if args.quick:
        shapes = [(1, 4096, 4096, 64, True), (64, 1, 4096, 128, True)]
    rows = [row_fmha(b, sq, sk, h, causal, ceil, device, dtype) for b, sq, sk, h, causal in shapes]
    headers = ["row", "path", "ours ms", "FA3 ms", "ours", "FA3", "speedup vs FA3",
               "ours / ceiling"]
    print(header)
    print(common.format_table(headers, rows))
    if args.markdown:
        common.append_results(os.path.join(HERE, "RESULTS.md"),
                              f"head_dim 512 (bench_dsv4.py), {common.device_name(device)}",
                              header.replace("\n", "\n\n") + "\n\n" +
                              common.format_table(headers, rows, markdown=True))


if __name__ == "__main__":
    main()
