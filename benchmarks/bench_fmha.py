"""Forward attention throughput: dsv4_attn.fmha beside FlashAttention-3 and torch SDPA's
cuDNN, flash and memory-efficient backends, all measured in one process on one GPU.

    python benchmarks/bench_fmha.py            # full sweep (< 3 min with the sm90 kernel)
    python benchmarks/bench_fmha.py --quick    # S in {1k, 4k}, D = 128, plus one decode
    python benchmarks/bench_fmha.py --only-varlen   # the varlen and merge tables alone

FlashAttention-3 is an optional import (fa3_fwd_interface: `source .peers/fmha/env.sh`, see
../shared/peers/fetch.sh); without it its cells say n/a. Decode rows (Sq = 1) call FA3's decode
entry point, flash_attn_with_kvcache, which picks its own split count (flash_attn_func does
not split: num_splits=1). After the main table come varlen
rows (mixed-length batches, against FA3's varlen call, one cu_seqlens tensor reused by both)
and merge_attn_states (the fused kernel against the ATen composition, both timed per call in
CUDA graphs of back-to-back calls over inputs that do not fit in L2, in % of copy bandwidth).

Prints one table (last) and writes a PNG of TFLOP/s against S and a copy of the table to --out;
--status-out PATH writes the tables as RESULTS.md's bench_fmha status block
(benchmarks/update_status.py puts it there).
Before any shape is timed, dsv4's output is compared with SDPA's (max |diff|), so a fast wrong
kernel shows up in the same row as its speed.

FLOPs: 4 * B * Hq * Sq * Sk * D (QK^T and PV), halved when causal (Sq == Sk);
decode (Sq = 1): 4 * B * Hq * Sk * D, also reported as GB/s of K and V read.
"""
import argparse
import math
import os
import sys
import warnings
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  (benchmarks/common.py)

try:
    from fa3_fwd_interface import flash_attn_func as fa3_func  # noqa: E402
    from fa3_fwd_interface import flash_attn_varlen_func as fa3_varlen_func  # noqa: E402
    from fa3_fwd_interface import flash_attn_with_kvcache as fa3_kvcache  # noqa: E402
except ImportError:
    fa3_func = fa3_varlen_func = fa3_kvcache = None

HERE = os.path.dirname(os.path.abspath(__file__))
TOKENS = 16384             # B * S for every prefill shape
MODEL_WIDTH = 2048         # Hq * D for the MHA shapes
REFERENCE_MAX_S = 4096     # the portable path is O(S^2); longer shapes are not timed on it
CHECK_TOL = {torch.bfloat16: 5e-2, torch.float16: 1e-2}  # max |dsv4 - SDPA| before FAIL
SDPA_NAMES = ["cuDNN", "flash", "efficient"]
CHECK_ORDER = ["flash", "efficient", "cuDNN"]  # which SDPA output the spot check trusts first


@dataclass
class Shape:
    b: int
    sq: int
    sk: int
    hq: int
    hkv: int
    d: int
    causal: bool

    @property
    def decode(self) -> bool:
        return self.sq == 1

    def flops(self) -> float:
        if self.decode:
            return 4.0 * self.b * self.hq * self.sk * self.d
        f = 4.0 * self.b * self.hq * self.sq * self.sk * self.d
        return f / 2 if self.causal else f

    def kv_bytes(self, dtype: torch.dtype) -> int:
        elem = torch.empty((), dtype=dtype).element_size()
        return 2 * self.b * self.sk * self.hkv * self.d * elem

    def group(self) -> str:
        """Plot panel this shape belongs to (None for decode)."""
        heads = "MHA" if self.hq == self.hkv else f"GQA {self.hq}/{self.hkv}"
        return f"D={self.d} {heads} {'causal' if self.causal else 'non-causal'}"


def sweep(quick: bool) -> List[Shape]:
    seqs = [1024, 4096] if quick else [1024, 2048, 4096, 8192, 16384]
    dims = [128] if quick else [64, 128, 256]
    shapes = []
    for d in dims:
        for causal in (False, True):
            for s in seqs:
                h = MODEL_WIDTH // d
                shapes.append(Shape(TOKENS // s, s, s, h, h, d, causal))
    if not quick:
        for causal in (False, True):
            for s in seqs:
                shapes.append(Shape(TOKENS // s, s, s, 32, 8, 128, causal))
    # Decode: one query per sequence against an 8k cache; K + V = 4 GiB in bf16, so the
    # time is set by HBM bandwidth, not by launch overhead or L2.
    shapes.append(Shape(64, 1, 8192, 16, 16, 128, False))
    # GQA/MQA decode, from one sequence (split-KV territory) to large batches.
    shapes.append(Shape(1, 1, 8192, 32, 8, 128, False))
    if not quick:
        shapes += [Shape(32, 1, 8192, 32, 8, 128, False), Shape(8, 1, 32768, 64, 8, 128, False),
                   Shape(128, 1, 8192, 16, 1, 256, False), Shape(1, 1, 131072, 32, 8, 128, False),
                   Shape(128, 1, 4096, 32, 8, 128, False), Shape(16, 1, 16384, 16, 2, 256, False)]
    return shapes


# ----------------------------------------------------------------------------- one shape


@dataclass
class Row:
    shape: Shape
    path: str = "-"
    check: str = "-"
    failed: bool = False
    ms: Optional[Dict[str, Optional[float]]] = None   # impl -> ms (None: not timed)
    notes: Optional[Dict[str, str]] = None            # impl -> why there is no time


def _sdpa_fn(q, k, v, causal: bool):
    """SDPA on dsv4's (B, S, H, D) tensors; call it inside sdpa_kernel(backend)."""
    # SDPA wants (B, H, S, D); its is_causal is top-left aligned, which equals dsv4's
    # bottom-right alignment only when Sq == Sk (decode shapes are non-causal).
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    kwargs = {"is_causal": causal}
    if q.shape[2] != k.shape[2]:
        kwargs["enable_gqa"] = True
    return lambda: F.scaled_dot_product_attention(qt, kt, vt, **kwargs)


def _short_error(e: BaseException) -> str:
    return "OOM" if isinstance(e, torch.cuda.OutOfMemoryError) else "n/a"


def measure(shape: Shape, dtype: torch.dtype, device, dsv4, args) -> Row:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"cuDNN": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
    row = Row(shape, ms={}, notes={})
    q = common.randn((shape.b, shape.sq, shape.hq, shape.d), dtype, device)
    k = common.randn((shape.b, shape.sk, shape.hkv, shape.d), dtype, device)
    v = common.randn((shape.b, shape.sk, shape.hkv, shape.d), dtype, device)

    row.path = dsv4.fmha_path(q, k, v, causal=shape.causal)
    ours = None
    # The portable path holds O(Sq * Sk) scores; time it only up to S = REFERENCE_MAX_S
    # (decode, with Sq = 1, always fits).
    run_ours = not (row.path == "reference" and shape.sq * shape.sk > REFERENCE_MAX_S ** 2)
    if run_ours:
        try:
            ours = dsv4.fmha(q, k, v, causal=shape.causal)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001  (report and keep sweeping)
            row.notes["dsv4"] = "OOM" if isinstance(e, torch.cuda.OutOfMemoryError) else "error"
            torch.cuda.empty_cache()
            print(f"    dsv4 failed: {type(e).__name__}: {str(e).splitlines()[0]}")
    else:
        row.notes["dsv4"] = "skipped (reference path)"

    # Every SDPA backend runs once; refusals become n/a, the outputs feed the spot check.
    sdpa = _sdpa_fn(q, k, v, shape.causal)
    sdpa_ok, sdpa_out = [], {}
    for name in SDPA_NAMES:
        try:
            with warnings.catch_warnings(), sdpa_kernel(backends[name]):
                warnings.simplefilter("ignore")  # SDPA explains each refusal at length
                sdpa_out[name] = sdpa()
            torch.cuda.synchronize()
            sdpa_ok.append(name)
        except Exception as e:  # noqa: BLE001  (a backend that refuses a shape is n/a)
            row.notes[name] = _short_error(e)
            torch.cuda.empty_cache()

    fa3_call = None
    if fa3_func is not None:
        fa3_call = ((lambda: fa3_kvcache(q, k, v, causal=shape.causal)) if shape.decode
                    else (lambda: fa3_func(q, k, v, causal=shape.causal)))
        try:
            fa3_out = fa3_call()
            fa3_out = fa3_out[0] if isinstance(fa3_out, tuple) else fa3_out
            torch.cuda.synchronize()
            if ours is not None and (fa3_out.float() - ours.float()).abs().max().item() > 5e-2:
                row.notes["FA3"] = "disagrees"
            del fa3_out
        except Exception as e:  # noqa: BLE001
            row.notes["FA3"] = _short_error(e)
            torch.cuda.empty_cache()
    else:
        row.notes["FA3"] = "n/a"

    ref_name = next((n for n in CHECK_ORDER if n in sdpa_out), None)
    if ours is not None and ref_name is not None:
        ref = sdpa_out[ref_name].transpose(1, 2)
        diff = (ours.float() - ref.float()).abs().max().item()
        row.failed = not (diff <= CHECK_TOL.get(dtype, 5e-2))  # NaN fails too
        row.check = f"{diff:.1e} vs {ref_name}" + (" FAIL" if row.failed else "")
    elif ours is not None:
        row.check = "no SDPA peer"
    del sdpa_out

    timing = dict(warmup=args.warmup, rep=args.rep, budget_ms=args.budget_ms)
    if ours is not None:
        del ours
        try:
            row.ms["dsv4"] = common.bench_ms(lambda: dsv4.fmha(q, k, v, causal=shape.causal),
                                             **timing)
        except Exception as e:  # noqa: BLE001
            row.notes["dsv4"] = _short_error(e)
            torch.cuda.empty_cache()
    if fa3_func is not None and "FA3" not in row.notes:
        row.ms["FA3"] = common.bench_ms(fa3_call, **timing)
    for name in sdpa_ok:
        try:
            with sdpa_kernel(backends[name]):
                row.ms[name] = common.bench_ms(sdpa, **timing)
        except Exception as e:  # noqa: BLE001
            row.notes[name] = _short_error(e)
            torch.cuda.empty_cache()
    return row


# ----------------------------------------------------------------------------- varlen, merge

# Mixed-length batches: (name, lengths, Hq, Hkv, D, causal). The first is the row: 10
# sequences, 19k tokens, GQA 32/8.
VARLEN_ROWS = [
    ("10 seqs 19k GQA", [4096, 512, 3000, 100, 2048, 1, 5000, 700, 2900, 1100], 32, 8, 128, True),
    ("10 seqs 19k GQA", [4096, 512, 3000, 100, 2048, 1, 5000, 700, 2900, 1100], 32, 8, 128, False),
    ("64 seqs 64-4096", None, 16, 16, 128, True),
    ("10 seqs 19k D64", [4096, 512, 3000, 100, 2048, 1, 5000, 700, 2900, 1100], 32, 32, 64, True),
    ("10 seqs 19k D256", [4096, 512, 3000, 100, 2048, 1, 5000, 700, 2900, 1100], 16, 16, 256, True),
]


def varlen_table(dtype, device, dsv4, args, gemm: float) -> str:
    gen = torch.Generator().manual_seed(5)
    body = []
    for name, lens, hq, hkv, d, causal in VARLEN_ROWS:
        if lens is None:
            lens = torch.randint(64, 4097, (64,), generator=gen).tolist()
        total = sum(lens)
        q = common.randn((total, hq, d), dtype, device)
        k = common.randn((total, hkv, d), dtype, device)
        v = common.randn((total, hkv, d), dtype, device)
        cu = torch.tensor([0] + lens, device=device).cumsum(0).to(torch.int32)  # reused by all
        mx = max(lens)
        pairs = sum(n * (n + 1) // 2 if causal else n * n for n in lens)
        flops = 4.0 * pairs * hq * d
        kw = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=mx, max_seqlen_k=mx, causal=causal)
        path = dsv4.fmha_path(q, k, v, causal=causal, cu_seqlens_q=cu, cu_seqlens_k=cu)
        timing = dict(warmup=args.warmup, rep=args.rep, budget_ms=args.budget_ms)
        ours = dsv4.fmha(q, k, v, **kw)
        ms = common.bench_ms(lambda: dsv4.fmha(q, k, v, **kw), **timing)
        fa3_ms, check = None, "-"
        if fa3_varlen_func is not None:
            ref = fa3_varlen_func(q, k, v, cu, cu, mx, mx, causal=causal)
            ref = ref[0] if isinstance(ref, tuple) else ref
            check = f"{(ours.float() - ref.float()).abs().max().item():.1e}"
            fa3_ms = common.bench_ms(lambda: fa3_varlen_func(q, k, v, cu, cu, mx, mx,
                                                             causal=causal), **timing)
        tf = flops / (ms * 1e-3) / 1e12
        body.append([name, len(lens), total, f"{hq}/{hkv}", d, "yes" if causal else "no", path,
                     check, f"{ms:.3f}", f"{fa3_ms:.3f}" if fa3_ms else "n/a", f"{tf:.0f}",
                     f"{fa3_ms / ms:.2f}x" if fa3_ms else "n/a", f"{100 * tf / gemm:.0f}%"])
        del q, k, v, ours
        torch.cuda.empty_cache()
    headers = ["varlen batch", "N", "tokens", "Hq/Hkv", "D", "causal", "path", "max |dsv4-FA3|",
               "dsv4 ms", "FA3 ms", "dsv4 TFLOP/s", "dsv4/FA3", "of GEMM"]
    return common.format_table(headers, body)


def merge_table(dtype, device, dsv4, args, copy_gbs: float) -> str:
    """merge_attn_states reads two outputs and two lse and writes one of each. Both paths are
    timed inside CUDA graphs. A graph of one call times the launch as much as the pass: at 25 MB
    even a plain copy replays at about a third of the copy rate. So the rate columns time a
    graph of back-to-back calls that rotate over enough input sets (3 x L2 in all) that no call
    finds its inputs in L2, and divide by the calls; the one-call column is kept beside them."""
    body = []
    l2_bytes = torch.cuda.get_device_properties(device).L2_cache_size
    for b, t, h, d in [(4, 4096, 32, 128), (1, 8192, 128, 512), (64, 1, 128, 512)]:
        set_bytes = 2 * b * t * h * d * torch.finfo(dtype).bits // 8
        n_sets = max(1, min(8, math.ceil(3 * l2_bytes / set_bytes)))
        sets = []
        for _ in range(n_sets):
            sets.append((common.randn((b, t, h, d), dtype, device),
                         common.randn((b, h, t), torch.float32, device),
                         common.randn((b, t, h, d), dtype, device),
                         common.randn((b, h, t), torch.float32, device)))
        a, la = sets[0][0], sets[0][1]
        nbytes = 3 * a.numel() * a.element_size() + 3 * la.numel() * 4
        calls = 3 * n_sets

        def rotate():
            for i in range(calls):
                dsv4.merge_attn_states(*sets[i % n_sets])

        timing = dict(warmup=args.warmup, rep=args.rep, budget_ms=args.budget_ms, cuda_graph=True)
        one = common.bench_ms(lambda: dsv4.merge_attn_states(*sets[0]), **timing)
        fused = common.bench_ms(rotate, **timing) / calls
        os.environ["DSV4_DISABLE_SM90"] = "1"
        try:
            aten = common.bench_ms(rotate, **timing) / calls
        finally:
            del os.environ["DSV4_DISABLE_SM90"]
        gbs = nbytes / (fused * 1e-3) / 1e9
        body.append([f"({b}, {t}, {h}, {d})", f"{nbytes / 1e6:.0f}", f"{calls} over {n_sets}",
                     f"{fused * 1e3:.1f}", f"{aten * 1e3:.1f}", f"{gbs:.0f}",
                     f"{100 * gbs / copy_gbs:.0f}%", f"{one * 1e3:.1f}"])
        del sets, a, la
    headers = ["merge (B, T, H, Dv)", "MB moved", "calls per graph over input sets",
               "fused us per call", "ATen us per call", "fused GB/s", "of copy",
               "fused us, one-call graph"]
    return common.format_table(headers, body)


# ----------------------------------------------------------------------------- report


def _tflops(shape: Shape, ms: float) -> float:
    return shape.flops() / (ms * 1e-3) / 1e12


def _cell(row: Row, impl: str, dtype) -> str:
    ms = row.ms.get(impl)
    if ms is None:
        return row.notes.get(impl, "n/a")
    text = f"{_tflops(row.shape, ms):.1f}"
    if row.shape.decode:
        text = f"{_tflops(row.shape, ms):.2f} ({row.shape.kv_bytes(dtype) / (ms * 1e-3) / 1e9:.0f} GB/s)"
    return text


def _ratio(row: Row, other: Optional[str]) -> str:
    ours = row.ms.get("dsv4")
    theirs = row.ms.get(other) if other else None
    if ours is None or theirs is None:
        return "n/a"
    return f"{theirs / ours:.2f}x"  # time ratio = throughput ratio dsv4 / peer


def _best_sdpa(row: Row) -> Optional[str]:
    timed = [(row.ms[n], n) for n in SDPA_NAMES if row.ms.get(n) is not None]
    return min(timed)[1] if timed else None


def _ceiling(row: Row, dtype, gemm: float, copy_gbs: float) -> str:
    ms = row.ms.get("dsv4")
    if ms is None:
        return "-"
    if row.shape.decode:
        return f"{100 * row.shape.kv_bytes(dtype) / (ms * 1e-3) / 1e9 / copy_gbs:.0f}% copy"
    return f"{100 * _tflops(row.shape, ms) / gemm:.0f}% GEMM"


def build_table(rows: List[Row], dtype, gemm: float, copy_gbs: float, markdown: bool) -> str:
    headers = ["B", "Sq", "Sk", "Hq/Hkv", "D", "causal", "path", "check max abs Δ",
               "dsv4", "FA3", "cuDNN", "flash", "efficient", "dsv4/FA3", "dsv4/cuDNN",
               "dsv4/best SDPA", "dsv4 of ceiling"]
    body = []
    for r in rows:
        s = r.shape
        best = _best_sdpa(r)
        body.append([
            s.b, s.sq, s.sk, f"{s.hq}/{s.hkv}", s.d, "yes" if s.causal else "no", r.path,
            r.check, _cell(r, "dsv4", dtype), _cell(r, "FA3", dtype), _cell(r, "cuDNN", dtype),
            _cell(r, "flash", dtype), _cell(r, "efficient", dtype), _ratio(r, "FA3"),
            _ratio(r, "cuDNN"),
            _ratio(r, best) + (f" ({best})" if best and "dsv4" in r.ms else ""),
            _ceiling(r, dtype, gemm, copy_gbs),
        ])
    return common.format_table(headers, body, markdown=markdown)


def plot(rows: List[Row], path: str, title: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib is not installed; skipping the plot")
        return
    groups: Dict[str, List[Row]] = {}
    for r in rows:
        if not r.shape.decode:
            groups.setdefault(r.shape.group(), []).append(r)
    if not groups:
        return
    ncols = min(4, len(groups))
    nrows = math.ceil(len(groups) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.4 * nrows), squeeze=False)
    for ax, (name, grp) in zip(axes.flat, groups.items()):
        for impl, style in [("dsv4", "o-"), ("cuDNN", "s--"), ("flash", "^--"),
                            ("efficient", "v--")]:
            pts = [(r.shape.sq, _tflops(r.shape, r.ms[impl])) for r in grp
                   if r.ms.get(impl) is not None]
            if pts:
                ax.plot(*zip(*pts), style, label=impl)
        ax.set_xscale("log", base=2)
        seqs = sorted({r.shape.sq for r in grp})
        ax.set_xticks(seqs)
        ax.set_xticklabels([f"{x // 1024}k" if x % 1024 == 0 else str(x) for x in seqs])
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("S (B*S = 16k tokens)")
        ax.set_ylabel("TFLOP/s")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(groups):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")


# ----------------------------------------------------------------------------- main


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="S in {1k, 4k}, D = 128 only, plus one decode shape (smoke run)")
    p.add_argument("--out", default=HERE,
                   help="folder for the PNG and a copy of the table (default: benchmarks/)")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"],
                   help="input dtype (default bf16)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up calls per measurement")
    p.add_argument("--rep", type=int, default=20, help="most timed calls per measurement")
    p.add_argument("--only-varlen", action="store_true",
                   help="only the varlen and merge tables (no sweep, nothing appended)")
    p.add_argument("--only-decode", action="store_true",
                   help="only the decode rows of the sweep (nothing appended)")
    p.add_argument("--budget-ms", type=float, default=150.0,
                   help="fewer timed calls (at least 3) when --rep calls would take longer")
    p.add_argument("--status-out", default=None, metavar="PATH",
                   help="write the tables as a status block for benchmarks/update_status.py")
    args = p.parse_args(argv)

    device = common.require_cuda("bench_fmha")
    import dsv4_attn as dsv4  # after the CUDA check: a CPU box gets the clear message above

    dtype = common.parse_dtype(args.dtype)
    dname = common.dtype_name(dtype)
    torch.manual_seed(0)

    header = common.env_header(device)
    print(header)
    gemm = common.gemm_tflops(device, dtype)
    copy_gbs = common.copy_bandwidth(device)
    ceilings = (f"ceilings this run: {dname} GEMM 8192^3 {gemm:.0f} TFLOP/s | "
                f"D2D copy {copy_gbs:.0f} GB/s (read + write)")
    print(ceilings)
    peers = f"FlashAttention-3: {'fa3_fwd_interface' if fa3_func else 'not installed (n/a cells)'}"
    print(peers)
    extra = "" if args.only_decode else (
        "varlen (ms; TFLOP/s count causal pairs exactly):\n"
        + varlen_table(dtype, device, dsv4, args, gemm) + "\n\nmerge_attn_states:\n"
        + merge_table(dtype, device, dsv4, args, copy_gbs))

    def status(body: str, note: str = "") -> None:  # --status-out
        note = ", ".join(n for n in ("quick" if args.quick else "", note) if n)
        common.write_status(args.status_out, common.status_block(
            "bench_fmha", body, gemm=gemm, copy_gbs=copy_gbs, device=device, dtype=dtype,
            note=note))

    if args.only_varlen:
        print()
        print(extra)
        status("\n".join([peers, "", "```", extra, "```"]), "varlen and merge only")
        return 0

    rows = []
    shapes = sweep(args.quick)
    if args.only_decode:
        shapes = [s for s in shapes if s.sq == 1]
    for i, s in enumerate(shapes, 1):
        print(f"[{i}/{len(shapes)}] B={s.b} Sq={s.sq} Sk={s.sk} H={s.hq}/{s.hkv} D={s.d} "
              f"causal={s.causal}", flush=True)
        row = measure(s, dtype, device, dsv4, args)
        print(f"    path={row.path} check={row.check} "
              + " ".join(f"{n}={_cell(row, n, dtype)}" for n in ["dsv4"] + SDPA_NAMES),
              flush=True)
        rows.append(row)
        torch.cuda.empty_cache()

    units = (f"cells: TFLOP/s of {dname} forward attention (causal counted as half); "
             "decode cells add GB/s of K + V read; ratios are dsv4 throughput / peer's; "
             f"check: max abs(dsv4 - SDPA) on out, FAIL above {CHECK_TOL.get(dtype, 5e-2):g}")
    table_md = build_table(rows, dtype, gemm, copy_gbs, markdown=True)
    md = "\n".join([header, "", ceilings, "", units, "", table_md, "", "```", extra, "```"])
    status("\n".join([peers, "", units, "", table_md]
                      + (["", "```", extra, "```"] if extra else [])),
           "decode rows only" if args.only_decode else "")

    os.makedirs(args.out, exist_ok=True)
    stem = f"fmha_{dname}" + ("_quick" if args.quick else "") + ("_decode" if args.only_decode else "")
    if not args.only_decode:
        plot(rows, os.path.join(args.out, stem + ".png"),
             f"dsv4 fmha vs SDPA, {dname} | {common.device_name(device)} | "
             f"GEMM {gemm:.0f} TFLOP/s | {common.today()}")
    with open(os.path.join(args.out, stem + ".md"), "w", encoding="utf-8") as f:
        f.write(md + "\n")

    failed = [r for r in rows if r.failed]
    print()
    print(header)
    print(ceilings)
    print(units)
    print()
    print(build_table(rows, dtype, gemm, copy_gbs, markdown=False))
    print()
    print(extra)
    if failed:
        print(f"\n{len(failed)} shape(s) FAILED the spot check against SDPA")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
