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

A second table sets dsv4_attention against FlashMLA's sm90 sparse prefill (an optional peer:
`source .peers/mla/env.sh` sets DSV4_PEER_FLASHMLA, see ../shared/peers) on issue 44's
DeepSeek-V4 rows, S = 8192 query tokens: CSA top-512/1024 and HCA layers, fresh prompts and 8k
chunks at long context, sliding-only layers, and tensor-parallel head counts (FlashMLA run with
its heads padded to 64, as vLLM does). FlashMLA is called the way vLLM calls it: one index list
per query token into one KV buffer (the compressed rows, then the raw tokens), [listed or closed
compressed rows | window rows], the valid entries first, padded with -1 to a multiple of 128,
with topk_length and the sink. Its output is checked against the float64 oracle on a small
case first. Without the peer the table prints "n/a" in its columns. --no-vs-flashmla skips it.

A third table times dsv4_attention_paged's decode steps from the paged FP8 caches (issue 45's
rows, 32k context) beside FlashMLA's sparse FP8 decode on the same pages (its plan reused, heads
padded to 64) and the step's floor, each step timed as one of 20 in a CUDA graph, as an
engine's decode graph runs them; a fourth its prefill rows (S = 8192 at 64k context) beside
FlashMLA's bf16 sparse prefill and our bf16 dsv4_attention. --only-paged-decode prints only
those two tables. The paged FP8 cache ops (kv_cache_insert_fp8 and kv_cache_gather_fp8 on 64k
rows) follow, each call one of 20 in a CUDA graph, their bytes against the copy rate.

A last table times dsv4_indexer_topk (the lightning indexer) on fresh prompts of 8k to 128k
tokens in both modes: exact (bf16 q and k) against the bf16 GEMM rate, serving (float8_e4m3 q
and k with row scales) against the same-run FP8 GEMM rate (torch._scaled_mm); then a whole CSA
layer at 64k with each (indexer, then dsv4_attention on its picks) against the sum of the two
floors; and dsv4_indexer_topk_paged decode steps over a paged FP8 indexer cache, the cache
bytes read against the same-run copy rate. An exact small case of each mode is checked against
the float64 oracle first. --only-indexer prints only it.
"""
import argparse
import contextlib
import math
import os
import statistics
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
WINDOW = 128


def load_flashmla():
    """FlashMLA's sm90 sparse prefill (torch.ops._flashmla_C.sparse_prefill_fwd), or None."""
    path = os.environ.get("DSV4_PEER_FLASHMLA")
    if not path:
        return None
    try:
        torch.ops.load_library(path)
        return torch.ops._flashmla_C.sparse_prefill_fwd
    except (OSError, RuntimeError, AttributeError) as e:
        print(f"bench_dsv4: FlashMLA did not load from {path}: {e}")
        return None


def layer_inputs(kind, sq, context, hq, topk, device, dtype):
    """A DeepSeek-V4 layer's inputs for the last sq of `context` tokens (one sequence): q, kv,
    dsv4_attention's keyword arguments, each query's position and its closed compressed rows."""
    ratio = {"sliding": 0, "CSA": 4, "HCA": 128}[kind]
    q = common.randn((1, sq, hq, D), dtype, device)
    kv = common.randn((1, context, D), dtype, device)
    kw = dict(sinks=torch.randn(hq, device=device), window=WINDOW)
    t = torch.arange(context - sq, context, device=device)
    closed = torch.zeros_like(t)
    if ratio:
        sc = context // ratio
        kw.update(compressed_kv=common.randn((1, sc, D), dtype, device), compress_ratio=ratio)
        closed = torch.clamp(torch.div(t + 1, ratio, rounding_mode="floor"), max=sc)
        if kind == "CSA":  # topk distinct closed rows per query (fewer: -1 after them)
            idx = torch.empty(sq, topk, dtype=torch.int32, device=device)
            for i in range(0, sq, 1024):
                score = torch.rand(min(1024, sq - i), sc, device=device)
                score.masked_fill_(torch.arange(sc, device=device) >= closed[i:i + 1024, None],
                                   -math.inf)
                val, top = score.topk(min(topk, sc), dim=1)
                top = torch.where(val > -math.inf, top, -1).int()
                idx[i:i + 1024] = torch.nn.functional.pad(top, (0, topk - top.shape[1]), value=-1)
            kw["topk_indices"] = idx[None]
    return q, kv, kw, t, closed


def flashmla_inputs(kind, q, kv, kw, t, closed, heads):
    """FlashMLA's sparse prefill arguments for the same layer, q's heads zero-padded to `heads`:
    (q, kv_all, indices, sinks, topk_length) with kv_all the compressed rows then the raw ones."""
    comp = kw.get("compressed_kv")
    sc = comp.shape[1] if comp is not None else 0
    kv_all = (torch.cat([comp[0], kv[0]]) if comp is not None else kv[0]).unsqueeze(1)
    win = t[:, None] - torch.arange(WINDOW - 1, -1, -1, device=t.device)[None]
    parts = [torch.where(win >= 0, win + sc, -1)]
    if kind == "CSA":
        parts.insert(0, kw["topk_indices"][0].long())
    elif kind == "HCA":
        rows = torch.arange(sc, device=t.device)[None].expand(t.shape[0], sc)
        parts.insert(0, torch.where(rows < closed[:, None], rows, -1))
    idx = torch.cat(parts, dim=1)
    valid = idx >= 0
    order = torch.sort((~valid).int(), dim=1, stable=True).indices  # valid entries first
    idx = torch.gather(idx, 1, order)
    width = (idx.shape[1] + 127) // 128 * 128
    idx = torch.nn.functional.pad(idx, (0, width - idx.shape[1]), value=-1).int()
    hq = q.shape[2]
    qf = q[0] if heads == hq else torch.nn.functional.pad(q[0], (0, 0, 0, heads - hq))
    sinks = kw["sinks"] if heads == hq else torch.nn.functional.pad(kw["sinks"], (0, heads - hq))
    return qf, kv_all, idx[:, None].contiguous(), sinks, valid.sum(1).int()


def check_flashmla(flashmla, device, dtype):
    """Both kernels against the float64 oracle on a small CSA case: max |error|."""
    from dsv4_attn import reference
    q, kv, kw, t, closed = layer_inputs("CSA", 96, 640, 64, 128, device, dtype)
    ref, _ = reference.dsv4_attention(q, kv, **kw)
    ours = dsv4_attn.dsv4_attention(q, kv, **kw)
    qf, kv_all, idx, sinks, length = flashmla_inputs("CSA", q, kv, kw, t, closed, 64)
    peer = flashmla(qf, kv_all, idx, SCALE, D, sinks, length, None)[0]
    err = lambda x: (x.double().cpu() - ref[0]).abs().max().item()  # noqa: E731
    return err(ours[0]), err(peer)


ROUNDS_VS_FLASHMLA = 3  # interleaved timing rounds per layer; each time is their median


def rows_vs_flashmla(flashmla, kind, topk, context, hq, ceil, device, dtype, sq=8192):
    """One issue-44 row: dsv4_attention and FlashMLA (heads padded to 64) on the same layer.
    CSA at 16 or fewer heads gives two rows, the planned narrow form's and the 64-row tiles'
    (DSV4_MQA512_NARROW=0). Each time is the median of ROUNDS_VS_FLASHMLA rounds that take
    every form and the peer in turn, so that a drift of the clocks during the run falls on all
    of them alike."""
    q, kv, kw, t, closed = layer_inputs(kind, sq, context, hq, topk, device, dtype)
    forms = [("", None)]
    if kind == "CSA" and hq <= 16:
        forms = [(" (narrow)", "1"), (" (64-row tiles)", "0")]
    heads = max(hq, 64)
    peer_call = None
    if flashmla is not None:
        args = flashmla_inputs(kind, q, kv, kw, t, closed, heads)
        peer_call = lambda: flashmla(args[0], args[1], args[2], SCALE, D, args[3],  # noqa: E731
                                     args[4], None)
    paths, ours, peer = [], [[] for _ in forms], []
    for i, (label, narrow) in enumerate(forms):
        with _narrow_form(narrow):
            plan = dsv4_attn.launch_plan("dsv4_attention", q, kv, **kw)
            assert narrow is None or plan.endswith(" narrow=16") == (narrow == "1"), plan
            paths.append(dsv4_attn.dsv4_attention_path(q, kv, **kw) + label)
    for _ in range(ROUNDS_VS_FLASHMLA):
        for i, (label, narrow) in enumerate(forms):
            with _narrow_form(narrow):
                ours[i].append(common.bench_ms(lambda: dsv4_attn.dsv4_attention(q, kv, **kw),
                                               warmup=2, rep=10, budget_ms=None))
        if peer_call is not None:
            peer.append(common.bench_ms(peer_call, warmup=2, rep=10, budget_ms=None))
    peer_ms = statistics.median(peer) if peer else None
    pairs = float(torch.clamp(t + 1, max=WINDOW).sum())
    if kind == "CSA":
        pairs += float((kw["topk_indices"][0] >= 0).sum())
    elif kind == "HCA":
        pairs += float(closed.sum())
    useful = 2.0 * hq * pairs * 2 * D  # QK^T and PV
    what = {"CSA": f"CSA top-{topk}", "HCA": "HCA", "sliding": "sliding only"}[kind]
    where = "fresh prompt" if context == sq else f"8k chunk at {context // 1024}k context"
    rows = []
    for path, times in zip(paths, ours):
        ms = statistics.median(times)
        rows.append([f"{what}, {where}", str(hq), path, f"{ms:.3f}",
                     f"{peer_ms:.3f}" + (f" (padded to {heads})" if heads != hq else "")
                     if peer_ms else "n/a",
                     f"{peer_ms / ms:.2f}x" if peer_ms else "n/a",
                     f"{useful / ms / 1e9 / ceil['gemm'] * 100:.0f}%",
                     f"{useful / peer_ms / 1e9 / ceil['gemm'] * 100:.0f}%" if peer_ms else "n/a"])
    return rows


def _narrow_form(narrow):
    """DSV4_MQA512_NARROW=narrow for the block, or nothing when None."""
    return common.env_override("DSV4_MQA512_NARROW", narrow) if narrow else contextlib.nullcontext()


def fp8_pages(rows, page, device):
    """An empty paged FP8 cache of at least `rows` slots in blocks of `page`: the
    (num_blocks, P, 1, 584) view over padded blocks that an engine allocates."""
    blocks = (rows + page - 1) // page
    stride = (page * 584 + 575) // 576 * 576
    return torch.zeros(blocks * stride, dtype=torch.uint8, device=device).as_strided(
        (blocks, page, 1, 584), (stride, 584, 584, 1))


def rows_kv_cache(ceil, device):
    """The paged FP8 cache ops on 64k rows of one engine-sized cache (pages of 64): time, the
    bytes they must move (rows read or written at 2 bytes a value, records at 584 bytes, slots),
    and that rate over the same-run copy rate. Each call is one of 20 in a CUDA graph (a lone
    call's time is the host's launch path), and the calls alternate between two sets of rows
    and slots, the two halves of one permutation of the cache's slots, so that no call finds
    the previous call's bytes in L2. Checked against the reference path first."""
    n = 65536
    cache = fp8_pages(2 * n, 64, device)
    perm = torch.randperm(2 * n, device=device)
    sets = [(torch.randn(n, D, device=device, dtype=torch.bfloat16), perm[i * n:(i + 1) * n])
            for i in range(2)]
    kv, slots = sets[0]
    dsv4_attn.kv_cache_insert_fp8(kv[:64], cache, slots[:64])
    got = dsv4_attn.kv_cache_gather_fp8(cache, slots[:64])
    with common.env_override("DSV4_DISABLE_SM90", "1"):
        want = dsv4_attn.kv_cache_gather_fp8(cache, slots[:64])
    assert torch.equal(got, want), "kv_cache_gather_fp8: the kernel differs from the reference"

    def alternating(call):
        turn = [0]

        def step():
            turn[0] ^= 1
            call(*sets[turn[0]])
        return step

    rows = []
    for name, fn, nbytes in (
            ("kv_cache_insert_fp8, 64k bf16 rows",
             alternating(lambda kv, slots: dsv4_attn.kv_cache_insert_fp8(kv, cache, slots)),
             n * (D * 2 + 584 + 8)),
            ("kv_cache_gather_fp8, 64k rows as bf16",
             alternating(lambda kv, slots: dsv4_attn.kv_cache_gather_fp8(cache, slots)),
             n * (D * 2 + 584 + 8))):
        path = (dsv4_attn.kv_cache_insert_fp8_path(kv, cache, slots) if "insert" in name
                else dsv4_attn.kv_cache_gather_fp8_path(cache, slots))
        ms = graph_step_ms(fn)
        rate = nbytes / ms / 1e6
        rows.append([name, path, f"{ms * 1000:.1f}", f"{rate:.0f}", f"{rate / ceil['copy'] * 100:.0f}%"])
    return rows


def paged_cache(rows, page, device):
    """A paged FP8 cache of at least `rows` slots (pages of `page`), every slot filled with a
    random row."""
    cache = fp8_pages(rows, page, device)
    slots = cache.shape[0] * page
    for i in range(0, slots, 65536):
        n = min(65536, slots - i)
        dsv4_attn.kv_cache_insert_fp8(torch.randn(n, D, device=device, dtype=torch.bfloat16),
                                      cache, torch.arange(i, i + n, device=device))
    return cache


def paged_decode_inputs(kind, b, hq, context, device, seed=0):
    """A decode step of b requests at `context` tokens, one query token each: the window list
    (128 slots of pages of 64) and, for CSA (top-k of a 4x compressed cache, pages of 64) and
    HCA (every closed row of a 128x one, pages of 2), the compressed list; scattered slots."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(b, hq, D, generator=g).to(device, torch.bfloat16)
    window = paged_cache(b * WINDOW, 64, device)
    perm = torch.randperm(b * WINDOW, generator=g)
    ws = perm.view(b, WINDOW).to(torch.int32).to(device)
    kw = dict(sinks=torch.randn(hq, generator=g).to(device), scale=SCALE)
    if kind != "sliding":
        ratio, page = (4, 64) if kind.startswith("CSA") else (128, 2)
        closed = context // ratio
        k = int(kind.split("-")[1]) if kind.startswith("CSA") else closed
        comp = paged_cache(b * closed, page, device)
        rows = torch.stack([torch.randperm(closed, generator=g)[:k] + i * closed for i in range(b)])
        kw.update(compressed_cache=comp, compressed_slots=rows.to(torch.int32).to(device))
    return q, window, ws, kw


def paged_decode_peer_call(decode, q, window, ws, kw, heads):
    """FlashMLA's sparse FP8 decode on the same pages (heads padded to `heads`), with the plan
    of a first call reused as vLLM does: the call to time."""
    b, hq, _ = q.shape
    qp = torch.zeros(b, 1, heads, D, dtype=q.dtype, device=q.device)
    qp[:, 0, :hq] = q
    sinks = torch.zeros(heads, device=q.device)
    sinks[:hq] = kw["sinks"]
    wl = torch.full((b,), ws.shape[1], dtype=torch.int32, device=q.device)
    comp = kw.get("compressed_cache")
    cs = kw["compressed_slots"].view(b, 1, -1) if comp is not None else None
    cl = torch.full((b,), cs.shape[-1], dtype=torch.int32, device=q.device) if comp is not None else None
    out = torch.empty_like(qp)
    res = decode(qp, window, ws.view(b, 1, -1), wl, sinks, None, None, comp, cs, cl, D, SCALE, out)
    sched, splits = res[2], res[3]
    return (lambda: decode(qp, window, ws.view(b, 1, -1), wl, sinks, sched, splits, comp, cs, cl,
                           D, SCALE, out)), res[0][:, 0, :hq]


PAGED_DECODE = [  # (layer, B, Hq): issue 45's rows, 32k context
    *[(k, b, h) for b in (64, 8) for h in (64, 128)
      for k in ("CSA-512", "CSA-1024", "HCA", "sliding")],
    *[(k, 64, h) for h in (8, 16, 32) for k in ("CSA-512", "CSA-1024", "HCA", "sliding")],
]


def graph_step_ms(step, steps=20):
    """One decode step's time, from `steps` of them back to back in one CUDA graph, as an
    engine's decode graph runs its layers (a lone call measures the host's launch path)."""
    def many():
        for _ in range(steps):
            step()
    return common.bench_ms(many, warmup=2, rep=10, cuda_graph=True) / steps


def rows_paged_decode(decode, ceil, device, quick):
    """dsv4_attention_paged decode steps from FP8 pages beside FlashMLA's sparse FP8 decode,
    with the floor: the larger of the bytes a step must read (584 per listed row, q and out)
    over the copy rate, and its useful FLOPs over the GEMM rate."""
    rows, context = [], 32768
    specs = PAGED_DECODE[:1] if quick else PAGED_DECODE
    for kind, b, hq in specs:
        q, window, ws, kw = paged_decode_inputs(kind, b, hq, context, device)
        path = dsv4_attn.dsv4_attention_paged_path(q, window, ws, **kw)
        out = torch.empty_like(q)
        ours = graph_step_ms(lambda: dsv4_attn.dsv4_attention_paged(q, window, ws, out=out, **kw))
        listed = ws.shape[1] + (kw["compressed_slots"].shape[1] if "compressed_slots" in kw else 0)
        nbytes = b * (listed * 584 + 2 * hq * D * 2)
        flops = 4.0 * b * hq * listed * D
        floor = max(nbytes / (ceil["copy"] * 1e6), flops / (ceil["gemm"] * 1e9))  # ms
        heads = max(hq, 64)
        peer = None
        if decode is not None:
            call, _ = paged_decode_peer_call(decode, q, window, ws, kw, heads)
            peer = graph_step_ms(call)
        what = {"CSA-512": "window + top-512", "CSA-1024": "window + top-1024",
                "HCA": "HCA: window + all 256 rows", "sliding": "window only"}[kind]
        rows.append([f"decode B={b}, {what}", str(hq), path, f"{ours * 1000:.1f}",
                     (f"{peer * 1000:.1f}" + (f" (padded to {heads})" if heads != hq else ""))
                     if peer else "n/a", f"{peer / ours:.2f}x" if peer else "n/a",
                     f"{floor * 1000:.1f}", f"{ours / floor:.1f}x"])
    return rows


def paged_prefill_inputs(kind, hq, device):
    """The issue-45 prefill rows from FP8 pages: layer_inputs' layer (S = 8192 at 64k context)
    with its kv rows in a window cache (slot = position, pages of 64), its compressed rows in a
    compressed cache, each token's window list its 128 positions, and its compressed list the
    CSA top-k or every closed HCA row. Returns the paged call's arguments and the bf16 layer's."""
    q, kv, kw, t, closed = layer_inputs(kind, 8192, 65536, hq, 512, device, torch.bfloat16)

    def cache_of(rows):  # row i at slot i
        cache = fp8_pages(rows.shape[0], 64, device)
        dsv4_attn.kv_cache_insert_fp8(rows, cache, torch.arange(rows.shape[0], device=device))
        return cache

    ws = (t[:, None] - torch.arange(WINDOW - 1, -1, -1, device=device)[None]).int()
    comp = kw["compressed_kv"][0]
    if kind == "CSA":
        cs = kw["topk_indices"][0]
    else:
        rows = torch.arange(comp.shape[0], device=device)[None].expand(t.shape[0], -1)
        cs = torch.where(rows < closed[:, None], rows, -1).int().contiguous()
    paged = dict(sinks=kw["sinks"], scale=SCALE, compressed_cache=cache_of(comp),
                 compressed_slots=cs)
    return q[0], cache_of(kv[0]), torch.where(ws >= 0, ws, -1), paged, (q, kv, kw, t, closed)


def rows_paged_prefill(flashmla, device, quick):
    """dsv4_attention_paged on issue 45's prefill rows beside FlashMLA's bf16 sparse prefill on
    the same layer (heads padded to 64) and our bf16 dsv4_attention."""
    rows = []
    specs = [("CSA", 64), ("CSA", 128), ("HCA", 64), ("HCA", 128)]
    for kind, hq in specs[:1] if quick else specs:
        q, window, ws, kw, layer = paged_prefill_inputs(kind, hq, device)
        path = dsv4_attn.dsv4_attention_paged_path(q, window, ws, **kw)
        out = torch.empty_like(q)
        ours = common.bench_ms(lambda: dsv4_attn.dsv4_attention_paged(q, window, ws, out=out, **kw),
                               warmup=2, rep=10, budget_ms=None)
        bq, bkv, bkw, t, closed = layer
        bf16 = common.bench_ms(lambda: dsv4_attn.dsv4_attention(bq, bkv, **bkw), warmup=2, rep=10,
                               budget_ms=None)
        peer = None
        if flashmla is not None:
            a = flashmla_inputs(kind, bq, bkv, bkw, t, closed, max(hq, 64))
            peer = common.bench_ms(lambda: flashmla(a[0], a[1], a[2], SCALE, D, a[3], a[4], None),
                                   warmup=2, rep=10, budget_ms=None)
        what = "CSA top-512" if kind == "CSA" else "HCA"
        rows.append([f"{what}, 8k chunk at 64k context", str(hq), path, f"{ours:.3f}",
                     f"{bf16:.3f}", f"{peer:.3f}" if peer else "n/a",
                     f"{peer / ours:.2f}x" if peer else "n/a"])
    return rows


def check_paged_decode(decode, device):
    """Ours and FlashMLA's decode on one small CSA step: max |difference| of the outputs, and
    ours against the float64 oracle on two tokens."""
    from dsv4_attn import reference
    q, window, ws, kw = paged_decode_inputs("CSA-512", 4, 64, 4096, device, seed=1)
    ours, _ = dsv4_attn.dsv4_attention_paged(q, window, ws, **kw)
    part = dict(kw, compressed_slots=kw["compressed_slots"][:2])
    want, _ = reference.dsv4_attention_paged(q[:2], window, ws[:2], **part)
    oracle = (ours[:2].double().cpu() - want).abs().max().item()
    if decode is None:
        return oracle, None
    _, peer = paged_decode_peer_call(decode, q, window, ws, kw, 64)
    return oracle, (ours.float() - peer.float()).abs().max().item()


VS_FLASHMLA = [  # (kind, topk, context, Hq): issue 44's rows, S = 8192
    *[(k, tk, ctx, h) for h in (64, 128) for k, tk, ctx in (
        ("CSA", 512, 8192), ("CSA", 1024, 8192), ("CSA", 512, 65536), ("HCA", 0, 65536),
        ("HCA", 0, 262144), ("sliding", 0, 8192))],
    *[(k, tk, 65536, h) for h in (8, 16, 32) for k, tk in (("CSA", 512), ("HCA", 0))],
]


INDEXER_HEADS, INDEXER_DIM, INDEXER_TOPK = 64, 128, 512


FP8 = torch.float8_e4m3fn


def indexer_inputs(s, device, dtype=torch.bfloat16, ints=False):
    """A fresh prompt of s tokens for the lightning indexer (V4-Flash sizes): q (1, s, 64, 128),
    the s / 4 compressed keys, the head weights and the positions 0 .. s - 1. With dtype FP8 the
    keys also get row scales (k_scale, powers of two); otherwise k_scale is None."""
    if ints:  # small integers: exact scores, so two implementations must agree on every pick
        draw = lambda *shape: torch.randint(-2, 3, shape, device=device).float()  # noqa: E731
    else:
        draw = lambda *shape: torch.randn(*shape, device=device)  # noqa: E731
    q = draw(1, s, INDEXER_HEADS, INDEXER_DIM).to(dtype)
    k = draw(1, s // 4, INDEXER_DIM).to(dtype)
    w = draw(1, s, INDEXER_HEADS)
    k_scale = (torch.exp2(torch.randint(-3, 1, (1, s // 4), device=device).float())
               if dtype == FP8 else None)
    return q, k, w, torch.arange(s, device=device)[None], k_scale


def check_indexer(device, dtype=torch.bfloat16):
    """The indexer on a small exact case against the float64 oracle: True if every pick and
    its order agree."""
    from dsv4_attn import reference
    q, k, w, pos, k_scale = indexer_inputs(256, device, dtype, ints=True)
    kw = dict(topk=INDEXER_TOPK, compress_ratio=4, scale=0.5, k_scale=k_scale)
    got = dsv4_attn.dsv4_indexer_topk(q, k, w, pos, **kw)
    kw["k_scale"] = None if k_scale is None else k_scale.cpu()
    want = reference.indexer_topk(q.cpu().float(), k.cpu().float(), w.cpu(), pos.cpu(), **kw)
    return bool(torch.equal(got.cpu(), want))


def indexer_paged_inputs(b, rows, device, ints=False):
    """A decode step of dsv4_indexer_topk_paged: b requests of `rows` compressed rows each in
    vLLM's paged FP8 indexer cache (64-row blocks of 128 float8_e4m3 values, then 64 fp32
    scales; blocks shuffled over the cache), one query per request at the last position (it
    sees every row), 64 heads of float8_e4m3 q, fp32 weights. With ints: small integers and
    power-of-two scales (exact scores)."""
    pages = (rows + 63) // 64
    blocks = b * pages
    raw = torch.empty(blocks, 64 * 132, dtype=torch.uint8, device=device)
    for i in range(0, blocks, 1024):  # bounded temporaries
        n = min(1024, blocks - i)
        v = (torch.randint(-8, 9, (n, 64 * 128), device=device).float() if ints
             else torch.randn(n, 64 * 128, device=device))
        raw[i:i + n, :64 * 128] = v.to(FP8).view(torch.uint8)
        scale = torch.exp2(torch.randint(-8, -2, (n, 64), device=device).float())
        raw[i:i + n, 64 * 128:] = scale.view(torch.uint8).view(n, 256)
    cache = raw.view(blocks, 64, 1, 132)
    table = torch.randperm(blocks, device=device).view(b, pages).int()
    draw = ((lambda *shape: torch.randint(-2, 3, shape, device=device).float()) if ints
            else (lambda *shape: torch.randn(*shape, device=device)))
    q = draw(b, 1, INDEXER_HEADS, INDEXER_DIM).to(FP8)
    w = draw(b, 1, INDEXER_HEADS)
    lens = torch.full((b,), rows, dtype=torch.int32, device=device)
    pos = (4 * lens[:, None] - 1).long()
    return q, cache, w, pos, table, lens


def check_indexer_paged(device):
    """The paged form on a small exact case against the float64 oracle: True if every pick and
    its order agree."""
    from dsv4_attn import reference
    args = indexer_paged_inputs(4, 3000, device, ints=True)
    kw = dict(topk=INDEXER_TOPK, compress_ratio=4, scale=0.5)
    got = dsv4_attn.dsv4_indexer_topk_paged(*args, **kw)
    return bool(torch.equal(got.cpu(), reference.indexer_topk_paged(*args, **kw)))


def rows_indexer_paged(ceil, device, quick):
    """dsv4_indexer_topk_paged decode steps (each one of 20 in a CUDA graph): the cache bytes
    read (132 per row) over the time, against the same run's copy rate."""
    rows = []
    for b, context in ([(64, 65536)] if quick else [(64, 65536), (64, 16384), (64, 8192),
                                                     (8, 65536)]):
        n = context // 4
        q, cache, w, pos, table, lens = indexer_paged_inputs(b, n, device)
        kw = dict(topk=INDEXER_TOPK, compress_ratio=4)
        path = dsv4_attn.dsv4_indexer_topk_paged_path(q, cache, w, pos, table, lens, **kw)
        ms = graph_step_ms(lambda: dsv4_attn.dsv4_indexer_topk_paged(q, cache, w, pos, table,
                                                                     lens, **kw))
        gbs = b * n * 132 / ms / 1e6
        rows.append([f"indexer paged FP8 decode, B = {b}, {context // 1024}k context, top-512",
                     path, f"{ms * 1000:.1f} us", f"{gbs:.0f} GB/s",
                     f"{100 * gbs / ceil['copy']:.0f}% copy",
                     "75% copy" if (b, context) == (64, 65536) else "none"])
        del q, cache, w, table
    return rows


def indexer_flops(s):
    """Useful FLOPs of a fresh prompt's indexer: 2 H D per closed (query, row) pair."""
    closed = torch.clamp(torch.div(torch.arange(s) + 1, 4, rounding_mode="floor"), max=s // 4)
    return 2.0 * INDEXER_HEADS * INDEXER_DIM * float(closed.sum())


# Issue 46's targets, as a fraction of the same-run GEMM rate of the mode's type.
INDEXER_TARGETS = {(FP8, 8192): 0.5, (FP8, 65536): 0.6, (FP8, 131072): 0.6,
                   (torch.bfloat16, 65536): 0.6}


def rows_indexer(ceil, device, quick):
    """dsv4_indexer_topk on fresh prompts in both modes: exact (bf16 q and k) against the bf16
    GEMM rate, serving (float8_e4m3 q and k, row scales) against the FP8 GEMM rate; then the
    whole CSA layer at 64k (indexer, then dsv4_attention on its picks) against the sum of the
    two floors (useful FLOPs over the same-run GEMM rate of each part's type)."""
    rows = []
    for dtype, name, ceiling in ((torch.bfloat16, "bf16", "gemm"), (FP8, "fp8", "fp8_gemm")):
        for s in ([8192] if quick else [8192, 65536, 131072]):
            q, k, w, pos, k_scale = indexer_inputs(s, device, dtype)
            kw = dict(topk=INDEXER_TOPK, compress_ratio=4, k_scale=k_scale)
            path = dsv4_attn.dsv4_indexer_topk_path(q, k, w, pos, **kw)
            ms = common.bench_ms(lambda: dsv4_attn.dsv4_indexer_topk(q, k, w, pos, **kw),
                                 warmup=1, rep=5, budget_ms=None)
            rate = indexer_flops(s) / ms / 1e9
            target = INDEXER_TARGETS.get((dtype, s))
            label = "GEMM" if ceiling == "gemm" else "FP8 GEMM"
            rows.append([f"indexer {name} scores + top-512, S = {s // 1024}k fresh prompt", path,
                         f"{ms:.2f} ms", f"{rate:.0f} TFLOP/s",
                         f"{100 * rate / ceil[ceiling]:.0f}% {label}",
                         f"{100 * target:.0f}% {label}" if target else "none"])
            del q, k, w
    if quick:
        return rows
    s = 65536
    q, kv, kw, t, closed = layer_inputs("CSA", s, s, 64, INDEXER_TOPK, device, torch.bfloat16)
    kw.pop("topk_indices")
    for dtype, name, ceiling in ((torch.bfloat16, "bf16", "gemm"), (FP8, "fp8", "fp8_gemm")):
        qi, ki, w, pos, k_scale = indexer_inputs(s, device, dtype)
        ikw = dict(topk=INDEXER_TOPK, compress_ratio=4, k_scale=k_scale)

        def layer():
            idx = dsv4_attn.dsv4_indexer_topk(qi, ki, w, pos, **ikw)
            return dsv4_attn.dsv4_attention(q, kv, topk_indices=idx, **kw)

        ms = common.bench_ms(layer, warmup=1, rep=3, budget_ms=None)
        idx = dsv4_attn.dsv4_indexer_topk(qi, ki, w, pos, **ikw)
        pairs = float(torch.clamp(t + 1, max=WINDOW).sum()) + float((idx >= 0).sum())
        floor = (indexer_flops(s) / ceil[ceiling] + 2.0 * 64 * pairs * 2 * D / ceil["gemm"]) / 1e9
        path = (dsv4_attn.dsv4_indexer_topk_path(qi, ki, w, pos, **ikw) + " + " +
                dsv4_attn.dsv4_attention_path(q, kv, topk_indices=idx, **kw))
        rows.append([f"CSA layer, S = 64k: {name} indexer + dsv4_attention (64 heads)", path,
                     f"{ms:.2f} ms", f"floor {floor:.2f} ms", f"{ms / floor:.2f}x floor",
                     "1.4x floor"])
        del qi, ki, w, idx
    return rows


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
    ap.add_argument("--no-vs-flashmla", action="store_true",
                    help="skip the table against FlashMLA's sparse prefill")
    ap.add_argument("--only-vs-flashmla", action="store_true",
                    help="only the table against FlashMLA (no status block)")
    ap.add_argument("--only-paged-decode", action="store_true",
                    help="only the paged FP8 tables, decode and prefill (no status block)")
    ap.add_argument("--only-indexer", action="store_true",
                    help="only the lightning indexer's table (no status block)")
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
    only = args.only_vs_flashmla or args.only_paged_decode or args.only_indexer
    if only:
        shapes, args.status_out = [], None
    if args.only_paged_decode or args.only_indexer:
        args.no_vs_flashmla = True
    rows = [row_fmha(b, sq, sk, h, causal, ceil, device, dtype) for b, sq, sk, h, causal in shapes]
    layers = [("sliding", 1, 8192, 128, False), ("CSA", 1, 8192, 64, False),
              ("HCA", 1, 8192, 128, False), ("CSA", 64, 4096, 128, True),
              ("sliding", 64, 4096, 128, True), ("HCA", 64, 4096, 128, True)]
    if args.quick or only:
        layers = layers[:1] if args.quick else []
    rows += [row_layer(kind, b, s, h, ceil, device, dtype, decode)
             for kind, b, s, h, decode in layers]
    headers = ["row", "path", "ours ms", "FA3 ms", "ours", "FA3", "speedup vs FA3",
               "ours / ceiling"]
    table_md = common.format_table(headers, rows, markdown=True)
    if args.only_vs_flashmla or not args.no_vs_flashmla:
        flashmla = load_flashmla()
        mla_note = "FlashMLA sparse prefill: " + ("vLLM 0.26's sm90 build" if flashmla else
                                                   "not loaded (DSV4_PEER_FLASHMLA)")
        if flashmla is not None:
            ours_err, peer_err = check_flashmla(flashmla, device, dtype)
            mla_note += (f"; check on a small CSA case, max |error| vs the float64 oracle: ours "
                         f"{ours_err:.1e}, FlashMLA {peer_err:.1e}")
        specs = VS_FLASHMLA[:1] if args.quick else VS_FLASHMLA
        mla_rows = [row for k, tk, ctx, h in specs
                    for row in rows_vs_flashmla(flashmla, k, tk, ctx, h, ceil, device, dtype)]
        mla_headers = ["layer, S = 8192", "Hq", "path", "dsv4 ms", "FlashMLA ms",
                       "speed vs FlashMLA", "dsv4 of GEMM", "FlashMLA of GEMM"]
        table_md += ("\n\n" + mla_note + "\n\n" +
                     common.format_table(mla_headers, mla_rows, markdown=True))
    paged = not (args.only_vs_flashmla or args.only_indexer)
    if paged:
        prefill_peer = load_flashmla()  # sparse_prefill_fwd; the library also has the decode
        decode = None
        if prefill_peer is not None:
            decode = getattr(torch.ops._flashmla_C, "sparse_decode_fwd", None)
        oracle_err, peer_diff = check_paged_decode(decode, device)
        paged_note = (f"dsv4_attention_paged decode from FP8 pages, 32k context; FlashMLA sparse "
                      f"FP8 decode: {'vLLM 0.26 sm90 build, plan reused' if decode else 'not loaded'}; "
                      f"each step one of 20 in a CUDA graph"
                      f"; check: ours vs the float64 oracle max |error| {oracle_err:.1e}"
                      + (f", ours vs FlashMLA max |difference| {peer_diff:.1e}" if decode else ""))
        paged_headers = ["step", "Hq", "path", "ours us", "FlashMLA us", "speed vs FlashMLA",
                         "floor us", "ours / floor"]
        paged_rows = rows_paged_decode(decode, ceil, device, args.quick)
        table_md += "\n\n" + paged_note + "\n\n" + common.format_table(paged_headers, paged_rows,
                                                                          markdown=True)
        prefill_note = ("dsv4_attention_paged prefill from FP8 pages (S = 8192, each token's "
                        "window list its 128 positions) beside FlashMLA's bf16 sparse prefill: "
                        + ("vLLM 0.26's sm90 build" if prefill_peer else "not loaded"))
        prefill_headers = ["layer", "Hq", "path", "paged ms", "dsv4 bf16 ms", "FlashMLA bf16 ms",
                           "paged vs FlashMLA"]
        prefill_rows = rows_paged_prefill(prefill_peer, device, args.quick)
        table_md += ("\n\n" + prefill_note + "\n\n" +
                     common.format_table(prefill_headers, prefill_rows, markdown=True))
    kv_headers = ["paged FP8 cache op", "path", "us", "GB/s moved", "of copy"]
    kv_rows = [] if only else rows_kv_cache(ceil, device)
    if kv_rows:
        table_md += "\n\n" + common.format_table(kv_headers, kv_rows, markdown=True)
    indexer = not (args.only_vs_flashmla or args.only_paged_decode)
    if indexer:
        ceil["fp8_gemm"] = common.fp8_gemm_tflops(device)
        checks = ", ".join(
            f"{name} {'every pick agrees' if check_indexer(device, dt) else 'MISMATCH'}"
            for dt, name in ((torch.bfloat16, "bf16"), (FP8, "fp8")))
        checks += (", paged fp8 " + ("every pick agrees" if check_indexer_paged(device)
                                     else "MISMATCH"))
        indexer_note = ("dsv4_indexer_topk, 64 heads x 128, top-512 of the closed rows of a 4x "
                        "compressed prompt (fp8: row scales); FP8 GEMM 8192^3 (torch._scaled_mm) "
                        f"{ceil['fp8_gemm']:.0f} TFLOP/s this run; check on an exact small case "
                        f"against the float64 oracle: {checks}")
        indexer_headers = ["row", "path", "time", "useful rate", "of ceiling", "target"]
        indexer_rows = rows_indexer(ceil, device, args.quick) + rows_indexer_paged(
            ceil, device, args.quick)
        table_md += ("\n\n" + indexer_note + "\n\n" +
                     common.format_table(indexer_headers, indexer_rows, markdown=True))
    common.write_status(args.status_out, common.status_block(
        "bench_dsv4", f"{peers}\n\n{table_md}", gemm=ceil["gemm"], copy_gbs=ceil["copy"],
        device=device, dtype=dtype, note="quick" if args.quick else ""))
    print(header)
    if rows:
        print(common.format_table(headers, rows))
    if args.only_vs_flashmla or not args.no_vs_flashmla:
        print()
        print(mla_note)
        print(common.format_table(mla_headers, mla_rows))
    if paged:
        print()
        print(paged_note)
        print(common.format_table(paged_headers, paged_rows))
        print()
        print(prefill_note)
        print(common.format_table(prefill_headers, prefill_rows))
    if kv_rows:
        print()
        print(common.format_table(kv_headers, kv_rows))
    if indexer:
        print()
        print(indexer_note)
        print(common.format_table(indexer_headers, indexer_rows))
    section = header.replace("\n", "\n\n") + "\n\n" + table_md
    title = f"head_dim 512 (bench_dsv4.py), {common.device_name(device)}"
    if args.out:
        with open(os.path.join(args.out, "bench_dsv4.md"), "w", encoding="utf-8") as f:
            f.write(f"## {common.today()}: {title}\n\n{section}\n")


if __name__ == "__main__":
    main()
