"""DeepSeek-V4 shapes at head_dim 512: fmha with one KV head read as K and V, and
dsv4_attention layers, beside FlashAttention-3 and the same run's ceilings.

FlashAttention-3 (an optional import, `source .peers/fmha/env.sh`, see ../shared/peers) runs
its MLA path: q and k of head_dim 64 set to zero plus qv = q (512) and v = kv, so that its
scores are q . kv, the same attention as ours. Rows without FA3 say "n/a".

Every row prints the path ours took, its time, FA3's, the ratio, and our fraction of the
ceiling: the bf16 GEMM rate (useful FLOPs: 4 * rows * visible keys * 512) for prefill rows,
the copy bandwidth for the bytes a decode row must read (the K/V rows once, q and out).
    python benchmarks/bench_dsv4.py [--quick] [--out DIR]

--status-out PATH writes the table as RESULTS.md's bench_dsv4 status block
(benchmarks/update_status.py puts it there).
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


def row_layer(kind, b, s, h, ceil, device, dtype, decode=False):
    """One dsv4_attention layer: window 128 and sinks; CSA adds K = 512 of a 4x compressed KV,
    HCA every closed row of a 128x one. Prefill: Sq = Skv = s; decode: Sq = 1 over s tokens."""
    sq = 1 if decode else s
    q = common.randn((b, sq, h, D), dtype, device)
    kv = common.randn((b, s, D), dtype, device)
    kw = dict(sinks=torch.randn(h, device=device), window=128)
    ratio = {"sliding": 0, "CSA": 4, "HCA": 128}[kind]
    sc = s // ratio if ratio else 0
    if ratio:
        kw.update(compressed_kv=common.randn((b, sc, D), dtype, device), compress_ratio=ratio)
    if kind == "CSA":
        kw["topk_indices"] = torch.stack([torch.randperm(sc, device=device)[:512]
                                          for _ in range(b * sq)]).view(b, sq, 512).int()
    path = dsv4_attn.dsv4_attention_path(q, kv, **kw)
    ms = common.bench_ms(lambda: dsv4_attn.dsv4_attention(q, kv, **kw), cuda_graph=True)
    # Keys each query sees: the window, plus the closed compressed rows (HCA) or K (CSA).
    t = torch.arange(s - sq, s, device=device, dtype=torch.float64)
    keys = torch.clamp(t + 1, max=128)
    if kind == "HCA":
        keys = keys + torch.clamp(torch.div(t + 1, ratio, rounding_mode="floor"), max=sc)
    elif kind == "CSA":
        keys = keys + torch.clamp(torch.div(t + 1, ratio, rounding_mode="floor"), max=512)
    flops = 4.0 * b * h * D * keys.sum().item()
    gathered = b * (min(s, 128 + sq - 1) + (sc if kind == "HCA" else 0) +
                    (512 * sq if kind == "CSA" else 0))
    nbytes = (2 * b * sq * h * D + gathered * D) * q.element_size() + 4 * b * h * sq
    floor_ms = max(flops / (ceil["gemm"] * 1e12), nbytes / (ceil["copy"] * 1e9)) * 1e3
    bound = "GEMM" if flops / ceil["gemm"] / 1e12 > nbytes / ceil["copy"] / 1e9 else "bytes"
    name = f"dsv4_attention {kind} {'decode' if decode else 'prefill'} B={b} S={s} Hq={h}"
    return [name, path, f"{ms:.3f}", "n/a", f"{flops / ms / 1e9:.0f} TFLOP/s",
            f"floor {floor_ms:.3f} ms ({bound})", "-", f"{floor_ms / ms * 100:.0f}% of floor"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=None, help="also write the markdown section to OUT/bench_dsv4.md")
    ap.add_argument("--status-out", default=None, metavar="PATH",
                    help="write the table as a status block for benchmarks/update_status.py")
    args = ap.parse_args(argv)
    device = common.require_cuda("bench_dsv4")
    dtype = torch.bfloat16
    torch.manual_seed(0)
    ceil = {"gemm": common.gemm_tflops(device), "copy": common.copy_bandwidth(device)}
    peers = f"FlashAttention-3: {'MLA path (qv = q, v = kv)' if fa3_func else 'not installed'}"
    header = (f"{common.env_header(device)}\nceilings this run: bf16 GEMM 8192^3 "
              f"{ceil['gemm']:.0f} TFLOP/s | D2D copy {ceil['copy']:.0f} GB/s (read + write)\n"
              f"{peers}")
    shapes = [  # (B, Sq, Sk, Hq, causal)
        (1, 4096, 4096, 64, True), (1, 4096, 4096, 128, True),
        (1, 8192, 8192, 64, True), (1, 8192, 8192, 128, True),
        (64, 1, 4096, 128, True), (64, 2, 4096, 128, True), (32, 1, 8192, 64, True),
    ]
    if args.quick:
        shapes = [(1, 4096, 4096, 64, True), (64, 1, 4096, 128, True)]
    rows = [row_fmha(b, sq, sk, h, causal, ceil, device, dtype) for b, sq, sk, h, causal in shapes]
    layers = [("sliding", 1, 8192, 128, False), ("CSA", 1, 8192, 64, False),
              ("HCA", 1, 8192, 128, False), ("CSA", 64, 4096, 128, True),
              ("sliding", 64, 4096, 128, True), ("HCA", 64, 4096, 128, True)]
    if args.quick:
        layers = layers[:1]
    rows += [row_layer(kind, b, s, h, ceil, device, dtype, decode)
             for kind, b, s, h, decode in layers]
    headers = ["row", "path", "ours ms", "FA3 ms", "ours", "FA3", "speedup vs FA3",
               "ours / ceiling"]
    table_md = common.format_table(headers, rows, markdown=True)
    common.write_status(args.status_out, common.status_block(
        "bench_dsv4", f"{peers}\n\n{table_md}", gemm=ceil["gemm"], copy_gbs=ceil["copy"],
        device=device, dtype=dtype, note="quick" if args.quick else ""))
    print(header)
    print(common.format_table(headers, rows))
    section = header.replace("\n", "\n\n") + "\n\n" + table_md
    title = f"head_dim 512 (bench_dsv4.py), {common.device_name(device)}"
    if args.out:
        with open(os.path.join(args.out, "bench_dsv4.md"), "w", encoding="utf-8") as f:
            f.write(f"## {common.today()}: {title}\n\n{section}\n")


if __name__ == "__main__":
    main()
