"""dsv4.fmha against the float64 oracle and against torch SDPA.

Covers sequence lengths 0, 1, 7, 64, 65, 113, 239, 1023; GQA ratios 1, 4, 8 and MQA (with
v = k, the same tensor); head dims 64, 128, 192/128, 256, 512; causal with Sq < Sk and
Sq > Sk; windows 0, 1, 127; sinks; varlen with empty sequences; transposed views.
"""
import math

import pytest
import torch
import torch.nn.functional as F

from dsv4_attn import ops
from dsv4_attn import reference as ref

from conftest import (HALF_DTYPES, REL_RMS_TOL, assert_close_to_ref, assert_lse_close,
                      cu_seqlens, rel_rms, randn)


def _check(out, lse, q, want_out, want_lse, dtype):
    """Output dtype/device/shape, values against the oracle, exact zeros on empty rows."""
    assert out.dtype == dtype and out.device == q.device
    assert lse.dtype == torch.float32 and lse.device == q.device
    assert_close_to_ref(out, want_out, dtype)
    assert_lse_close(lse, want_lse)
    # Rows with nothing visible and no sink: out exactly 0 (dense lse (B, H, S), varlen (H, T)).
    empty = (want_lse == -math.inf).cpu()
    empty = empty.transpose(1, 2) if want_lse.dim() == 3 else empty.t()
    assert (out.cpu()[empty] == 0).all(), "rows with nothing visible must be exactly 0"


# (B, Sq, Sk, Hq, Hkv, D, Dv, causal, window_left, sinks)
DENSE_CASES = [
    pytest.param(2, 64, 64, 4, 4, 64, 64, False, -1, False, id="gqa1-d64"),
    pytest.param(1, 113, 239, 8, 2, 128, 128, True, -1, False, id="gqa4-causal-sq<sk"),
    pytest.param(1, 239, 113, 8, 2, 128, 128, True, -1, False, id="gqa4-causal-sq>sk"),
    pytest.param(1, 239, 65, 4, 4, 64, 64, True, 1, True, id="causal-sq>sk-win1-sinks"),
    pytest.param(1, 65, 65, 16, 2, 64, 64, True, 0, True, id="gqa8-win0-sinks"),
    pytest.param(1, 239, 239, 4, 1, 64, 64, True, 127, True, id="mqa-win127-sinks"),
    pytest.param(2, 7, 65, 4, 1, 256, 256, False, 1, False, id="d256-noncausal-win1"),
    pytest.param(1, 65, 113, 4, 2, 192, 128, True, -1, False, id="d192-dv128"),
    pytest.param(1, 7, 64, 2, 1, 512, 512, True, -1, True, id="d512-sinks"),
    pytest.param(1, 64, 7, 2, 2, 512, 512, True, 127, False, id="d512-causal-sq>sk"),
    pytest.param(1, 1, 1023, 4, 1, 128, 128, True, 127, True, id="decode-win127"),
    pytest.param(1, 1, 1, 2, 1, 64, 64, True, 0, False, id="sq1-sk1"),
    pytest.param(1, 1023, 1023, 2, 1, 64, 64, True, -1, False, id="long-causal"),
    pytest.param(2, 0, 64, 2, 1, 64, 64, True, -1, False, id="sq0"),
    pytest.param(0, 7, 9, 2, 1, 64, 64, True, -1, True, id="b0"),
    pytest.param(2, 7, 0, 2, 1, 64, 64, False, -1, False, id="sk0"),
    pytest.param(2, 7, 0, 2, 1, 64, 64, True, -1, True, id="sk0-sinks"),
]


@pytest.mark.parametrize("b,sq,sk,hq,hkv,d,dv,causal,window,with_sinks", DENSE_CASES)
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=["bf16", "fp16"])
def test_fmha_dense(gen, device, dtype, b, sq, sk, hq, hkv, d, dv, causal, window, with_sinks):
    q = randn(gen, b, sq, hq, d, dtype=dtype, device=device)
    k = randn(gen, b, sk, hkv, d, dtype=dtype, device=device)
    v = randn(gen, b, sk, hkv, dv, dtype=dtype, device=device)
    sinks = randn(gen, hq, dtype=torch.float32, device=device) if with_sinks else None
    out, lse = ops.fmha(q, k, v, causal=causal, window_left=window, sinks=sinks, return_lse=True)
    want_out, want_lse = ref.attention(q, k, v, causal=causal, window_left=window, sinks=sinks)
    _check(out, lse, q, want_out, want_lse, dtype)


@pytest.mark.parametrize("scale", [0.05, 1.0])
def test_fmha_explicit_scale(gen, device, scale):
    # scale = 1 with D = 128 gives logits with std ~11: the softmax must stay stable.
    q = randn(gen, 2, 65, 4, 128, device=device)
    k = randn(gen, 2, 113, 2, 128, device=device)
    v = randn(gen, 2, 113, 2, 128, device=device)
    out, lse = ops.fmha(q, k, v, scale=scale, causal=True, return_lse=True)
    want_out, want_lse = ref.attention(q, k, v, scale=scale, causal=True)
    _check(out, lse, q, want_out, want_lse, torch.bfloat16)


@pytest.mark.parametrize("causal,window", [(False, -1), (True, -1), (True, 127)])
def test_fmha_mqa_v_is_k(gen, device, causal, window):
    # MLA-style decode shares one tensor for K and V.
    q = randn(gen, 2, 65, 8, 128, device=device)
    k = randn(gen, 2, 239, 1, 128, device=device)
    out, lse = ops.fmha(q, k, k, causal=causal, window_left=window, return_lse=True)
    want_out, want_lse = ref.attention(q, k, k, causal=causal, window_left=window)
    _check(out, lse, q, want_out, want_lse, torch.bfloat16)


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=["bf16", "fp16"])
def test_fmha_transposed_views(gen, device, dtype):
    # (B, H, S, D) storage passed as (B, S, H, D) views: strided in S and H, unit stride in D.
    q = randn(gen, 2, 4, 113, 128, dtype=dtype, device=device).transpose(1, 2)
    k = randn(gen, 2, 2, 239, 128, dtype=dtype, device=device).transpose(1, 2)
    v = randn(gen, 2, 2, 239, 128, dtype=dtype, device=device).transpose(1, 2)
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous())
    sinks = randn(gen, 4, dtype=torch.float32, device=device)
    out, lse = ops.fmha(q, k, v, causal=True, window_left=127, sinks=sinks, return_lse=True)
    want_out, want_lse = ref.attention(q, k, v, causal=True, window_left=127, sinks=sinks)
    assert out.shape == (2, 113, 4, 128)
    _check(out, lse, q, want_out, want_lse, dtype)


# (lengths_q, lengths_k, Hq, Hkv, D, causal, window_left, sinks)
VARLEN_CASES = [
    pytest.param([3, 0, 65, 1], [3, 0, 65, 1], 4, 4, 64, False, -1, False, id="equal-noncausal"),
    pytest.param([3, 0, 65, 1], [7, 5, 64, 113], 8, 2, 128, True, 127, True, id="mixed-win127-sinks"),
    pytest.param([1, 7, 0, 239], [0, 7, 3, 239], 4, 1, 64, True, -1, False, id="sk0-seq-causal"),
    pytest.param([64, 113, 1], [65, 1, 239], 4, 4, 256, True, 0, False, id="d256-win0"),
    pytest.param([7, 0, 1], [64, 0, 7], 2, 1, 512, False, 1, True, id="d512-win1-sinks"),
]


@pytest.mark.parametrize("lens_q,lens_k,hq,hkv,d,causal,window,with_sinks", VARLEN_CASES)
@pytest.mark.parametrize("max_seqlen", ["exact", "larger", "unset"])
def test_fmha_varlen(gen, device, lens_q, lens_k, hq, hkv, d, causal, window, with_sinks,
                     max_seqlen):
    dtype = torch.bfloat16
    q = randn(gen, sum(lens_q), hq, d, dtype=dtype, device=device)
    k = randn(gen, sum(lens_k), hkv, d, dtype=dtype, device=device)
    v = randn(gen, sum(lens_k), hkv, d, dtype=dtype, device=device)
    sinks = randn(gen, hq, dtype=torch.float32, device=device) if with_sinks else None
    cu_q, cu_k = cu_seqlens(lens_q, device), cu_seqlens(lens_k, device)
    extra = {"exact": 0, "larger": 17}.get(max_seqlen)
    max_q = max(lens_q) + extra if extra is not None else -1
    max_k = max(lens_k) + extra if extra is not None else -1
    out, lse = ops.fmha(q, k, v, causal=causal, window_left=window, sinks=sinks,
                        cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q,
                        max_seqlen_k=max_k, return_lse=True)
    want_out, want_lse = ref.attention(q, k, v, causal=causal, window_left=window, sinks=sinks,
                                       cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    assert out.shape == (sum(lens_q), hq, d) and lse.shape == (hq, sum(lens_q))
    _check(out, lse, q, want_out, want_lse, dtype)


def test_fmha_varlen_packed_qkv_views(gen, device):
    # q, k, v sliced out of one packed (total, Hq + 2 Hkv, D) projection: strided heads.
    lens = [3, 0, 65, 1]
    hq, hkv, d = 4, 1, 128
    qkv = randn(gen, sum(lens), hq + 2 * hkv, d, device=device)
    q, k, v = qkv.split([hq, hkv, hkv], dim=1)
    assert not q.is_contiguous()
    cu = cu_seqlens(lens, device)
    out, lse = ops.fmha(q, k, v, causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu, return_lse=True)
    want_out, want_lse = ref.attention(q, k, v, causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu)
    _check(out, lse, q, want_out, want_lse, torch.bfloat16)


def test_fmha_varlen_single_sequence_matches_dense(gen, device):
    q = randn(gen, 1, 113, 4, 64, device=device)
    k = randn(gen, 1, 239, 2, 64, device=device)
    v = randn(gen, 1, 239, 2, 64, device=device)
    dense_out, dense_lse = ops.fmha(q, k, v, causal=True, return_lse=True)
    out, lse = ops.fmha(q[0], k[0], v[0], causal=True, cu_seqlens_q=cu_seqlens([113], device),
                        cu_seqlens_k=cu_seqlens([239], device), return_lse=True)
    assert_close_to_ref(out, dense_out[0], torch.bfloat16)
    assert_lse_close(lse, dense_lse[0], atol=1e-4)


# ----------------------------------------------------------------------------- SDPA


def _visible_mask(sq, sk, causal, window):
    p = torch.arange(sq).view(sq, 1) + (sk - sq)
    j = torch.arange(sk).view(1, sk)
    mask = torch.ones(sq, sk, dtype=torch.bool)
    if causal:
        mask &= j <= p
    if window >= 0:
        mask &= j >= p - window
    return mask


def _sdpa(q, k, v, mask, scale=None):
    """SDPA in q's dtype on (B, S, H, D) tensors with GQA expanded; rows of mask all False -> NaN."""
    group = q.shape[2] // k.shape[2]
    qt = q.transpose(1, 2)
    kt = k.repeat_interleave(group, dim=2).transpose(1, 2)
    vt = v.repeat_interleave(group, dim=2).transpose(1, 2)
    o = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask.to(q.device), scale=scale)
    return o.transpose(1, 2)


# (B, Sq, Sk, Hq, Hkv, D, causal, window_left): no sinks, which SDPA lacks
SDPA_CASES = [
    pytest.param(2, 113, 113, 4, 4, 64, False, -1, id="full"),
    pytest.param(1, 113, 239, 8, 2, 128, True, -1, id="causal-sq<sk"),
    pytest.param(1, 239, 113, 4, 1, 128, True, 127, id="causal-sq>sk-win127"),
    pytest.param(1, 65, 65, 8, 1, 256, True, 1, id="d256-win1"),
]


@pytest.mark.parametrize("b,sq,sk,hq,hkv,d,causal,window", SDPA_CASES)
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=["bf16", "fp16"])
def test_fmha_matches_sdpa(gen, device, dtype, b, sq, sk, hq, hkv, d, causal, window):
    q = randn(gen, b, sq, hq, d, dtype=dtype, device=device)
    k = randn(gen, b, sk, hkv, d, dtype=dtype, device=device)
    v = randn(gen, b, sk, hkv, d, dtype=dtype, device=device)
    mask = _visible_mask(sq, sk, causal, window)
    rows = mask.any(dim=1).to(device)  # SDPA: NaN where nothing is visible; compare the rest
    out = ops.fmha(q, k, v, causal=causal, window_left=window)
    sdpa_fp32 = _sdpa(q.float(), k.float(), v.float(), mask)
    assert_close_to_ref(out[:, rows], sdpa_fp32[:, rows], dtype, what="out vs SDPA fp32")
    assert (out[:, ~rows] == 0).all()

    # FlashAttention's rule: our error against the float64 oracle is at most twice SDPA's own
    # error in the same low precision, plus a small floor.
    want, _ = ref.attention(q, k, v, causal=causal, window_left=window)  # float64 on CPU
    sdpa_low = _sdpa(q, k, v, mask)
    rows = rows.cpu()
    ours_err = rel_rms(out.cpu()[:, rows], want[:, rows])
    sdpa_err = rel_rms(sdpa_low.cpu()[:, rows], want[:, rows])
    assert ours_err <= 2 * sdpa_err + 0.05 * REL_RMS_TOL[dtype], (
        f"rel-RMS error {ours_err:.3e} vs SDPA {dtype} {sdpa_err:.3e}")


# ----------------------------------------------------------------------------- contract


def test_fmha_does_not_modify_inputs(gen, device):
    lens_q, lens_k = [3, 0, 65, 1], [7, 5, 64, 113]
    q = randn(gen, sum(lens_q), 4, 64, device=device)
    k = randn(gen, sum(lens_k), 2, 64, device=device)
    v = randn(gen, sum(lens_k), 2, 64, device=device)
    sinks = randn(gen, 4, dtype=torch.float32, device=device)
    cu_q, cu_k = cu_seqlens(lens_q, device), cu_seqlens(lens_k, device)
    args = (q, k, v, sinks, cu_q, cu_k)
    before = [t.clone() for t in args]
    ops.fmha(q, k, v, causal=True, window_left=1, sinks=sinks, cu_seqlens_q=cu_q,
             cu_seqlens_k=cu_k, return_lse=True)
    qd, kd = q[None, :64], k[None, :64]
    before_dense = [qd.clone(), kd.clone()]
    ops.fmha(qd, kd, kd, causal=True, return_lse=True)
    for a, b in zip(args + (qd, kd), before + before_dense):
        assert torch.equal(a, b)


def test_fmha_return_lse_flag(gen, device):
    q = randn(gen, 1, 7, 2, 64, device=device)
    out = ops.fmha(q, q, q)
    assert isinstance(out, torch.Tensor) and out.shape == q.shape
    out2, lse = ops.fmha(q, q, q, return_lse=True)
    assert torch.equal(out, out2) and lse.shape == (1, 2, 7)


def test_fmha_path_names_an_implementation(gen, device):
    q = randn(gen, 1, 7, 2, 64, device=device)
    path = ops.fmha_path(q, q, q, causal=True)
    if device.type == "cpu":
        assert path == "reference"
    else:
        assert path in ("sm90", "reference")
