"""dsv4.dsv4_attention against the float64 oracle and against fmha + merge_attn_states.

Layer kinds: sliding-only, HCA (every closed compressed row) and CSA (top-k listed rows), with
and without sinks; dense and varlen (zero-length sequences, Sq = 1); full prefill (Sq = Skv),
chunked prefill and decode (Sq < Skv); window 0/1/127/128, compress ratio 1/4/128,
K 1/16/512 with -1 padding, out-of-range, not-yet-closed and repeated indices; Hq 1/16/64/128,
D 64/512; transposed and strided views. Each case runs on CPU and, gpu-marked, on CUDA.
"""
import math

import pytest
import torch

from dsv4_attn import ops
from dsv4_attn import reference as ref

from conftest import assert_close_to_ref, assert_lse_close, cu_seqlens, rand, randn

BF16 = torch.bfloat16


def _topk(gen, rows, k, sc, device, lead=()):
    """Indices drawn over [-1, Sc + 2): -1 padding, rows >= Sc, not-yet-closed rows; plus a
    duplicate of the first entry in the last slot (K >= 2)."""
    idx = torch.randint(-1, sc + 3, (*lead, rows, k), generator=gen, dtype=torch.int32)
    if k >= 2:
        idx[..., -1] = idx[..., 0]
    return idx.to(device)


def _check(ours, want, dtype):
    out, lse = ours
    want_out, want_lse = want
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert_close_to_ref(out, want_out, dtype, what="out")
    assert_lse_close(lse, want_lse, atol=2e-3)


# (B, Sq, Skv, Hq, D, window, kind, ratio, Sc, K, sinks)
DENSE = [
    pytest.param(2, 150, 150, 16, 64, 128, "slide", 0, 0, 0, True, id="slide-prefill-w128-sinks"),
    pytest.param(1, 40, 90, 1, 64, 127, "slide", 0, 0, 0, False, id="slide-chunked-w127-h1"),
    pytest.param(2, 1, 300, 16, 64, 1, "slide", 0, 0, 0, True, id="slide-decode-w1"),
    pytest.param(1, 20, 20, 16, 64, 0, "slide", 0, 0, 0, True, id="slide-w0-sink-only"),
    pytest.param(1, 20, 20, 16, 64, 0, "slide", 0, 0, 0, False, id="slide-w0-empty"),
    pytest.param(1, 3, 140, 128, 512, 128, "slide", 0, 0, 0, True, id="slide-h128-d512"),
    pytest.param(2, 60, 200, 64, 64, 128, "hca", 4, 50, 0, True, id="hca-r4-chunked-h64"),
    pytest.param(1, 300, 300, 16, 64, 128, "hca", 128, 4, 0, True, id="hca-r128-prefill"),
    pytest.param(1, 2, 400, 16, 512, 127, "hca", 128, 3, 0, False, id="hca-r128-decode-d512"),
    pytest.param(1, 50, 50, 16, 64, 0, "hca", 1, 50, 0, False, id="hca-r1-w0"),
    pytest.param(2, 80, 120, 16, 64, 128, "csa", 4, 30, 16, True, id="csa-r4-k16"),
    pytest.param(1, 30, 30, 64, 64, 1, "csa", 4, 7, 1, False, id="csa-k1-w1"),
    pytest.param(1, 4, 2100, 16, 512, 128, "csa", 4, 525, 512, True, id="csa-k512-decode-d512"),
    pytest.param(1, 1, 64, 128, 64, 127, "csa", 4, 16, 16, True, id="csa-decode-h128"),
]


@pytest.mark.parametrize("b,sq,skv,h,d,window,kind,ratio,sc,k,with_sinks", DENSE)
def test_dense_against_oracle(gen, device, b, sq, skv, h, d, window, kind, ratio, sc, k,
                              with_sinks):
    q = randn(gen, b, sq, h, d, device=device)
    kv = randn(gen, b, skv, d, device=device)
    kw = dict(window=window)
    if with_sinks:
        kw["sinks"] = randn(gen, h, dtype=torch.float32, device=device)
    if kind != "slide":
        kw.update(compressed_kv=randn(gen, b, sc, d, device=device), compress_ratio=ratio)
    if kind == "csa":
        kw["topk_indices"] = _topk(gen, sq, k, sc, device, lead=(b,))
    _check(ops.dsv4_attention(q, kv, return_lse=True, **kw), ref.dsv4_attention(q, kv, **kw), BF16)


# (lens_q, lens_kv, lens_c, kind): zero-length sequences and Sq = 1 in one batch.
VARLEN = [
    pytest.param([5, 0, 1, 60], [5, 3, 200, 100], None, "slide", id="slide"),
    pytest.param([5, 0, 1, 60], [5, 3, 200, 100], [1, 0, 50, 25], "hca", id="hca-r4"),
    pytest.param([5, 0, 1, 60, 0], [5, 3, 200, 100, 0], [1, 0, 50, 25, 0], "csa", id="csa-r4"),
]


@pytest.mark.parametrize("lens_q,lens_kv,lens_c,kind", VARLEN)
@pytest.mark.parametrize("max_seqlen", [False, True], ids=["read-cu", "max-given"])
def test_varlen_against_oracle(gen, device, lens_q, lens_kv, lens_c, kind, max_seqlen):
    h, d = 16, 64
    q = randn(gen, sum(lens_q), h, d, device=device)
    kv = randn(gen, sum(lens_kv), d, device=device)
    kw = dict(window=32, sinks=randn(gen, h, dtype=torch.float32, device=device),
              cu_seqlens_q=cu_seqlens(lens_q, device), cu_seqlens_kv=cu_seqlens(lens_kv, device))
    if kind != "slide":
        kw.update(compressed_kv=randn(gen, sum(lens_c), d, device=device), compress_ratio=4,
                  cu_seqlens_compressed=cu_seqlens(lens_c, device))
    if kind == "csa":
        kw["topk_indices"] = _topk(gen, sum(lens_q), 8, max(lens_c), device)
    want = ref.dsv4_attention(q, kv, **kw)
    if max_seqlen:
        kw.update(max_seqlen_q=max(lens_q), max_seqlen_kv=max(lens_kv))
    _check(ops.dsv4_attention(q, kv, return_lse=True, **kw), want, BF16)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
def test_other_dtypes_and_scale(gen, device, dtype):
    q, kv = randn(gen, 1, 30, 4, 64, dtype=dtype, device=device), \
        randn(gen, 1, 70, 64, dtype=dtype, device=device)
    kw = dict(window=16, compressed_kv=randn(gen, 1, 17, 64, dtype=dtype, device=device),
              compress_ratio=4, scale=0.3, topk_indices=_topk(gen, 30, 6, 17, device, lead=(1,)))
    _check(ops.dsv4_attention(q, kv, return_lse=True, **kw), ref.dsv4_attention(q, kv, **kw),
           dtype)


def test_strided_views(gen, device):
    # transformers hands over query (B, H, S, D) and key (B, 1, T, D): views, no copies.
    q_bhsd = randn(gen, 2, 16, 24, 64, device=device)
    key = randn(gen, 2, 1, 100, 64, device=device)
    comp_big = randn(gen, 2, 30, 128, device=device)
    q, kv, comp = q_bhsd.transpose(1, 2), key[:, 0], comp_big[..., 64:]
    assert not q.is_contiguous() and not comp.is_contiguous()
    kw = dict(window=20, compressed_kv=comp, compress_ratio=4,
              topk_indices=_topk(gen, 24, 8, 30, device, lead=(2,)).transpose(0, 1)
              .contiguous().transpose(0, 1))
    ours = ops.dsv4_attention(q, kv, return_lse=True, **kw)
    assert ours[0].shape == q.shape
    _check(ours, ref.dsv4_attention(q, kv, **kw), BF16)
    contiguous = ops.dsv4_attention(q.contiguous(), kv.contiguous(), return_lse=True,
                                    **{**kw, "compressed_kv": comp.contiguous()})
    assert torch.equal(ours[0], contiguous[0]) and torch.equal(ours[1], contiguous[1])


def test_nothing_visible_is_zero_and_minus_inf(gen, device):
    # window 0, no compressed rows closed yet (t + 1 < r), no sink: out 0, lse -inf, no NaN.
    q, kv = randn(gen, 1, 3, 4, 64, device=device), randn(gen, 1, 3, 64, device=device)
    out, lse = ops.dsv4_attention(q, kv, window=0, compressed_kv=randn(gen, 1, 2, 64,
                                                                        device=device),
                                  compress_ratio=128, return_lse=True)
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.isinf(lse).all() and (lse < 0).all()


def test_inputs_are_not_modified(gen, device):
    q, kv = randn(gen, 1, 9, 4, 64, device=device), randn(gen, 1, 12, 64, device=device)
    comp = randn(gen, 1, 3, 64, device=device)
    topk = _topk(gen, 9, 3, 3, device, lead=(1,))
    before = [t.clone() for t in (q, kv, comp, topk)]
    ops.dsv4_attention(q, kv, compressed_kv=comp, compress_ratio=4, topk_indices=topk)
    for a, b in zip((q, kv, comp, topk), before):
        assert torch.equal(a, b)


def test_empty_inputs(gen, device):
    out, lse = ops.dsv4_attention(randn(gen, 0, 5, 4, 64, device=device),
                                  randn(gen, 0, 5, 64, device=device), return_lse=True)
    assert out.shape == (0, 5, 4, 64) and lse.shape == (0, 4, 5)
    out, lse = ops.dsv4_attention(randn(gen, 2, 5, 0, 64, device=device),
                                  randn(gen, 2, 5, 64, device=device), return_lse=True)
    assert out.shape == (2, 5, 0, 64) and lse.shape == (2, 0, 5)


def test_path_is_reported(gen, device):
    q, kv = randn(gen, 1, 4, 8, 512, device=device), randn(gen, 1, 4, 512, device=device)
    hopper = device.type == "cuda" and torch.cuda.get_device_capability() == (9, 0)
    assert ops.dsv4_attention_path(q, kv, window=128) == ("sm90" if hopper else "reference")
    q = randn(gen, 1, 4, 8, 64, device=device)  # head_dim 64: no kernel
    assert ops.dsv4_attention_path(q, kv[..., :64].contiguous(), window=128) == "reference"


# ----------------------------------------------------------------------------- other paths


@pytest.mark.parametrize("window", [1, 16, 128])
def test_sliding_equals_fmha_window(gen, device, window):
    q, kv = randn(gen, 2, 50, 8, 64, device=device), randn(gen, 2, 90, 64, device=device)
    sinks = randn(gen, 8, dtype=torch.float32, device=device)
    out, lse = ops.dsv4_attention(q, kv, window=window, sinks=sinks, return_lse=True)
    k = kv.unsqueeze(2)  # one KV head, key = value
    want_out, want_lse = ops.fmha(q, k, k, causal=True, window_left=window - 1, sinks=sinks,
                                  return_lse=True)
    assert_close_to_ref(out, want_out, BF16)
    assert_lse_close(lse, want_lse, atol=1e-4)


def test_hca_ratio1_equals_fmha_plus_merge(gen, device):
    # r = 1 and Sc = Skv: the closed rows are exactly the causal ones, so the layer is the
    # window segment (with the sink) merged with a causal pass over the compressed rows.
    q, kv = randn(gen, 1, 40, 8, 64, device=device), randn(gen, 1, 70, 64, device=device)
    comp = randn(gen, 1, 70, 64, device=device)
    sinks = randn(gen, 8, dtype=torch.float32, device=device)
    out, lse = ops.dsv4_attention(q, kv, window=10, sinks=sinks, compressed_kv=comp,
                                  compress_ratio=1, return_lse=True)
    k, c = kv.unsqueeze(2), comp.unsqueeze(2)
    o_w, l_w = ops.fmha(q, k, k, causal=True, window_left=9, sinks=sinks, return_lse=True)
    o_c, l_c = ops.fmha(q, c, c, causal=True, return_lse=True)
    want_out, want_lse = ops.merge_attn_states(o_w, l_w, o_c, l_c)
    assert_close_to_ref(out, want_out, BF16)
    assert_lse_close(lse, want_lse, atol=1e-4)


def test_csa_listing_every_closed_row_equals_hca(gen, device):
    q, kv = randn(gen, 1, 30, 4, 64, device=device), randn(gen, 1, 64, 64, device=device)
    comp = randn(gen, 1, 16, 64, device=device)
    every = torch.arange(16, dtype=torch.int32, device=device).expand(1, 30, 16)
    hca = ops.dsv4_attention(q, kv, window=8, compressed_kv=comp, compress_ratio=4,
                             return_lse=True)
    csa = ops.dsv4_attention(q, kv, window=8, compressed_kv=comp, compress_ratio=4,
                             topk_indices=every, return_lse=True)
    torch.testing.assert_close(csa[0], hca[0], rtol=0, atol=2e-2)
    assert_lse_close(csa[1], hca[1], atol=1e-5)


@pytest.mark.parametrize("sq,skv,d", [(40, 300, 512), (1, 300, 512), (30, 30, 64)],
                         ids=["chunk-d512", "decode-split-d512", "prefill-d64"])
def test_infinite_sinks(gen, device, sq, skv, d):
    """A sink of +inf takes all the weight: out = 0 and lse = +inf for its head, never NaN; a
    sink of -inf is no sink. The other heads are the same call's."""
    h = 16
    q, kv = randn(gen, 1, sq, h, d, device=device), randn(gen, 1, skv, d, device=device)
    kw = dict(window=128, compressed_kv=randn(gen, 1, skv // 4, d, device=device),
              compress_ratio=4)
    sinks = randn(gen, h, dtype=torch.float32, device=device)
    sinks[0], sinks[1] = math.inf, -math.inf
    out, lse = ops.dsv4_attention(q, kv, sinks=sinks, return_lse=True, **kw)
    assert not out.isnan().any() and not lse.isnan().any()
    assert (out[:, :, 0] == 0).all() and (lse[:, 0] == math.inf).all()
    finite = sinks.clone()
    finite[0] = 0.0
    want_out, want_lse = ref.dsv4_attention(q, kv, sinks=finite, **kw)
    assert_close_to_ref(out[:, :, 1:], want_out[:, :, 1:], BF16)
    assert_lse_close(lse[:, 1:], want_lse[:, 1:], atol=2e-3)
