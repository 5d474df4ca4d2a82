"""python -m dsv4_attn: run every op on model-like shapes and report path, parity and time.

DeepSeek-V4-like attention: Hq = 64 or 128 query heads over one shared KV head of width 512
(K and V are the same tensor), scale 1/sqrt(512), a causal window of 128 keys
(window_left = 127) plus per-head sinks; a chunked prefill (Sq < Sk); a non-causal pass over a
"compressed" KV segment; the window and compressed passes merged by merge_attn_states; and a
CSA decode step read from the paged FP8 caches (dsv4_attention_paged).
Qwen3-Next-like linear attention: chunk_gated_delta_rule and chunk_simple_gla with H = 16
qk-heads, HV = 32 v-heads, K = V = 128, an initial state and the final state.

Parity is measured against SDPA in fp32 with an explicit boolean mask where SDPA can express
the call, and against the float64 oracles of dsv4_attn.reference where it cannot (sinks,
merged segments, linear attention); the oracles run on a slice of heads to stay fast.
Exit status 1 when any relative RMS error exceeds the tolerance.
"""
import argparse
import math
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable, List, Optional

import torch
import torch.nn.functional as F

import dsv4_attn as dsv4
from dsv4_attn import reference

REL_RMS_TOL = 2e-2     # bf16 outputs sit near 3e-3; a broken kernel lands far above
ORACLE_Q_HEADS = 8     # fmha oracle: first 8 query heads (they share the single KV head)
ORACLE_ROWS = 16       # dsv4_attention oracle: the last 16 queries, all heads


@dataclass
class Sizes:
    layer: int        # Sq = Skv of the dsv4_attention layers (V4-Flash: 4096)
    topk: int         # K of the CSA layer (V4-Flash: 512)
    seq: int          # Sq = Sk of the windowed prefill
    chunk_q: int      # Sq of the chunked prefill ...
    chunk_k: int      # ... against this many keys
    compressed: int   # keys in the compressed KV segment
    tokens: int       # T of the linear-attention ops
    warmup: int
    rep: int


def pick_sizes(device: torch.device, quick: bool) -> Sizes:
    if quick:
        return Sizes(layer=256, topk=32, seq=128, chunk_q=64, chunk_k=256, compressed=128,
                     tokens=128, warmup=1, rep=2)
    if device.type == "cuda":
        return Sizes(layer=4096, topk=512, seq=1024, chunk_q=128, chunk_k=4096, compressed=512,
                     tokens=4096, warmup=2, rep=5)
    return Sizes(layer=512, topk=128, seq=256, chunk_q=128, chunk_k=512, compressed=512,
                 tokens=512, warmup=1, rep=3)


@dataclass
class Row:
    case: str
    path: str
    against: str
    rel_rms: float
    max_abs: float
    ours_ms: Optional[float] = None
    sdpa_ms: Optional[float] = None

    @property
    def ok(self) -> bool:
        return self.rel_rms <= REL_RMS_TOL  # False for NaN


# ----------------------------------------------------------------------------- helpers


def time_ms(fn: Callable[[], object], device: torch.device, warmup: int, rep: int) -> float:
    """Median time of one call in ms: CUDA events on GPU, perf_counter on CPU."""
    for _ in range(warmup):
        fn()
    if device.type != "cuda":
        times = []
        for _ in range(rep):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)
    torch.cuda.synchronize(device)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(rep)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize(device)
    return statistics.median(s.elapsed_time(e) for s, e in events)


def errors(ours: torch.Tensor, ref: torch.Tensor):
    """(relative RMS error, max abs error) of ours against ref, computed in float64 on CPU."""
    d = ours.detach().to("cpu", torch.float64)
    r = ref.detach().to("cpu", torch.float64)
    diff = d - r
    rel = (diff.norm() / r.norm().clamp_min(1e-300)).item()
    return rel, diff.abs().max().item()


def window_mask(sq: int, sk: int, window_left: int, device) -> torch.Tensor:
    """(Sq, Sk) bool, True = visible: causal, bottom-right aligned, window_left keys back."""
    p = torch.arange(sq, device=device).view(sq, 1) + (sk - sq)
    j = torch.arange(sk, device=device).view(1, sk)
    return (j <= p) & (j >= p - window_left)


def sdpa(q, k, v, *, scale, mask=None, fp32=False):
    """torch SDPA on (B, S, H, D) tensors with an explicit mask; returns (B, Sq, Hq, Dv)."""
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    if fp32:
        qt, kt, vt = qt.float(), kt.float(), vt.float()
    gqa = {"enable_gqa": True} if q.shape[2] != k.shape[2] else {}
    out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, scale=scale, **gqa)
    return out.transpose(1, 2)


def randn(*shape, dtype, device):
    return torch.randn(*shape, device=device, dtype=torch.float32).to(dtype)


# ----------------------------------------------------------------------------- DeepSeek-V4-like


def v4_inputs(b, sq, sk, hq, device, dtype):
    d = 512
    q = randn(b, sq, hq, d, dtype=dtype, device=device)
    kv = randn(b, sk, 1, d, dtype=dtype, device=device)  # K = V: one tensor, one KV head
    # Sinks near e^3 carry a few percent to most of each row's weight (a 128-key window sums
    # to ~200), so a kernel that dropped them would fail the parity check.
    sinks = torch.randn(hq, device=device, dtype=torch.float32) + 3.0
    return q, kv, sinks, 1.0 / math.sqrt(d)


def case_window(name, b, s_q, s_k, hq, sinks_on, sz, device, dtype) -> Row:
    """Causal sliding window (128 keys) over K = V, with or without sinks."""
    q, kv, sinks, scale = v4_inputs(b, s_q, s_k, hq, device, dtype)
    sinks = sinks if sinks_on else None
    kw = dict(scale=scale, causal=True, window_left=127, sinks=sinks)
    path = dsv4.fmha_path(q, kv, kv, causal=True, window_left=127, sinks=sinks)
    out = dsv4.fmha(q, kv, kv, **kw)
    mask = window_mask(s_q, s_k, 127, device)
    if sinks_on:
        h = min(ORACLE_Q_HEADS, hq)
        ref, _ = reference.attention(q[:, :, :h], kv, kv, scale=scale, causal=True,
                                     window_left=127, sinks=sinks[:h])
        rel, mx = errors(out[:, :, :h], ref)
        against = f"oracle f64 heads 0-{h - 1}"
    else:
        rel, mx = errors(out, sdpa(q, kv, kv, scale=scale, mask=mask, fp32=True))
        against = "SDPA fp32 + mask"
    row = Row(name, path, against, rel, mx)
    row.ours_ms = time_ms(lambda: dsv4.fmha(q, kv, kv, **kw), device, sz.warmup, sz.rep)
    row.sdpa_ms = time_ms(lambda: sdpa(q, kv, kv, scale=scale, mask=mask), device,
                          sz.warmup, sz.rep)
    return row


def case_compressed(name, b, s_q, n_keys, hq, sz, device, dtype) -> Row:
    """Non-causal attention over a short compressed KV segment, no sinks."""
    q, kv, _, scale = v4_inputs(b, s_q, n_keys, hq, device, dtype)
    path = dsv4.fmha_path(q, kv, kv)
    out = dsv4.fmha(q, kv, kv, scale=scale)
    rel, mx = errors(out, sdpa(q, kv, kv, scale=scale, fp32=True))
    row = Row(name, path, "SDPA fp32", rel, mx)
    row.ours_ms = time_ms(lambda: dsv4.fmha(q, kv, kv, scale=scale), device, sz.warmup, sz.rep)
    row.sdpa_ms = time_ms(lambda: sdpa(q, kv, kv, scale=scale), device, sz.warmup, sz.rep)
    return row


def case_merge(name, b, s, n_keys, hq, sz, device, dtype) -> Row:
    """Window segment (causal, sinks) and compressed segment (non-causal) merged by lse."""
    q, kv_win, sinks, scale = v4_inputs(b, s, s, hq, device, dtype)
    kv_cmp = randn(b, n_keys, 1, 512, dtype=dtype, device=device)
    win = dict(scale=scale, causal=True, window_left=127, sinks=sinks, return_lse=True)

    def ours():
        out_w, lse_w = dsv4.fmha(q, kv_win, kv_win, **win)
        out_c, lse_c = dsv4.fmha(q, kv_cmp, kv_cmp, scale=scale, return_lse=True)
        return dsv4.merge_attn_states(out_w, lse_w, out_c, lse_c)[0]

    paths = {dsv4.fmha_path(q, kv_win, kv_win, causal=True, window_left=127, sinks=sinks),
             dsv4.fmha_path(q, kv_cmp, kv_cmp)}
    out = ours()
    h = min(ORACLE_Q_HEADS, hq)
    ref_w = reference.attention(q[:, :, :h], kv_win, kv_win, scale=scale, causal=True,
                                window_left=127, sinks=sinks[:h])
    ref_c = reference.attention(q[:, :, :h], kv_cmp, kv_cmp, scale=scale)
    ref, _ = reference.merge_attn_states(*ref_w, *ref_c)
    rel, mx = errors(out[:, :, :h], ref)
    row = Row(name, "+".join(sorted(paths)), f"oracle f64 heads 0-{h - 1}", rel, mx)
    row.ours_ms = time_ms(ours, device, sz.warmup, sz.rep)
    # SDPA peer: one call over the concatenated keys [compressed | window] with a mask.
    kv_all = torch.cat([kv_cmp, kv_win], dim=1)
    mask = torch.cat([torch.ones(s, n_keys, dtype=torch.bool, device=device),
                      window_mask(s, s, 127, device)], dim=1)
    row.sdpa_ms = time_ms(lambda: sdpa(q, kv_all, kv_all, scale=scale, mask=mask), device,
                          sz.warmup, sz.rep)
    return row


def case_layer(kind, sz, device, dtype) -> Row:
    """One DeepSeek-V4-Flash attention layer through dsv4_attention: Hq = 64, D = 512, a
    128-token window and sinks; CSA adds the top-K of a 4x compressed KV, HCA every closed row
    of a 128x compressed KV. Parity: the float64 oracle on the last ORACLE_ROWS queries (their
    positions do not depend on how many queries come before). SDPA peer: one masked call over
    the same keys (window rows, then compressed rows) with the layer's visibility as a mask."""
    s, hq, d = sz.layer, 64, 512
    q, kv, sinks, scale = v4_inputs(1, s, s, hq, device, dtype)
    kv = kv[:, :, 0]  # (B, Skv, D)
    kw = dict(sinks=sinks, window=128, scale=scale)
    ratio = {"sliding": 0, "CSA": 4, "HCA": 128}[kind]
    if ratio:
        kw.update(compressed_kv=randn(1, s // ratio, d, dtype=dtype, device=device),
                  compress_ratio=ratio)
    if kind == "CSA":
        # An indexer's pick: K distinct closed rows per query where it has that many, else -1.
        t = torch.arange(s, device=device).view(s, 1)
        closed = (t + 1) // ratio
        pick = torch.rand(s, s // ratio, device=device).masked_fill(
            torch.arange(s // ratio, device=device).view(1, -1) >= closed, -1.0)
        idx = pick.topk(min(sz.topk, s // ratio), dim=-1).indices
        kw["topk_indices"] = torch.where(idx < closed, idx, -1).to(torch.int32).unsqueeze(0)
    path = dsv4.dsv4_attention_path(q, kv, **kw)
    out = dsv4.dsv4_attention(q, kv, **kw)
    m = min(ORACLE_ROWS, s)
    last = {k: (v[:, -m:] if k == "topk_indices" else v) for k, v in kw.items()}
    ref, _ = reference.dsv4_attention(q[:, -m:], kv, **last)
    rel, mx = errors(out[:, -m:], ref)
    n_c = s // ratio if ratio else 0
    label = {"sliding": "sliding", "CSA": f"CSA r=4 K={kw.get('topk_indices', q).shape[-1]}",
             "HCA": "HCA r=128"}[kind]
    row = Row(f"v4 layer {label} S={s} Hq={hq} D={d} Sc={n_c}", path,
              f"oracle f64 last {m} queries", rel, mx)
    row.ours_ms = time_ms(lambda: dsv4.dsv4_attention(q, kv, **kw), device, sz.warmup, sz.rep)
    # The dense-mask peer: [window rows | compressed rows] keys, visibility as a boolean mask.
    t = torch.arange(s, device=device).view(s, 1)
    mask = window_mask(s, s, 127, device)
    keys = kv
    if ratio:
        w = torch.arange(n_c, device=device).view(1, n_c)
        visible = w < (t + 1) // ratio
        if kind == "CSA":
            listed = torch.zeros(s, n_c + 1, dtype=torch.bool, device=device)
            sel = kw["topk_indices"][0].long()
            listed.scatter_(1, torch.where(sel >= 0, sel, n_c), True)
            visible = visible & listed[:, :n_c]
        mask = torch.cat([mask, visible], dim=1)
        keys = torch.cat([kv, kw["compressed_kv"]], dim=1)
    keys = keys.unsqueeze(2)
    row.sdpa_ms = time_ms(lambda: sdpa(q, keys, keys, scale=scale, mask=mask), device,
                          sz.warmup, sz.rep)
    return row


def case_paged_decode(sz, device, dtype) -> Row:
    """A DeepSeek-V4 CSA decode step from the paged FP8 caches (dsv4_attention_paged): B tokens,
    Hq = 64, each with a window list of 128 and a top-K list over its own pages, the sink.
    Parity: the float64 oracle (which decodes the cache bytes itself) on the first 2 tokens."""
    b, hq, w, k, p = (64 if device.type == "cuda" else 8), 64, 128, sz.topk, 64

    def cache(rows):
        blocks = (rows + p - 1) // p
        stride = (p * 584 + 575) // 576 * 576
        c = torch.zeros(blocks * stride, dtype=torch.uint8, device=device).as_strided(
            (blocks, p, 1, 584), (stride, 584, 584, 1))
        dsv4.kv_cache_insert_fp8(randn(blocks * p, 512, dtype=dtype, device=device), c,
                                 torch.arange(blocks * p, device=device))
        return c
    window_cache, c_cache = cache(b * w), cache(b * 4 * k)
    q = randn(b, hq, 512, dtype=dtype, device=device)
    ws = torch.arange(b * w, device=device, dtype=torch.int32).view(b, w)
    cs = torch.stack([torch.randperm(4 * k, device=device)[:k] + i * 4 * k for i in range(b)])
    kw = dict(compressed_cache=c_cache, compressed_slots=cs.to(torch.int32),
              sinks=randn(hq, dtype=torch.float32, device=device), scale=512 ** -0.5)
    path = dsv4.dsv4_attention_paged_path(q, window_cache, ws, **kw)
    out, _ = dsv4.dsv4_attention_paged(q, window_cache, ws, **kw)
    m = 2
    first = dict(kw, compressed_slots=kw["compressed_slots"][:m])
    ref, _ = reference.dsv4_attention_paged(q[:m], window_cache, ws[:m], **first)
    rel, mx = errors(out[:m], ref)
    row = Row(f"v4 paged FP8 decode B={b} Hq={hq} window {w} + top-{k}", path,
              f"oracle f64 first {m} tokens", rel, mx)
    row.ours_ms = time_ms(lambda: dsv4.dsv4_attention_paged(q, window_cache, ws, **kw), device,
                          sz.warmup, sz.rep)
    return row


def case_indexer(sz, device, dtype) -> Row:
    """DeepSeek-V4's lightning indexer (dsv4_indexer_topk) on a fresh prompt of sz.layer tokens:
    64 heads x 128, top-K of the closed rows of a 4x compressed KV. Parity: the float64 score of
    the row picked at each rank against the oracle's best score at that rank (near-equal scores
    may swap ranks) on the last 8 queries, which see the most rows."""
    s, h, k = sz.layer, 64, sz.topk
    q, keys = randn(1, s, h, 128, dtype=dtype, device=device), randn(1, s // 4, 128, dtype=dtype,
                                                                       device=device)
    w = randn(1, s, h, dtype=torch.float32, device=device)
    pos = torch.arange(s, device=device)[None]
    kw = dict(topk=k, compress_ratio=4)
    path = dsv4.dsv4_indexer_topk_path(q, keys, w, pos, **kw)
    got = dsv4.dsv4_indexer_topk(q, keys, w, pos, **kw)[0, -8:].long().cpu()
    score = reference.indexer_scores(q[0, -8:].cpu(), keys[0].cpu(), w[0, -8:].cpu(),
                                     pos[0, -8:].cpu(), 4)
    best = score.sort(dim=1, descending=True).values[:, :k]
    chosen = score.gather(1, got.clamp(min=0)).masked_fill(got < 0, -math.inf)
    listed = best > -math.inf  # ranks past the closed rows: both must be -1 / -inf there
    rel, mx = errors(chosen[listed], best[listed])
    if not torch.equal(chosen > -math.inf, listed):
        rel = mx = math.inf
    row = Row(f"v4 indexer S={s} H={h} D=128 top-{k}", path, "oracle f64 score per rank", rel,
              mx)
    row.ours_ms = time_ms(lambda: dsv4.dsv4_indexer_topk(q, keys, w, pos, **kw), device,
                          sz.warmup, sz.rep)
    return row


# ----------------------------------------------------------------------------- Qwen3-Next-like


def linear_inputs(t, device, dtype, h=16, hv=32, dk=128, dv=128):
    q = F.normalize(randn(1, t, h, dk, dtype=torch.float32, device=device), dim=-1).to(dtype)
    k = F.normalize(randn(1, t, h, dk, dtype=torch.float32, device=device), dim=-1).to(dtype)
    v = randn(1, t, hv, dv, dtype=dtype, device=device)
    # Log decay < 0 at a per-head rate from 1e-3 (memory of ~1000 tokens, so the initial
    # state and every chunk boundary matter) to 1e-1 (~10 tokens).
    rate = torch.logspace(-3, -1, hv, device=device)
    g = -F.softplus(torch.randn(1, t, hv, device=device)) * rate
    beta = torch.sigmoid(torch.randn(1, t, hv, device=device))
    h0 = torch.randn(1, hv, dk, dv, device=device)
    return q, k, v, g, beta, h0


def case_linear(rule, sz, device, dtype) -> List[Row]:
    q, k, v, g, beta, h0 = linear_inputs(sz.tokens, device, dtype)
    scale = q.shape[-1] ** -0.5
    kw = dict(scale=scale, initial_state=h0, output_final_state=True)
    if rule == "gdr":
        name = "chunk_gated_delta_rule"
        ours = lambda: dsv4.chunk_gated_delta_rule(q, k, v, g, beta, **kw)  # noqa: E731
    else:
        name = "chunk_simple_gla"
        ours = lambda: dsv4.chunk_simple_gla(q, k, v, g, **kw)  # noqa: E731
    path = (dsv4.chunk_gated_delta_rule_path(q, k, v, g, beta, **kw) if rule == "gdr"
            else dsv4.chunk_simple_gla_path(q, k, v, g, **kw))
    o, final = ours()

    # The oracle runs on the first and last qk-head and the v-heads that read them (v-head j
    # reads qk-head j // G), i.e. the slowest- and fastest-decaying heads.
    h, hv = q.shape[2], v.shape[2]
    grp = hv // h
    qk_sel = torch.tensor([0, h - 1], device=device)
    v_sel = torch.tensor([j for i in (0, h - 1) for j in range(i * grp, (i + 1) * grp)],
                         device=device)
    args = (q[:, :, qk_sel], k[:, :, qk_sel], v[:, :, v_sel], g[:, :, v_sel])
    if rule == "gdr":
        ref_o, ref_s = reference.gated_delta_rule(*args, beta[:, :, v_sel], scale=scale,
                                                  initial_state=h0[:, v_sel])
    else:
        ref_o, ref_s = reference.simple_gla(*args, scale=scale, initial_state=h0[:, v_sel])
    against = "oracle f64 v-heads " + ",".join(str(j) for j in v_sel.tolist())
    rel_o, mx_o = errors(o[:, :, v_sel], ref_o)
    rel_s, mx_s = errors(final[:, v_sel], ref_s)
    row = Row(f"{name} o", path, against, rel_o, mx_o)
    row.ours_ms = time_ms(ours, device, sz.warmup, sz.rep)
    return [row, Row(f"{name} final state", path, against, rel_s, mx_s)]


# ----------------------------------------------------------------------------- main


def print_table(rows: List[Row]) -> None:
    headers = ["case", "path", "parity vs", "rel RMS", "max abs", "dsv4 ms", "SDPA ms", "status"]
    cells = [headers]
    for r in rows:
        cells.append([r.case, r.path, r.against, f"{r.rel_rms:.1e}", f"{r.max_abs:.1e}",
                      "-" if r.ours_ms is None else f"{r.ours_ms:.3f}",
                      "-" if r.sdpa_ms is None else f"{r.sdpa_ms:.3f}",
                      "ok" if r.ok else "CHECK"])
    widths = [max(len(c[i]) for c in cells) for i in range(len(headers))]
    for i, c in enumerate(cells):
        print("  ".join(x.ljust(w) for x, w in zip(c, widths)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m dsv4_attn", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small shapes: a fast smoke run")
    p.add_argument("--device", default=None,
                   help="cuda or cpu (default: cuda when available, else cpu)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    dtype = torch.bfloat16
    sz = pick_sizes(device, args.quick)
    torch.manual_seed(args.seed)

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    info = dsv4.build_info()
    print(f"dsv4_attn {dsv4.__version__} build: CUDA kernels "
          f"{'yes (' + ','.join(info['cuda_archs']) + ')' if info['cuda_kernels'] else 'no'}, "
          f"built with torch {info['torch_version']}, CUDA toolkit {info['cuda_toolkit'] or '-'}")
    print(f"device {name} | torch {torch.__version__} | CUDA {torch.version.cuda or 'none'} | "
          "inputs bf16")

    d4 = "Hkv=1 D=512 K=V"
    cases = [
        lambda: case_layer("sliding", sz, device, dtype),
        lambda: case_layer("CSA", sz, device, dtype),
        lambda: case_layer("HCA", sz, device, dtype),
        lambda: case_window(f"v4 window+sinks S={sz.seq} Hq=64 {d4}", 1, sz.seq, sz.seq, 64,
                            True, sz, device, dtype),
        lambda: case_window(f"v4 window+sinks S={sz.seq} Hq=128 {d4}", 1, sz.seq, sz.seq, 128,
                            True, sz, device, dtype),
        lambda: case_window(f"v4 window S={sz.seq} Hq=64 {d4}", 1, sz.seq, sz.seq, 64,
                            False, sz, device, dtype),
        lambda: case_window(f"v4 prefill window+sinks Sq={sz.chunk_q} Sk={sz.chunk_k} Hq=64",
                            1, sz.chunk_q, sz.chunk_k, 64, True, sz, device, dtype),
        lambda: case_compressed(f"v4 compressed Sq={sz.seq} Sk={sz.compressed} Hq=64", 1,
                                sz.seq, sz.compressed, 64, sz, device, dtype),
        lambda: case_merge(f"v4 merge window+compressed S={sz.seq} Hq=64", 1, sz.seq,
                           sz.compressed, 64, sz, device, dtype),
        lambda: case_paged_decode(sz, device, dtype),
        lambda: case_indexer(sz, device, dtype),
        lambda: case_linear("gdr", sz, device, dtype),
        lambda: case_linear("gla", sz, device, dtype),
    ]
    rows: List[Row] = []
    t0 = time.perf_counter()
    for case in cases:
        got = case()
        for r in got if isinstance(got, list) else [got]:
            rows.append(r)
            print(f"  {r.case}: path={r.path} rel_rms={r.rel_rms:.1e}", flush=True)
    print(f"\nshapes: linear attention B=1 T={sz.tokens} H=16 HV=32 K=V=128 | "
          f"window_left=127, scale=1/sqrt(512)")
    print("SDPA ms: same call with an explicit boolean mask; SDPA has no sinks, so the sink rows "
          "time it without them, and the merge row times one call over both segments' keys.")
    print(f"tolerance: rel RMS <= {REL_RMS_TOL:g} | total {time.perf_counter() - t0:.1f} s\n")
    print_table(rows)
    bad = [r for r in rows if not r.ok]
    if bad:
        print(f"\n{len(bad)} case(s) above tolerance: " + ", ".join(r.case for r in bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
