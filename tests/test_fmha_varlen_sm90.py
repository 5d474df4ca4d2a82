"""GPU tests of varlen fmha on the sm90 kernels (D = 64/128/256, and D = 512 with k is v):
the work schedule is built on the device from cu_seqlens, with no host sync.

Each sequence is checked against the float64 oracle by FlashAttention's rule (as in
test_fmha_sm90), and against a dense sm90 call on that sequence alone, which must agree
bitwise: a varlen tile computes the same tiles of the same rows, and the rows of the next
sequence that a boundary tile loads are masked to exact zeros. (Split-KV is pinned off for
that comparison: the plan counts work tiles, which differ between the two calls; and dense
calls at head_dim 128 are pinned to the varlen kernels' 128 keys per tile.) Lengths 0, 1, 7, 63, 64, 65,
1000 and 8192 share one batch; causal, windows, sinks, MHA/GQA/MQA; poisoned outputs,
determinism, and CUDA-graph replay with new cu_seqlens contents.
"""
import math
import random

import pytest
import torch

import dsv4_attn

from conftest import poison_allocator, stable_seed
from test_fmha_sm90 import lowp_reference, needs_sm90, oracle

pytestmark = [pytest.mark.gpu, needs_sm90]

MIXED = [0, 1, 7, 63, 64, 65, 1000, 8192]


def _cu(lens):
    return torch.tensor([0] + list(lens), device="cuda").cumsum(0).to(torch.int32)


def _inputs(lens_q, lens_k, hq, hkv, d, dtype, gen, k_is_v):
    def rand(*shape):
        return torch.randn(*shape, generator=gen, device="cuda").to(dtype)

    q = rand(sum(lens_q), hq, d)
    k = rand(sum(lens_k), hkv, d)
    v = k if k_is_v else rand(sum(lens_k), hkv, d)
    return q, k, v


def check_varlen(lens_q, lens_k, hq, hkv, d, causal, window, with_sinks, dtype=torch.bfloat16,
                 seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = _inputs(lens_q, lens_k, hq, hkv, d, dtype, gen, k_is_v=d == 512)
    sinks = torch.randn(hq, generator=gen, device="cuda") * 2 if with_sinks else None
    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    kw = dict(causal=causal, window_left=window, sinks=sinks, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    assert dsv4_attn.fmha_path(q, k, v, **kw) == "sm90"
    max_q, max_k = max(lens_q), max(lens_k)

    poison_allocator(2 * q.numel() * 4 + (1 << 20), "cuda")
    out, lse = dsv4_attn.fmha(q, k, v, max_seqlen_q=max_q, max_seqlen_k=max_k, return_lse=True, **kw)
    assert out.shape == (q.shape[0], hq, v.shape[-1]) and lse.shape == (hq, q.shape[0])
    assert not torch.isnan(out).any(), "NaN (or an unwritten poisoned element) in out"
    assert not torch.isnan(lse).any(), "NaN (or an unwritten poisoned element) in lse"

    scale = 1.0 / math.sqrt(d)
    for i, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        if lq == 0:
            continue
        qs, ks = slice(cu_q[i].item(), cu_q[i + 1].item()), slice(cu_k[i].item(), cu_k[i + 1].item())
        qi, ki, vi = q[qs][None], k[ks][None], v[ks][None]
        got_out, got_lse = out[qs][None], lse[:, qs][None]
        if lk > 0:  # the same sequence as a dense call: bitwise equal
            dense_out, dense_lse = dsv4_attn.fmha(qi, ki, vi, causal=causal, window_left=window,
                                                  sinks=sinks, return_lse=True)
            assert dsv4_attn.fmha_path(qi, ki, vi, causal=causal, window_left=window,
                                       sinks=sinks) == "sm90"
            assert torch.equal(got_out, dense_out), f"sequence {i} ({lq}, {lk}): out != dense call"
            assert torch.equal(got_lse, dense_lse), f"sequence {i} ({lq}, {lk}): lse != dense call"
        if lq * lk * hq > 2 ** 28:  # the float64 oracle of one 8192-token sequence, head by head
            heads = range(hq)
        else:
            heads = [slice(None)]
        for h in heads:
            hs = slice(h, h + 1) if isinstance(h, int) else h
            kvs = slice(h * hkv // hq, h * hkv // hq + 1) if isinstance(h, int) else h
            s_i = sinks[hs] if sinks is not None else None
            ref_out, ref_lse = oracle(qi[:, :, hs], ki[:, :, kvs], vi[:, :, kvs], scale, causal,
                                      window, s_i)
            low_out, low_lse = lowp_reference(qi[:, :, hs], ki[:, :, kvs], vi[:, :, kvs], scale,
                                              causal, window, s_i)
            o, l = got_out[:, :, hs], got_lse[:, hs]
            err = (o.double() - ref_out).abs().max().item()
            tol = 2 * (low_out.double() - ref_out).abs().max().item() + 1e-3
            assert err <= tol, f"sequence {i} ({lq}, {lk}): out error {err:.3e} > {tol:.3e}"
            finite = torch.isfinite(ref_lse)
            assert torch.equal(torch.isfinite(l), finite), "lse is -inf where nothing is visible"
            if finite.any():
                lerr = (l.double() - ref_lse)[finite].abs().max().item()
                ltol = 2 * (low_lse.double() - ref_lse)[finite].abs().max().item() + 1e-3
                assert lerr <= ltol, f"sequence {i}: lse error {lerr:.3e} > {ltol:.3e}"

    again = dsv4_attn.fmha(q, k, v, max_seqlen_q=max_q, max_seqlen_k=max_k, return_lse=True, **kw)
    assert torch.equal(out, again[0]) and torch.equal(lse, again[1]), "two runs differ"


def _cases():
    rng = random.Random(4321)
    cases = []
    for d in (64, 128, 256):
        for causal in (False, True):  # every length in one batch, 8192 included
            lens = MIXED[:]
            rng.shuffle(lens)
            cases.append((tuple(lens), tuple(lens), 4, 1, d, causal, -1, causal))
        for hq, hkv in ((8, 8), (8, 2), (16, 2), (8, 1)):  # MHA, GQA 4 and 8, MQA
            lens = MIXED[:-1] + [300]
            rng.shuffle(lens)
            window = rng.choice([-1, 0, 1, 127, 1000])
            cases.append((tuple(lens), tuple(lens), hq, hkv, d, rng.random() < 0.7, window,
                          rng.random() < 0.5))
        # Sq != Sk per sequence (chunked prefill and decode), and sequences with no keys.
        cases.append(((1, 5, 0, 64, 100, 3), (1000, 5, 7, 64, 3000, 0), 8, 2, d, True, -1, True))
        cases.append(((1,) * 9, (1, 2, 63, 64, 65, 128, 1000, 4097, 0), 8, 1, d, False, 127, False))
    # head_dim 512, k is v: 64 and 128 heads over one KV head, GQA 8/1, and one head.
    for hq, hkv in ((64, 1), (128, 1), (8, 1), (1, 1), (16, 2)):
        cases.append(((0, 1, 65, 1000, 300, 7), (0, 1, 65, 1000, 300, 7), hq, hkv, 512, True,
                      127, True))
    cases.append(((1, 1, 1, 2, 4), (700, 1, 5000, 64, 0), 128, 1, 512, True, -1, False))
    cases.append(((130, 64, 1), (200, 64, 1), 64, 1, 512, False, -1, True))
    return cases


@pytest.fixture(autouse=True)
def _dense_calls_like_varlen(monkeypatch):
    """The dense calls that varlen must match bitwise compute the same tiles: no split, and at
    head_dim 128 the varlen kernels' 128 keys per tile (dense full rows would take 176)."""
    monkeypatch.setenv("DSV4_SPLIT_KV", "1")
    monkeypatch.setenv("DSV4_FMHA_D128_BLOCK_N", "128")


@pytest.mark.parametrize("lens_q,lens_k,hq,hkv,d,causal,window,sinks", _cases())
def test_fmha_varlen_sm90_matches_oracle_and_dense(lens_q, lens_k, hq, hkv, d, causal, window,
                                                   sinks):
    check_varlen(list(lens_q), list(lens_k), hq, hkv, d, causal, window, sinks,
                 seed=stable_seed(lens_q, lens_k, hq, d, causal, window))


@pytest.mark.parametrize("d", [128, 512])
def test_fmha_varlen_sm90_fp16(d):
    check_varlen([5, 0, 200, 64], [5, 9, 300, 64], 8, 1, d, True, -1, True, dtype=torch.float16,
                 seed=d)


def test_fmha_varlen_sm90_int64_cu_seqlens_and_no_max_seqlen():
    """int64 cu_seqlens, and max_seqlen left at -1 (read from cu_seqlens: a sync, same answer)."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    lens = [70, 0, 129]
    q, k, v = _inputs(lens, lens, 4, 2, 128, torch.bfloat16, gen, k_is_v=False)
    cu = _cu(lens)
    want = dsv4_attn.fmha(q, k, v, causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu,
                          max_seqlen_q=129, max_seqlen_k=129, return_lse=True)
    got = dsv4_attn.fmha(q, k, v, causal=True, cu_seqlens_q=cu.long(), cu_seqlens_k=cu.long(),
                         return_lse=True)
    assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1])


@pytest.mark.parametrize("d", [128, 512])
def test_fmha_varlen_sm90_cuda_graph_replay_with_new_lengths(d):
    """Capturable: the schedule is built on the device, so a replay follows new cu_seqlens
    contents (same N and totals) as well as new q/k/v."""
    gen = torch.Generator(device="cuda").manual_seed(d)
    n_total, hq, hkv = 900, 16, 1 if d == 512 else 4
    q, k, v = _inputs([n_total], [n_total], hq, hkv, d, torch.bfloat16, gen, k_is_v=d == 512)
    cu_q, cu_k = _cu([300, 0, 600]), _cu([300, 0, 600])
    sinks = torch.randn(hq, generator=gen, device="cuda")
    kw = dict(causal=True, sinks=sinks, max_seqlen_q=n_total, max_seqlen_k=n_total)
    dsv4_attn.fmha(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, **kw)  # warm-up, uncaptured
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = dsv4_attn.fmha(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, return_lse=True,
                                  **kw)
    for lens_q, lens_k in (([1, 899, 0], [1, 899, 0]), ([450, 50, 400], [450, 50, 400]),
                           ([100, 100, 700], [300, 0, 600])):
        fresh = _inputs([n_total], [n_total], hq, hkv, d, torch.bfloat16, gen, k_is_v=d == 512)
        q.copy_(fresh[0])
        k.copy_(fresh[1])
        if v is not k:
            v.copy_(fresh[2])
        cu_q.copy_(_cu(lens_q))
        cu_k.copy_(_cu(lens_k))
        graph.replay()
        want = dsv4_attn.fmha(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, return_lse=True, **kw)
        assert torch.equal(out, want[0]) and torch.equal(lse, want[1])


@pytest.mark.parametrize("d,hq,hkv,max_seqlen_k", [(64, 8, 8, 1 << 24), (128, 16, 4, 1 << 24),
                                                  (256, 8, 2, 1 << 24), (128, 12, 6, 16384)])
def test_fmha_varlen_sm90_head_sections(d, hq, hkv, max_seqlen_k):
    """A varlen call walks each sequence's tiles in sections of whole KV heads whose K/V fit in
    L2 at max_seqlen_k (fmha_section_units). A larger max_seqlen_k, still a valid bound, cuts
    the heads into more sections: one KV head each at 1 << 24, and at 16384 with head_dim 128
    3 of 6 KV heads (4 fit, 3 is the largest divisor of 6 that does). The answer must not
    move, bitwise, and each sequence must match its dense call."""
    gen = torch.Generator(device="cuda").manual_seed(d + hq)
    lens = [1000, 0, 65, 3000, 7, 129]
    q, k, v = _inputs(lens, lens, hq, hkv, d, torch.bfloat16, gen, k_is_v=False)
    sinks = torch.randn(hq, generator=gen, device="cuda")
    cu = _cu(lens)
    kw = dict(causal=True, sinks=sinks, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=3000,
              return_lse=True)
    want = dsv4_attn.fmha(q, k, v, max_seqlen_k=3000, **kw)  # one section of every head
    poison_allocator(2 * q.numel() * 4 + (1 << 20), "cuda")
    got = dsv4_attn.fmha(q, k, v, max_seqlen_k=max_seqlen_k, **kw)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    starts = cu.tolist()
    for i in (0, 3, 5):
        s, e = starts[i], starts[i + 1]
        dense = dsv4_attn.fmha(q[s:e][None], k[s:e][None], v[s:e][None], causal=True,
                               sinks=sinks, return_lse=True)
        assert torch.equal(got[0][s:e], dense[0][0]), f"sequence {i}"
        assert torch.equal(got[1][:, s:e], dense[1][0]), f"sequence {i}"


def test_fmha_varlen_sm90_many_sequences_longest_last():
    """More sequences than a CTA has threads (the schedule's scans run in chunks), the longest
    one last in cu_seqlens, against dense calls of each sequence."""
    rng = random.Random(9)
    lens = [rng.choice([0, 1, 3, 17, 64, 65]) for _ in range(1500)] + [3000]
    gen = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = _inputs(lens, lens, 2, 1, 64, torch.bfloat16, gen, k_is_v=False)
    cu = _cu(lens)
    out = dsv4_attn.fmha(q, k, v, causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu,
                         max_seqlen_q=3000, max_seqlen_k=3000)
    starts = cu.tolist()
    for i in [0, 1, 2, 700, 1499, 1500]:
        s, e = starts[i], starts[i + 1]
        if e == s:
            continue
        dense = dsv4_attn.fmha(q[s:e][None], k[s:e][None], v[s:e][None], causal=True)
        assert torch.equal(out[s:e], dense[0]), f"sequence {i}"


def test_fmha512_varlen_split_kv_decode(monkeypatch):
    """Varlen decode at D = 512 with the key range split over 5 CTAs and combined."""
    monkeypatch.setenv("DSV4_SPLIT_KV", "5")
    gen = torch.Generator(device="cuda").manual_seed(12)
    lens_q, lens_k = [1, 2, 0, 1], [1500, 700, 9, 64]
    q, k, v = _inputs(lens_q, lens_k, 64, 1, 512, torch.bfloat16, gen, k_is_v=True)
    sinks = torch.randn(64, generator=gen, device="cuda")
    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    out, lse = dsv4_attn.fmha(q, k, v, causal=True, sinks=sinks, cu_seqlens_q=cu_q,
                              cu_seqlens_k=cu_k, max_seqlen_q=2, max_seqlen_k=1500,
                              return_lse=True)
    for i in range(4):
        qs = slice(cu_q[i].item(), cu_q[i + 1].item())
        ks = slice(cu_k[i].item(), cu_k[i + 1].item())
        if qs.stop == qs.start:
            continue
        ref_out, ref_lse = oracle(q[qs][None], k[ks][None], v[ks][None], 1 / math.sqrt(512), True,
                                  -1, sinks)
        assert (out[qs][None].double() - ref_out).abs().max().item() < 2e-2
        assert (lse[:, qs][None].double() - ref_lse).abs().max().item() < 1e-3
