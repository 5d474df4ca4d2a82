"""GPU tests of dsv4_attention on the sm90 head_dim-512 kernel (csrc/sm90/mqa512): dense and varlen
sliding-only, HCA and CSA layers, the query heads of a token packed into 64-row tiles.

Rule (FlashAttention's): max |ours - f64 oracle| <= 2 x max |low - f64 oracle| + 1e-3 on out
and lse, where `low` computes the same layer in the input dtype: SDPA over [kv | compressed_kv]
with the layer's visibility as a mask and the sink as an extra zero key (sliding, HCA), or, for
CSA, per-query gathered keys with bf16 products and P rounded to bf16 (a mask cannot count a
repeated index twice). Poisoned outputs, fresh inputs per case, determinism, CUDA-graph replay.
"""
import math

import pytest
import torch
import torch.nn.functional as F

import dsv4_attn
from dsv4_attn import reference as ref

from conftest import poison_allocator, stable_seed
from test_fmha_sm90 import needs_sm90

pytestmark = [pytest.mark.gpu, needs_sm90]

D = 512


def _visibility(sq, skv, sc, window, ratio, device):
    """(Sq, Skv + Sc) bool: the keys each query sees, window rows then compressed rows."""
    t = torch.arange(sq, device=device)[:, None] + (skv - sq)
    j = torch.arange(skv, device=device)[None, :]
    vis = (j <= t) & (j > t - window)
    if sc:
        w = torch.arange(sc, device=device)[None, :]
        closed = torch.clamp(torch.div(t + 1, ratio, rounding_mode="floor"), max=sc)
        vis = torch.cat([vis, w < closed], dim=1)
    return vis


def low_precision(q, kv, comp, sinks, window, ratio, scale):
    b, sq, h, _ = q.shape
    keys = kv if comp is None else torch.cat([kv, comp], dim=1)  # (B, T, D)
    vis = _visibility(sq, kv.shape[1], 0 if comp is None else comp.shape[1], window, ratio,
                      q.device)
    bias = torch.zeros(h, sq, keys.shape[1], device=q.device).masked_fill(~vis, -math.inf)
    kk = keys[:, None].expand(b, h, -1, D)
    if sinks is not None:
        kk = torch.cat([kk, kk.new_zeros(b, h, 1, D)], dim=2)
        bias = torch.cat([bias, sinks[:, None, None].expand(h, sq, 1)], dim=2)
    dead = torch.isinf(bias).all(-1)
    bias = bias.masked_fill(dead[..., None], 0.0)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), kk, kk, attn_mask=bias.to(q.dtype),
                                         scale=scale)
    out = out.masked_fill(dead[None, :, :, None], 0.0).transpose(1, 2)
    s = torch.matmul(q.transpose(1, 2), kk.transpose(-1, -2)).float() * scale + bias
    return out, torch.logsumexp(s, -1).masked_fill(dead[None], -math.inf)


def low_precision_csa(q, kv, comp, topk, sinks, window, ratio, scale):
    """The CSA layer as the kernel rounds it: products of the 16-bit inputs summed in fp32,
    an fp32 softmax, P rounded to q's dtype, and the output rounded once."""
    b, sq, h, _ = q.shape
    skv, sc = kv.shape[1], comp.shape[1]
    t = torch.arange(sq, device=q.device)[:, None] + (skv - sq)
    j = torch.arange(skv, device=q.device)[None, :]
    win_vis = (j <= t) & (j > t - window)                                   # (Sq, Skv)
    closed = torch.clamp(torch.div(t + 1, ratio, rounding_mode="floor"), max=sc)
    idx = topk.long()
    csa_vis = (idx >= 0) & (idx < closed[None])                             # (B, Sq, K)
    gathered = comp[torch.arange(b, device=q.device)[:, None, None], idx.clamp(0, sc - 1)]
    qf, kvf, gf = q.float(), kv.float(), gathered.float()
    s_win = torch.einsum("bshd,btd->bsht", qf, kvf) * scale
    s_win = s_win.masked_fill(~win_vis[None, :, None], -math.inf)
    s_csa = torch.einsum("bshd,bskd->bshk", qf, gf) * scale
    s_csa = s_csa.masked_fill(~csa_vis[:, :, None], -math.inf)
    s = torch.cat([s_win, s_csa], dim=-1)
    lse = torch.logsumexp(s, -1)
    if sinks is not None:
        lse = torch.logaddexp(lse, sinks.float()[None, None])
    shift = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    p = torch.exp(s - shift[..., None]).to(q.dtype).float()
    out = torch.einsum("bsht,btd->bshd", p[..., :skv], kvf) + \
        torch.einsum("bshk,bskd->bshd", p[..., skv:], gf)
    return out.to(q.dtype), lse.transpose(1, 2)


def padded_topk(b, sq, skv, sc, ratio, k, gen):
    """Lists as an indexer gives them: up to K distinct closed rows, then -1 (a fresh prompt's
    early tokens list fewer rows, the first ones none)."""
    t = torch.arange(sq, device="cuda") + (skv - sq)
    closed = torch.clamp(torch.div(t + 1, ratio, rounding_mode="floor"), max=sc)
    score = torch.rand(b, sq, sc, generator=gen, device="cuda")
    score = score.masked_fill(torch.arange(sc, device="cuda") >= closed[None, :, None], -1.0)
    val, top = score.topk(min(k, sc), dim=-1)
    top = torch.where(val >= 0, top, -1)
    return F.pad(top, (0, k - top.shape[-1]), value=-1).int()


def sparse_topk(b, sq, k, sc, gen):
    """Lists of -1 with one entry each in a random slot (every third token's in the last slot),
    a random row that may not be closed yet: a list's last visible slot anywhere, or nowhere."""
    topk = torch.full((b, sq, k), -1, dtype=torch.int32, device="cuda")
    slot = torch.randint(0, k, (b, sq), generator=gen, device="cuda")
    slot[:, ::3] = k - 1
    row = torch.randint(0, sc, (b, sq), generator=gen, device="cuda", dtype=torch.int32)
    return topk.scatter_(2, slot[..., None], row[..., None])


def check(b, sq, skv, h, window, ratio, sc, with_sinks, dtype=torch.bfloat16, seed=0,
          q_view=False, topk_k=0, padded_lists=False, sparse_lists=False, plan_has=(),
          repeats=1):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    rand = lambda *s: torch.randn(*s, generator=gen, device="cuda").to(dtype)  # noqa: E731
    q = rand(b, h, sq, D).transpose(1, 2) if q_view else rand(b, sq, h, D)
    kv = rand(b, skv, D)
    comp = rand(b, sc, D) if ratio else None
    sinks = torch.randn(h, generator=gen, device="cuda") * 2 if with_sinks else None
    kw = dict(window=window, sinks=sinks)
    if ratio:
        kw.update(compressed_kv=comp, compress_ratio=ratio)
    if topk_k and padded_lists:
        kw["topk_indices"] = padded_topk(b, sq, skv, sc, ratio, topk_k, gen)
    elif topk_k and sparse_lists:
        kw["topk_indices"] = sparse_topk(b, sq, topk_k, sc, gen)
    elif topk_k:
        # -1 padding, rows >= Sc, rows not yet closed, and a repeated index per query.
        topk = torch.randint(-1, sc + 3, (b, sq, topk_k), generator=gen, device="cuda")
        if topk_k >= 2:
            topk[..., -1] = topk[..., 0]
        kw["topk_indices"] = topk.int()
    assert dsv4_attn.dsv4_attention_path(q, kv, **kw) == "sm90"
    plan = dsv4_attn.launch_plan("dsv4_attention", q, kv, **kw)
    assert all(part in plan for part in plan_has), plan
    poison_allocator(2 * b * sq * h * D * 4 + (1 << 20), "cuda")
    out, lse = dsv4_attn.dsv4_attention(q, kv, return_lse=True, **kw)
    want_out, want_lse = ref.dsv4_attention(q, kv, **kw)
    if topk_k:
        low_out, low_lse = low_precision_csa(q, kv, comp, kw["topk_indices"], sinks, window,
                                             ratio, 1 / math.sqrt(D))
    else:
        low_out, low_lse = low_precision(q, kv, comp, sinks, window, ratio, 1 / math.sqrt(D))
    want_out, want_lse = want_out.cuda(), want_lse.cuda()
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    err = (out.double() - want_out).abs().max().item()
    tol = 2 * (low_out.double() - want_out).abs().max().item() + 1e-3
    assert err <= tol, f"out error {err:.3e} > {tol:.3e}"
    finite = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    if finite.any():
        err = (lse.double() - want_lse)[finite].abs().max().item()
        tol = 2 * (low_lse.double() - want_lse)[finite].abs().max().item() + 1e-3
        assert err <= tol, f"lse error {err:.3e} > {tol:.3e}"
    for _ in range(repeats):
        again = dsv4_attn.dsv4_attention(q, kv, return_lse=True, **kw)
        assert torch.equal(out, again[0]) and torch.equal(lse, again[1])


# (B, Sq, Skv, Hq, window, ratio, Sc, sinks)
CASES = [
    (2, 1, 300, 128, 128, 0, 0, True),      # sliding decode
    (1, 2, 700, 64, 128, 0, 0, True),
    (2, 3, 130, 8, 127, 0, 0, False),
    (1, 64, 64, 1, 1, 0, 0, True),
    (1, 65, 300, 64, 128, 0, 0, True),      # chunked prefill
    (1, 300, 300, 128, 128, 0, 0, True),    # prefill
    (1, 200, 200, 64, 0, 4, 50, True),      # HCA, no window keys
    (2, 1, 1000, 128, 128, 128, 7, True),   # HCA decode (Sc = 1000 // 128)
    (1, 300, 300, 64, 128, 128, 2, True),   # HCA prefill, two closed rows at the end
    (1, 150, 520, 16, 127, 4, 130, False),  # HCA r=4, 4 tokens x 16 heads per tile
    (1, 130, 2200, 8, 128, 128, 17, True),  # HCA r=128, 8 tokens x 8 heads, an 8k-style chunk
    (2, 40, 600, 32, 128, 4, 150, True),    # HCA r=4, 2 tokens x 32 heads
    (1, 257, 257, 64, 1, 4, 64, True),
    (1, 100, 100, 64, 0, 0, 0, False),      # nothing visible: out 0, lse -inf
]


@pytest.mark.parametrize("b,sq,skv,h,window,ratio,sc,sinks", CASES)
def test_dsv4_sm90_matches_oracle(b, sq, skv, h, window, ratio, sc, sinks):
    check(b, sq, skv, h, window, ratio, sc, sinks, seed=stable_seed(b, sq, skv, h, window))


# (B, Sq, Skv, Hq, window, Sc, K): CSA with r = 4.
CSA_CASES = [
    (2, 1, 2100, 128, 128, 525, 512),    # decode, V4-Flash K
    (1, 2, 4200, 64, 128, 1050, 1024),   # decode, V4-Pro K
    (1, 3, 400, 64, 127, 100, 64),
    (1, 65, 300, 64, 128, 75, 16),       # chunked prefill
    (1, 200, 200, 128, 0, 50, 1),        # no window keys, K = 1
    (2, 130, 130, 64, 1, 32, 40),        # K not a multiple of 64
    # Tensor-parallel head counts: a work tile of 64 / Hq tokens walks each token's list.
    (1, 70, 700, 8, 128, 175, 512),      # 8 tokens x 8 heads, the last tile 6 tokens
    (2, 33, 300, 16, 128, 75, 100),
    (1, 40, 500, 32, 127, 125, 64),
    (1, 37, 900, 2, 128, 225, 130),      # 32 tokens x 2 heads
    (2, 1, 2100, 16, 128, 525, 512),     # decode (split-KV), one token in a 4-token tile
    (1, 3, 4200, 8, 128, 1050, 1024),    # multi-token prediction
]


@pytest.mark.parametrize("b,sq,skv,h,window,sc,k", CSA_CASES)
def test_dsv4_sm90_csa_matches_oracle(b, sq, skv, h, window, sc, k):
    check(b, sq, skv, h, window, 4, sc, True, topk_k=k, seed=stable_seed(b, sq, skv, h, k))


@pytest.mark.parametrize("merge", ["cluster", "combine"])
def test_dsv4_sm90_csa_split_merge_with_gathered_keys(monkeypatch, merge):
    """CSA at 32 heads on 64-row tiles of two tokens, each tile's keys cut in two splits: the
    splits merge in a cluster of two CTAs (the other CTA's partial O lands in the key stages the
    gather filled) or by the combine kernel. Against the oracle, and bitwise equal over ten
    calls, so a race between the gather and the merge's stores would show (racecheck cannot
    order that pair: docs/mqa512.md, "Two splits merged in a cluster")."""
    monkeypatch.setenv("DSV4_MQA512_NARROW", "0")
    monkeypatch.setenv("DSV4_SPLIT_KV", "2")
    monkeypatch.setenv("DSV4_MQA512_SPLIT_MERGE", merge)
    check(1, 100, 400, 32, 128, 4, 100, True, topk_k=96, seed=44, repeats=10,
          plan_has=("tile=2x32 ", f" splits=2 merge={merge} ", "keys=gathered"))


# (B, Sq, Skv, Hq, K): lists padded with -1 as an indexer gives them, on a fresh prompt (the
# early tokens list fewer rows, the first none: whole tiles of a list, and whole work tiles of
# 64 / Hq tokens, see nothing).
@pytest.mark.parametrize("b,sq,skv,h,k", [(1, 300, 300, 64, 64), (1, 600, 600, 128, 128),
                                          (2, 200, 200, 16, 64), (1, 300, 300, 8, 128),
                                          (1, 5, 600, 32, 512)])
def test_dsv4_sm90_csa_padded_lists(b, sq, skv, h, k):
    check(b, sq, skv, h, 128, 4, skv // 4, True, topk_k=k, padded_lists=True,
          seed=stable_seed("padded", b, sq, h, k))


# (B, Sq, Skv, Hq, K): the kernel walks each work tile's lists only up to the last visible slot
# of the longest (planned before the launch); one entry per list, anywhere.
@pytest.mark.parametrize("b,sq,skv,h,k", [(1, 90, 400, 64, 512), (2, 40, 300, 128, 200),
                                          (1, 50, 600, 8, 1024), (1, 35, 300, 32, 130)])
def test_dsv4_sm90_csa_sparse_lists(b, sq, skv, h, k):
    check(b, sq, skv, h, 128, 4, skv // 4, True, topk_k=k, sparse_lists=True,
          seed=stable_seed("sparse", b, sq, h, k))


# (B, Sq, Skv, Hq, window, Sc, K, dtype, lists): CSA at 16 or fewer heads in the narrow form
# (one token's heads a work tile, pinned on with DSV4_MQA512_NARROW=1 so that small calls take
# it too): a work tile of one key tile (one consumer idle), the window's boundary tiles, lists
# of -1, out-of-range, unclosed and repeated rows, padded and sparse lists, several work tiles
# a CTA.
NARROW_CASES = [
    (1, 300, 1200, 8, 128, 300, 512, torch.bfloat16, "random"),
    (2, 150, 600, 16, 128, 150, 100, torch.float16, "random"),
    (1, 200, 800, 1, 128, 200, 512, torch.bfloat16, "padded"),
    (2, 130, 300, 2, 127, 75, 64, torch.bfloat16, "padded"),
    (1, 150, 600, 16, 128, 150, 1024, torch.bfloat16, "sparse"),
    (1, 140, 400, 4, 0, 100, 64, torch.bfloat16, "random"),   # no window keys: one tile each
    (1, 400, 2000, 8, 128, 500, 1024, torch.float16, "padded"),
    # ~15 work tiles a CTA: the key ring and the two handoff barriers wrap several times
    (1, 2048, 8192, 8, 128, 2048, 512, torch.bfloat16, "random"),
    (2, 1024, 4096, 16, 128, 1024, 512, torch.float16, "padded"),
]


@pytest.mark.parametrize("b,sq,skv,h,window,sc,k,dtype,lists", NARROW_CASES)
def test_dsv4_sm90_csa_narrow_matches_oracle(monkeypatch, b, sq, skv, h, window, sc, k, dtype,
                                             lists):
    monkeypatch.setenv("DSV4_MQA512_NARROW", "1")
    q = torch.empty(b, sq, h, D, device="cuda", dtype=dtype)
    kw = dict(compressed_kv=torch.empty(b, sc, D, device="cuda", dtype=dtype), compress_ratio=4,
              topk_indices=torch.zeros(b, sq, k, dtype=torch.int32, device="cuda"), window=window)
    plan = dsv4_attn.launch_plan("dsv4_attention", q, torch.empty(b, skv, D, device="cuda",
                                                                   dtype=dtype), **kw)
    assert plan.endswith(" narrow=16") and "tile=1x%d " % h in plan, plan
    check(b, sq, skv, h, window, 4, sc, True, dtype=dtype, topk_k=k,
          padded_lists=lists == "padded", sparse_lists=lists == "sparse",
          seed=stable_seed("narrow", b, sq, h, k))


def test_dsv4_sm90_csa_narrow_planned_and_pinned_off(monkeypatch):
    """The narrow form is planned for a prefill of 8 and 16 heads with lists of 288 or more
    (shorter ones keep the 64-row tiles), not for 32 heads (64-row tiles of 2 tokens) nor for a
    decode step (split-KV); DSV4_MQA512_NARROW=0 packs 64-row tiles, and the 64-row form still
    matches the oracle; a bad value is an error naming the variable."""
    def plan(sq, h, b=1, k=512):
        q = torch.empty(b, sq, h, D, device="cuda").bfloat16()
        kv = torch.empty(b, 4 * sq + 128, D, device="cuda").bfloat16()
        comp = torch.empty(b, sq + 32, D, device="cuda").bfloat16()
        topk = torch.zeros(b, sq, k, dtype=torch.int32, device="cuda")
        return dsv4_attn.launch_plan("dsv4_attention", q, kv, compressed_kv=comp,
                                     compress_ratio=4, topk_indices=topk)
    assert plan(4096, 8).endswith(" narrow=16") and "tile=1x8 " in plan(4096, 8)
    assert plan(4096, 16).endswith(" narrow=16") and plan(4096, 16, k=288).endswith(" narrow=16")
    assert "tile=4x16 " in plan(4096, 16, k=287) and "narrow" not in plan(4096, 16, k=287)
    assert plan(4096, 1, k=64).endswith(" narrow=16")
    assert "tile=2x32 " in plan(4096, 32) and "narrow" not in plan(4096, 32)
    assert "narrow" not in plan(1, 16, b=4)
    monkeypatch.setenv("DSV4_MQA512_NARROW", "0")
    assert "tile=8x8 " in plan(4096, 8) and "narrow" not in plan(4096, 8)
    check(1, 300, 1200, 8, 128, 4, 300, True, topk_k=512, seed=stable_seed("narrow off"))
    monkeypatch.setenv("DSV4_MQA512_NARROW", "yes")
    with pytest.raises(RuntimeError, match="DSV4_MQA512_NARROW"):
        plan(64, 8)


def test_dsv4_sm90_fp16_and_views():
    check(2, 40, 200, 64, 128, 4, 50, True, dtype=torch.float16, seed=3)
    check(1, 33, 180, 128, 16, 128, 1, True, q_view=True, seed=4)


def test_dsv4_sm90_uncovered_calls_take_reference_path():
    # CSA at one head: the narrow form where no split-KV is planned (short keys here, and short
    # lists: the 64-row tiles cannot take one head); a decode step over long lists plans
    # split-KV, and 64-token work tiles do not fit the producer.
    q = torch.randn(1, 4, 1, D, device="cuda").bfloat16()
    kv = torch.randn(1, 40, D, device="cuda").bfloat16()
    comp = torch.randn(1, 10, D, device="cuda").bfloat16()
    topk = torch.zeros(1, 4, 8, dtype=torch.int32, device="cuda")
    kw = dict(compressed_kv=comp, compress_ratio=4, topk_indices=topk)
    assert dsv4_attn.launch_plan("dsv4_attention", q, kv, **kw).endswith(" narrow=16")
    q4 = torch.randn(4, 1, 1, D, device="cuda").bfloat16()
    kv4 = torch.randn(4, 2100, D, device="cuda").bfloat16()
    kw = dict(compressed_kv=torch.randn(4, 525, D, device="cuda").bfloat16(), compress_ratio=4,
              topk_indices=torch.zeros(4, 1, 512, dtype=torch.int32, device="cuda"))
    assert dsv4_attn.dsv4_attention_path(q4, kv4, **kw) == "reference"
    assert "one query head" in dsv4_attn.launch_plan("dsv4_attention", q4, kv4, **kw)
    q = torch.randn(1, 4, 3, D, device="cuda").bfloat16()  # 3 heads do not pack into 64 rows
    assert dsv4_attn.dsv4_attention_path(q, kv) == "reference"


def test_dsv4_sm90_cuda_graph_decode_step():
    gen = torch.Generator(device="cuda").manual_seed(9)
    q = torch.randn(4, 1, 128, D, generator=gen, device="cuda").bfloat16()
    kv = torch.randn(4, 1024, D, generator=gen, device="cuda").bfloat16()
    comp = torch.randn(4, 8, D, generator=gen, device="cuda").bfloat16()
    sinks = torch.randn(128, generator=gen, device="cuda")
    kw = dict(sinks=sinks, compressed_kv=comp, compress_ratio=128)
    dsv4_attn.dsv4_attention(q, kv, **kw)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = dsv4_attn.dsv4_attention(q, kv, **kw)
    for _ in range(2):
        for t in (q, kv, comp):
            t.copy_(torch.randn(t.shape, generator=gen, device="cuda"))
        graph.replay()
        assert torch.equal(out, dsv4_attn.dsv4_attention(q, kv, **kw))


def _cu(lens):
    return torch.tensor([0] + list(lens), device="cuda").cumsum(0).to(torch.int32)


# (lens_q, lens_kv, Hq, window, ratio, topk K): compressed rows per sequence = kv // ratio.
VARLEN_CASES = [
    ((1, 0, 65, 300, 7), (300, 5, 65, 300, 130), 64, 128, 0, 0),     # sliding
    ((1, 0, 65, 300, 7), (300, 5, 65, 300, 130), 8, 127, 0, 0),      # 8 tokens x 8 heads a tile
    ((3, 200, 1, 0), (400, 200, 9, 3), 64, 128, 4, 0),               # HCA r = 4
    ((1, 129, 2), (1000, 300, 129), 128, 128, 128, 0),               # HCA r = 128
    ((5, 130, 1, 64), (300, 130, 700, 64), 64, 128, 4, 64),          # CSA
    ((1, 1, 1, 1), (2100, 17, 4, 1300), 128, 128, 4, 512),           # CSA decode
    ((5, 130, 1, 64), (300, 130, 700, 64), 16, 128, 4, 64),          # CSA, 4 tokens x 16 heads
    ((3, 70, 1), (500, 70, 900), 8, 128, 4, 128),                    # CSA, 8 tokens x 8 heads
    # A fresh prompt beside chunks at long context (4k and 6k tokens in, 1-2k rows closed).
    ((64, 100, 1), (64, 4200, 6000), 32, 128, 4, 512),               # CSA, 2 tokens x 32 heads
    ((100, 3, 64), (100, 5000, 6000), 8, 128, 128, 0),               # HCA, 8 tokens x 8 heads
]


@pytest.mark.parametrize("lens_q,lens_kv,h,window,ratio,k", VARLEN_CASES)
def test_dsv4_sm90_varlen_matches_dense_calls(monkeypatch, lens_q, lens_kv, h, window, ratio, k):
    """A varlen call against a dense sm90 call of each sequence alone (bitwise: the same
    tiles of the same rows; rows a boundary tile loads from the next sequence are masked), and
    against the reference path. Split-KV is pinned off: its plan counts work tiles, which
    differ between the two calls."""
    monkeypatch.setenv("DSV4_SPLIT_KV", "1")
    gen = torch.Generator(device="cuda").manual_seed(stable_seed(lens_q, h, ratio, k))
    rand = lambda *s: torch.randn(*s, generator=gen, device="cuda").bfloat16()  # noqa: E731
    lens_c = [n // ratio if ratio else 0 for n in lens_kv]
    q, kv = rand(sum(lens_q), h, D), rand(sum(lens_kv), D)
    sinks = torch.randn(h, generator=gen, device="cuda")
    cu_q, cu_kv, cu_c = _cu(lens_q), _cu(lens_kv), _cu(lens_c)
    kw = dict(window=window, sinks=sinks, cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv)
    comp = topk = None
    if ratio:
        comp = rand(sum(lens_c), D)
        kw.update(compressed_kv=comp, compress_ratio=ratio, cu_seqlens_compressed=cu_c)
    if k:
        topk = torch.randint(-1, max(lens_c) + 3, (sum(lens_q), k), generator=gen,
                             device="cuda").int()
        topk[:, -1] = topk[:, 0]  # a repeated index counts twice
        kw["topk_indices"] = topk
    assert dsv4_attn.dsv4_attention_path(q, kv, **kw) == "sm90"
    poison_allocator(2 * q.numel() * 4 + (1 << 20), "cuda")
    out, lse = dsv4_attn.dsv4_attention(q, kv, max_seqlen_q=max(lens_q),
                                        max_seqlen_kv=max(lens_kv), return_lse=True, **kw)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()

    for i, (lq, lk, lc) in enumerate(zip(lens_q, lens_kv, lens_c)):
        if lq == 0:
            continue
        qs = slice(cu_q[i].item(), cu_q[i + 1].item())
        one = dict(window=window, sinks=sinks)
        if ratio:
            cs = slice(cu_c[i].item(), cu_c[i + 1].item())
            one.update(compressed_kv=comp[cs][None], compress_ratio=ratio)
        if k:
            one["topk_indices"] = topk[qs][None]
        kv_i = kv[cu_kv[i].item():cu_kv[i + 1].item()][None]
        assert dsv4_attn.dsv4_attention_path(q[qs][None], kv_i, **one) == "sm90"
        want_out, want_lse = dsv4_attn.dsv4_attention(q[qs][None], kv_i, return_lse=True, **one)
        assert torch.equal(out[qs], want_out[0]), f"sequence {i}: out != its dense call"
        assert torch.equal(lse[:, qs], want_lse[0]), f"sequence {i}: lse != its dense call"

    monkeypatch.setenv("DSV4_DISABLE_SM90", "1")
    ref_out, ref_lse = dsv4_attn.dsv4_attention(q, kv, return_lse=True, **kw)
    assert (out.float() - ref_out.float()).abs().max().item() < 3e-2
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    assert (lse - ref_lse)[finite].abs().max().item() < 1e-2


def test_dsv4_sm90_varlen_cuda_graph_replay_with_new_lengths():
    """A varlen HCA prefill captured once: replays follow new cu_seqlens contents (same N and
    totals) and new data, because the schedule is built on the device."""
    gen = torch.Generator(device="cuda").manual_seed(17)
    rand = lambda *s: torch.randn(*s, generator=gen, device="cuda").bfloat16()  # noqa: E731
    total_q, total_kv, total_c = 300, 600, 150
    q, kv, comp = rand(total_q, 64, D), rand(total_kv, D), rand(total_c, D)
    cu_q, cu_kv, cu_c = _cu([100, 0, 200]), _cu([200, 100, 300]), _cu([50, 25, 75])
    kw = dict(sinks=torch.randn(64, generator=gen, device="cuda"), compressed_kv=comp,
              compress_ratio=4, cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv,
              cu_seqlens_compressed=cu_c, max_seqlen_q=total_q, max_seqlen_kv=total_kv)
    dsv4_attn.dsv4_attention(q, kv, **kw)  # warm-up, uncaptured
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = dsv4_attn.dsv4_attention(q, kv, return_lse=True, **kw)
    for lens_q, lens_kv in (([1, 299, 0], [1, 599, 0]), ([150, 100, 50], [300, 100, 200])):
        lens_c = [n // 4 for n in lens_kv]
        lens_c[-1] += total_c - sum(lens_c)  # same total; the extra rows are not yet closed
        cu_q.copy_(_cu(lens_q))
        cu_kv.copy_(_cu(lens_kv))
        cu_c.copy_(_cu(lens_c))
        for t in (q, kv, comp):
            t.copy_(torch.randn(t.shape, generator=gen, device="cuda"))
        graph.replay()
        want_out, want_lse = dsv4_attn.dsv4_attention(q, kv, return_lse=True, **kw)
        assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
