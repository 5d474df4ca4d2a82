"""dsv4_attn.flash_mla_compat: FlashMLA's sparse interface on our ops. Against our own op and a
float64 computation of FlashMLA's documented semantics (lse without the sink, +inf where no row
is read, the sink's factor on out), everywhere; against FlashMLA's own kernels when the peer is
loaded (DSV4_PEER_FLASHMLA, GPU).
"""
import math
import os

import pytest
import torch

import dsv4_attn
from dsv4_attn import flash_mla_compat as fmc
from dsv4_attn import reference as ref

from conftest import assert_close_to_ref, assert_lse_close, randn
from test_dsv4_attention_paged import new_cache, slot_lists

D = 512


def _flash_mla_lse(lse):
    return torch.where(lse == -math.inf, math.inf, lse)


def _decode_case(gen, device, b=2, s_q=2, h=8, w=20, k=12, sinks=True):
    q = randn(gen, b, s_q, h, D, device=device)
    swa, comp = new_cache(2, 64, device), new_cache(3, 2, device)
    ws, _ = slot_lists(gen, b * s_q, w, 128, device)
    cs, _ = slot_lists(gen, b * s_q, k, 6, device)
    lens = torch.randint(0, w + 1, (b,), generator=gen, dtype=torch.int32).to(device)
    clens = torch.randint(0, k + 1, (b,), generator=gen, dtype=torch.int32).to(device)
    lens[0] = 0  # batch 0 reads no window row ...
    clens[0] = 0  # ... and no compressed row: out 0, lse +inf (with or without the sink)
    sink = randn(gen, h, dtype=torch.float32, device=device) if sinks else None
    return q, swa, comp, ws.view(b, s_q, w), cs.view(b, s_q, k), lens, clens, sink


def test_with_kvcache_matches_the_paged_op_and_oracle(gen, device):
    q, swa, comp, ws, cs, lens, clens, sink = _decode_case(gen, device)
    b, s_q, h, _ = q.shape
    sched, none = fmc.get_mla_metadata()
    assert none is None
    out, lse = fmc.flash_mla_with_kvcache(
        q, swa, None, None, 512, sched, softmax_scale=0.05, is_fp8_kvcache=True, indices=ws,
        attn_sink=sink, extra_k_cache=comp, extra_indices_in_kvcache=cs, topk_length=lens,
        extra_topk_length=clens)
    assert out.shape == (b, s_q, h, D) and lse.shape == (b, h, s_q) and lse.is_contiguous()
    per_token = dict(window_lengths=lens.repeat_interleave(s_q), compressed_cache=comp,
                     compressed_slots=cs.reshape(b * s_q, -1),
                     compressed_lengths=clens.repeat_interleave(s_q), sinks=sink, scale=0.05)
    want_out, want_lse = ref.dsv4_attention_paged(q.reshape(b * s_q, h, D), swa,
                                                  ws.reshape(b * s_q, -1), **per_token)
    assert_close_to_ref(out.reshape(b * s_q, h, D), want_out, torch.bfloat16)
    assert (out[0] == 0).all()
    want_lse = want_lse.view(h, b, s_q).permute(1, 0, 2)
    assert (lse[0] == math.inf).all() and torch.isfinite(lse[1]).all()
    assert_lse_close(lse[1:], want_lse[1:], atol=2e-3)
    # The same call writing into out=, and reusing the metadata.
    buf = torch.full_like(q, float("nan"))
    got, _ = fmc.flash_mla_with_kvcache(
        q, swa, None, None, 512, sched, softmax_scale=0.05, is_fp8_kvcache=True, indices=ws,
        attn_sink=sink, extra_k_cache=comp, extra_indices_in_kvcache=cs, topk_length=lens,
        extra_topk_length=clens, out=buf)
    assert got is buf and torch.equal(buf, out)


def _sparse_fwd_oracle(q, kv, idx, scale, sink, lengths):
    """FlashMLA's documented sparse prefill, float64: out, max_logits, lse (+inf if empty)."""
    q, kv = q.double().cpu(), kv.double().cpu()[:, 0]
    s_q, h, _ = q.shape
    out = torch.zeros(s_q, h, D, dtype=torch.float64)
    mx = torch.full((s_q, h), -math.inf, dtype=torch.float64)
    lse = torch.full((s_q, h), math.inf, dtype=torch.float64)
    for i in range(s_q):
        n = idx.shape[-1] if lengths is None else int(lengths[i])
        rows = [r for r in idx[i, 0, :n].tolist() if 0 <= r < kv.shape[0]]
        if not rows:
            continue
        keys = kv[rows]
        s = scale * q[i] @ keys.T
        mx[i], lse[i] = s.amax(-1), torch.logsumexp(s, -1)
        out[i] = torch.softmax(s, -1) @ keys
        if sink is not None:
            out[i] *= torch.sigmoid(lse[i] - sink.double().cpu()).unsqueeze(-1)
    return out, mx, lse


@pytest.mark.parametrize("with_sink", [False, True])
def test_sparse_fwd_matches_oracle(gen, device, with_sink):
    s_q, s_kv, h, k = 40, 90, 16, 24
    q = randn(gen, s_q, h, D, device=device)
    kv = randn(gen, s_kv, 1, D, device=device)
    idx = torch.randint(-1, s_kv + 3, (s_q, 1, k), generator=gen, dtype=torch.int32)
    idx[..., -1] = idx[..., 0]  # a repeat
    idx[0] = -1  # query 0 reads nothing
    lengths = torch.randint(0, k + 1, (s_q,), generator=gen, dtype=torch.int32)
    sink = randn(gen, h, dtype=torch.float32, device=device) if with_sink else None
    out, mx, lse = fmc.flash_mla_sparse_fwd(q, kv, idx.to(device), 0.06, attn_sink=sink,
                                            topk_length=lengths.to(device))
    want, want_mx, want_lse = _sparse_fwd_oracle(q, kv, idx, 0.06, sink, lengths)
    assert_close_to_ref(out, want, torch.bfloat16)
    assert torch.allclose(mx.double().cpu(), want_mx, atol=1e-3, rtol=0)
    assert torch.equal(lse.cpu() == math.inf, want_lse == math.inf)
    fin = want_lse != math.inf
    assert (lse.double().cpu()[fin] - want_lse[fin]).abs().max() < 2e-3


def test_unserved_modes_say_so():
    q = torch.zeros(1, 1, 8, D, dtype=torch.bfloat16)
    cache = new_cache(1, 64, "cpu")
    sched, _ = fmc.get_mla_metadata()
    with pytest.raises(NotImplementedError, match="dense decode"):
        fmc.flash_mla_with_kvcache(q, cache, torch.zeros(1, 1, dtype=torch.int32),
                                   torch.ones(1, dtype=torch.int32), 512, sched)
    with pytest.raises(NotImplementedError, match="is_fp8_kvcache=True"):
        fmc.flash_mla_with_kvcache(q, cache, None, None, 512, sched,
                                   indices=torch.zeros(1, 1, 4, dtype=torch.int32))
    v32 = torch.zeros(1, 64, 1, 656, dtype=torch.uint8)
    with pytest.raises(NotImplementedError, match="656-byte"):
        fmc.flash_mla_with_kvcache(q, v32, None, None, 512, sched, is_fp8_kvcache=True,
                                   indices=torch.zeros(1, 1, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match="topk_length must be"):
        fmc.flash_mla_with_kvcache(q, cache, None, None, 512, sched, is_fp8_kvcache=True,
                                   indices=torch.zeros(1, 1, 4, dtype=torch.int32),
                                   topk_length=torch.zeros(3, dtype=torch.int32))
    with pytest.raises(NotImplementedError, match="d_v = 512"):
        fmc.flash_mla_sparse_fwd(torch.zeros(2, 8, 576, dtype=torch.bfloat16),
                                 torch.zeros(4, 1, 576, dtype=torch.bfloat16),
                                 torch.zeros(2, 1, 4, dtype=torch.int32), 0.1)


# ------------------------------------------------------------------ against FlashMLA (GPU peer)


def _flashmla():
    path = os.environ.get("DSV4_PEER_FLASHMLA")
    if not path or not torch.cuda.is_available():
        pytest.skip("the FlashMLA peer is not loaded (DSV4_PEER_FLASHMLA) or no GPU")
    torch.ops.load_library(path)
    return torch.ops._flashmla_C


@pytest.mark.gpu
def test_with_kvcache_matches_flashmla():
    """FlashMLA's sparse FP8 decode and ours on the same pages: B = 4 tokens, 64 heads, a
    window list of 128 and a compressed list of 512, per-token lengths, the sink."""
    peer = _flashmla()
    gen = torch.Generator().manual_seed(44)
    b, h = 4, 64
    q = randn(gen, b, 1, h, D, device="cuda")
    swa, comp = new_cache(4, 64, "cuda"), new_cache(16, 64, "cuda")
    ws = torch.randperm(256, generator=gen)[:128].repeat(b, 1).to(torch.int32).cuda().view(b, 1, 128)
    cs = torch.randperm(1024, generator=gen)[:512].repeat(b, 1).to(torch.int32).cuda().view(b, 1, 512)
    lens = torch.tensor([128, 100, 7, 0], dtype=torch.int32, device="cuda")
    clens = torch.tensor([512, 300, 0, 64], dtype=torch.int32, device="cuda")
    sink = randn(gen, h, dtype=torch.float32, device="cuda")
    scale = D ** -0.5
    theirs, their_lse = peer.sparse_decode_fwd(q, swa, ws, lens, sink, None, None, comp, cs, clens,
                                               D, scale, None)[:2]
    sched, _ = fmc.get_mla_metadata()
    ours, lse = fmc.flash_mla_with_kvcache(q, swa, None, None, D, sched, softmax_scale=scale,
                                           is_fp8_kvcache=True, indices=ws, attn_sink=sink,
                                           extra_k_cache=comp, extra_indices_in_kvcache=cs,
                                           topk_length=lens, extra_topk_length=clens)
    assert_close_to_ref(ours, theirs.float(), torch.bfloat16, what="out vs FlashMLA")
    assert lse.shape == their_lse.shape
    assert torch.allclose(lse, their_lse, atol=2e-3, rtol=0), (lse - their_lse).abs().max()


@pytest.mark.gpu
def test_sparse_fwd_matches_flashmla():
    peer = _flashmla()
    gen = torch.Generator().manual_seed(45)
    s_q, s_kv, h, k = 128, 700, 64, 128
    q = randn(gen, s_q, h, D, device="cuda")
    kv = randn(gen, s_kv, 1, D, device="cuda")
    idx = torch.randint(-1, s_kv, (s_q, 1, k), generator=gen, dtype=torch.int32).cuda()
    lengths = torch.randint(0, k + 1, (s_q,), generator=gen, dtype=torch.int32).cuda()
    sink = randn(gen, h, dtype=torch.float32, device="cuda")
    theirs = peer.sparse_prefill_fwd(q, kv, idx, 0.05, D, sink, lengths, None)
    ours = fmc.flash_mla_sparse_fwd(q, kv, idx, 0.05, attn_sink=sink, topk_length=lengths)
    assert_close_to_ref(ours[0], theirs[0].float(), torch.bfloat16, what="out vs FlashMLA")
    for name, a, t in (("max_logits", ours[1], theirs[1]), ("lse", ours[2], theirs[2])):
        assert a.shape == t.shape, name
        both_inf = (a == t) & torch.isinf(t)
        assert torch.allclose(torch.where(both_inf, 0, a), torch.where(both_inf, 0, t),
                              atol=2e-3, rtol=0), (name, (a - t).abs().max())
