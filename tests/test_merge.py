"""dsv4.merge_attn_states: merging fmha over two disjoint key halves equals fmha over all keys.

Split points include 0 and Sk, so one side is empty (Sk = 0: out = 0, lse = -inf) and the
merge must pass the other side through without NaN. Dense and varlen layouts.
"""
import math

import pytest
import torch

from dsv4_attn import ops
from dsv4_attn import reference as ref

from conftest import (HALF_DTYPES, assert_close_to_ref, assert_lse_close, cu_seqlens, rand,
                      randn)


@pytest.mark.parametrize("split", [0, 1, 100, 239], ids=lambda s: f"split{s}")
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=["bf16", "fp16"])
def test_merge_dense_halves(gen, device, dtype, split):
    b, sq, sk, hq, hkv, d = 2, 65, 239, 8, 2, 128
    q = randn(gen, b, sq, hq, d, dtype=dtype, device=device)
    k = randn(gen, b, sk, hkv, d, dtype=dtype, device=device)
    v = randn(gen, b, sk, hkv, d, dtype=dtype, device=device)
    out_a, lse_a = ops.fmha(q, k[:, :split], v[:, :split], return_lse=True)
    out_b, lse_b = ops.fmha(q, k[:, split:], v[:, split:], return_lse=True)
    out, lse = ops.merge_attn_states(out_a, lse_a, out_b, lse_b)

    assert out.dtype == dtype and out.shape == (b, sq, hq, d) and out.device == q.device
    want_out, want_lse = ref.attention(q, k, v)
    assert_close_to_ref(out, want_out, dtype)
    assert_lse_close(lse, want_lse)
    whole_out, whole_lse = ops.fmha(q, k, v, return_lse=True)
    assert_close_to_ref(out, whole_out, dtype, what="merged vs whole fmha")
    assert_lse_close(lse, whole_lse, atol=1e-4, what="merged lse vs whole fmha")
    if split in (0, sk):  # one side empty: the other passes through unchanged
        full_side = out_b if split == 0 else out_a
        assert torch.equal(out, full_side)


def _split_varlen(x, lens, splits):
    """Per sequence i, rows [0, splits[i]) go to side a and the rest to side b."""
    a, b, start = [], [], 0
    for n, s in zip(lens, splits):
        a.append(x[start:start + s])
        b.append(x[start + s:start + n])
        start += n
    return torch.cat(a), torch.cat(b)


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=["bf16", "fp16"])
def test_merge_varlen_halves(gen, device, dtype):
    lens_q = [3, 0, 65, 1, 7]
    lens_k = [7, 5, 64, 113, 0]
    splits = [0, 2, 64, 50, 0]  # sequence 0: side a empty; sequence 2: side b empty
    hq, hkv, d = 4, 1, 64
    q = randn(gen, sum(lens_q), hq, d, dtype=dtype, device=device)
    k = randn(gen, sum(lens_k), hkv, d, dtype=dtype, device=device)
    v = randn(gen, sum(lens_k), hkv, d, dtype=dtype, device=device)
    cu_q = cu_seqlens(lens_q, device)
    k_a, k_b = _split_varlen(k, lens_k, splits)
    v_a, v_b = _split_varlen(v, lens_k, splits)
    cu_a = cu_seqlens(splits, device)
    cu_b = cu_seqlens([n - s for n, s in zip(lens_k, splits)], device)

    out_a, lse_a = ops.fmha(q, k_a, v_a, cu_seqlens_q=cu_q, cu_seqlens_k=cu_a, return_lse=True)
    out_b, lse_b = ops.fmha(q, k_b, v_b, cu_seqlens_q=cu_q, cu_seqlens_k=cu_b, return_lse=True)
    out, lse = ops.merge_attn_states(out_a, lse_a, out_b, lse_b)

    assert out.shape == q.shape and lse.shape == (hq, sum(lens_q))
    want_out, want_lse = ref.attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_seqlens(
        lens_k, device))
    assert_close_to_ref(out, want_out, dtype)
    # The last sequence has no keys on either side: -inf lse and exact zeros, no NaN.
    assert_lse_close(lse, want_lse)
    assert (out[-lens_q[-1]:] == 0).all()


@pytest.mark.parametrize("layout", ["dense", "varlen"])
@pytest.mark.parametrize("dtype", HALF_DTYPES + [torch.float32], ids=["bf16", "fp16", "fp32"])
def test_merge_matches_oracle_on_random_states(gen, device, dtype, layout):
    # Arbitrary (out, lse) pairs, including rows where one or both sides are -inf.
    shape_out = (2, 65, 4, 64) if layout == "dense" else (113, 4, 64)
    shape_lse = (2, 4, 65) if layout == "dense" else (4, 113)
    out_a = randn(gen, *shape_out, dtype=dtype, device=device)
    out_b = randn(gen, *shape_out, dtype=dtype, device=device)
    lse_a = 4 * randn(gen, *shape_lse, dtype=torch.float32, device=device)
    lse_b = 4 * randn(gen, *shape_lse, dtype=torch.float32, device=device)
    drop_a = rand(gen, *shape_lse, device=device) < 0.2
    drop_b = rand(gen, *shape_lse, device=device) < 0.2
    lse_a = lse_a.masked_fill(drop_a, -math.inf)
    lse_b = lse_b.masked_fill(drop_b, -math.inf)
    # fmha writes out = 0 where lse = -inf; do the same so the oracle's view is consistent.
    to_out = (lambda m: m.transpose(1, 2).unsqueeze(-1)) if layout == "dense" else (
        lambda m: m.t().unsqueeze(-1))
    out_a = out_a.masked_fill(to_out(drop_a), 0)
    out_b = out_b.masked_fill(to_out(drop_b), 0)

    out, lse = ops.merge_attn_states(out_a, lse_a, out_b, lse_b)
    want_out, want_lse = ref.merge_attn_states(out_a, lse_a, out_b, lse_b)
    assert out.dtype == dtype
    assert_close_to_ref(out, want_out, dtype)
    assert_lse_close(lse, want_lse, atol=1e-5)
    both = (drop_a & drop_b).cpu()
    assert both.any() and (out.cpu()[to_out(both).squeeze(-1)] == 0).all()


def test_merge_does_not_modify_inputs(gen, device):
    out_a = randn(gen, 2, 7, 4, 64, device=device)
    out_b = randn(gen, 2, 7, 4, 64, device=device)
    lse_a = randn(gen, 2, 4, 7, dtype=torch.float32, device=device)
    lse_b = randn(gen, 2, 4, 7, dtype=torch.float32, device=device).masked_fill(
        rand(gen, 2, 4, 7, device=device) < 0.3, -math.inf)
    args = (out_a, lse_a, out_b, lse_b)
    before = [t.clone() for t in args]
    ops.merge_attn_states(*args)
    for a, b in zip(args, before):
        assert torch.equal(a, b)


def _is_sm90():
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.gpu
@pytest.mark.skipif(not _is_sm90(), reason="the fused merge kernel runs on sm_90")
@pytest.mark.parametrize("layout", ["dense", "varlen", "strided", "odd_dv"])
@pytest.mark.parametrize("dtype", HALF_DTYPES + [torch.float32], ids=["bf16", "fp16", "fp32"])
def test_merge_kernel_matches_aten_composition(gen, monkeypatch, dtype, layout):
    """The fused kernel against the ATen composition (DSV4_DISABLE_SM90=1) and the oracle:
    -inf on side a, on side b and on both, views with strides (16-byte chunks) and a Dv that
    allows no 16-byte chunk (one element per thread), poisoned outputs."""
    from conftest import poison_allocator

    b, t, h = 3, 70, 5
    dv = 12 if layout == "odd_dv" else 128
    if layout == "strided":  # (B, H, T, Dv) storage seen as (B, T, H, Dv); lse (B, T, H) as (B, H, T)
        out_a = randn(gen, b, h, t, dv, dtype=dtype, device="cuda").transpose(1, 2)
        out_b = randn(gen, b, h, t, dv, dtype=dtype, device="cuda").transpose(1, 2)
        lse_a = (randn(gen, b, t, h, dtype=torch.float32, device="cuda") * 3).transpose(1, 2)
        lse_b = (randn(gen, b, t, h, dtype=torch.float32, device="cuda") * 3).transpose(1, 2)
    elif layout == "varlen":
        out_a = randn(gen, b * t, h, dv, dtype=dtype, device="cuda")
        out_b = randn(gen, b * t, h, dv, dtype=dtype, device="cuda")
        lse_a = randn(gen, h, b * t, dtype=torch.float32, device="cuda") * 3
        lse_b = randn(gen, h, b * t, dtype=torch.float32, device="cuda") * 3
    else:
        out_a = randn(gen, b, t, h, dv, dtype=dtype, device="cuda")
        out_b = randn(gen, b, t, h, dv, dtype=dtype, device="cuda")
        lse_a = randn(gen, b, h, t, dtype=torch.float32, device="cuda") * 3
        lse_b = randn(gen, b, h, t, dtype=torch.float32, device="cuda") * 3
    # Empty sides: -inf on a alone, on b alone, on both (their out rows hold zeros, as fmha's).
    mask = rand(gen, *lse_a.shape, device="cuda")
    lse_a = lse_a.masked_fill(mask < 0.15, -math.inf)
    lse_b = lse_b.masked_fill((mask > 0.1) & (mask < 0.25), -math.inf)

    poison_allocator(4 * out_a.numel() * 4 + (1 << 20), "cuda")
    out, lse = ops.merge_attn_states(out_a, lse_a, out_b, lse_b)
    monkeypatch.setenv("DSV4_DISABLE_SM90", "1")
    want_out, want_lse = ops.merge_attn_states(out_a, lse_a, out_b, lse_b)
    monkeypatch.delenv("DSV4_DISABLE_SM90")

    assert out.is_contiguous() and lse.is_contiguous()
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    assert torch.equal(torch.isinf(lse), torch.isinf(want_lse))
    torch.testing.assert_close(lse, want_lse, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out.float(), want_out.float(), rtol=1e-2 if dtype != torch.float32
                               else 1e-6, atol=1e-5)
    # And the oracle, float64 throughout: within a few roundings of the output dtype (the fp32
    # weights' exp and the two products and the sum each round once).
    la, lb = lse_a.double(), lse_b.double()
    lse64 = torch.logaddexp(la, lb)
    shift = torch.where(torch.isinf(lse64), torch.zeros_like(lse64), lse64)
    if out_a.dim() == 4:
        wa, wb = [torch.exp(x - shift).transpose(1, 2)[..., None] for x in (la, lb)]
    else:
        wa, wb = [torch.exp(x - shift).t()[..., None] for x in (la, lb)]
    want64 = out_a.double() * wa + out_b.double() * wb
    assert (out.double() - want64).abs().max().item() <= 8 * torch.finfo(dtype).eps * (
        want64.abs().max().item() + 1)
