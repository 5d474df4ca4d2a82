"""dsv4_indexer_topk (DeepSeek-V4's lightning indexer) against the float64 oracle
(reference.indexer_topk): dense and varlen, lists shorter than topk, queries that see nothing,
ties (small-integer inputs make scores exact in fp32 and float64, so the tie rule is checked
exactly), fp8 q and k with row scales, the output feeding dsv4_attention, and bad inputs.
These shapes (head dims under 128) take the reference path on every device; the sm90 kernels
are tested in test_indexer_sm90.py.
"""
import pytest
import torch

import dsv4_attn
from dsv4_attn import reference as ref

from conftest import randn


def _ints(gen, *shape, device, lo=-2, hi=3):
    """Small integers drawn on CPU from `gen` (a CPU generator), then moved."""
    return torch.randint(lo, hi, shape, generator=gen).float().to(device)


def _case(gen, device, b, sq, sc, h, d, dtype=torch.float32):
    q = _ints(gen, b, sq, h, d, device=device).to(dtype)
    k = _ints(gen, b, sc, d, device=device).to(dtype)
    w = _ints(gen, b, sq, h, device=device)
    pos = torch.arange(sq, device=device)[None].expand(b, sq) + (4 * sc - sq) // 2
    return q, k, w, pos


@pytest.mark.parametrize("b,sq,sc,h,d,topk,ratio", [
    (2, 50, 30, 4, 16, 8, 4),     # early queries see fewer rows than topk, the first none
    (1, 20, 64, 2, 32, 64, 4),    # topk = Sc
    (1, 33, 17, 3, 8, 40, 2),     # topk > Sc: -1 tail everywhere
    (2, 5, 9, 1, 4, 3, 128),      # a few closed rows
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_indexer_matches_oracle_with_exact_ties(gen, device, b, sq, sc, h, d, topk, ratio, dtype):
    q, k, w, pos = _case(gen, device, b, sq, sc, h, d, dtype)
    scale = 0.5  # a power of two keeps the integer scores exact
    got = dsv4_attn.dsv4_indexer_topk(q, k, w, pos, topk=topk, compress_ratio=ratio, scale=scale)
    want = ref.indexer_topk(q, k, w, pos, topk=topk, compress_ratio=ratio, scale=scale)
    assert got.dtype == torch.int32 and got.shape == (b, sq, topk)
    assert torch.equal(got.cpu(), want)
    assert dsv4_attn.dsv4_indexer_topk_path(q, k, w, pos, topk=topk,
                                            compress_ratio=ratio) == "reference"


def test_indexer_random_scores_select_the_oracles_best(gen, device):
    """Gaussian inputs: fp32 and float64 may order near-equal scores differently, so each
    chosen row's float64 score must be within rounding of the oracle's at the same rank."""
    b, sq, sc, h, d, topk = 1, 40, 100, 8, 64, 16
    q = randn(gen, b, sq, h, d, dtype=torch.float32, device=device)
    k = randn(gen, b, sc, d, dtype=torch.float32, device=device)
    w = randn(gen, b, sq, h, dtype=torch.float32, device=device)
    pos = torch.arange(sq, device=device)[None] + 4 * sc - sq
    got = dsv4_attn.dsv4_indexer_topk(q, k, w, pos, topk=topk, compress_ratio=4).cpu()
    score = ref.indexer_scores(q[0], k[0], w[0], pos[0], 4)
    best = score.sort(dim=1, descending=True).values[:, :topk]
    chosen = score.gather(1, got[0].long())
    assert torch.allclose(chosen, best, atol=1e-4, rtol=1e-5)
    assert all(len(set(r.tolist())) == topk for r in got[0])  # distinct rows


def test_indexer_varlen_equals_dense_calls(gen, device):
    lens_q, lens_c = [7, 0, 30, 12], [5, 3, 20, 12]
    h, d, topk = 2, 16, 6
    q = _ints(gen, sum(lens_q), h, d, device=device)
    k = _ints(gen, sum(lens_c), d, device=device)
    w = _ints(gen, sum(lens_q), h, device=device)
    pos = torch.cat([torch.arange(n, device=device) + 4 * c - n for n, c in zip(lens_q, lens_c)])
    cu = lambda lens: torch.tensor([0] + lens, device=device).cumsum(0).int()  # noqa: E731
    got = dsv4_attn.dsv4_indexer_topk(q, k, w, pos, topk=topk, compress_ratio=4,
                                      cu_seqlens_q=cu(lens_q), cu_seqlens_k=cu(lens_c))
    want = ref.indexer_topk(q, k, w, pos, topk=topk, compress_ratio=4,
                            cu_seqlens_q=cu(lens_q), cu_seqlens_k=cu(lens_c))
    assert torch.equal(got.cpu(), want)
    q0, c0 = 0, 0
    for n, c in zip(lens_q, lens_c):
        if n:
            one = dsv4_attn.dsv4_indexer_topk(q[None, q0:q0 + n], k[None, c0:c0 + c],
                                              w[None, q0:q0 + n], pos[None, q0:q0 + n],
                                              topk=topk, compress_ratio=4)
            assert torch.equal(one[0], got[q0:q0 + n])
        q0, c0 = q0 + n, c0 + c


def test_indexer_fp8_with_row_scales(gen, device):
    q, k, w, pos = _case(gen, device, 1, 24, 40, 2, 16)
    # Powers of two keep the scores exact, so the tie rule is checked exactly here too.
    k_scale = torch.exp2(_ints(gen, 1, 40, device=device, lo=-1, hi=2))
    q8, k8 = q.to(torch.float8_e4m3fn), k.to(torch.float8_e4m3fn)
    got = dsv4_attn.dsv4_indexer_topk(q8, k8, w, pos, topk=10, compress_ratio=4, k_scale=k_scale)
    want = ref.indexer_topk(q8.float(), k8.float(), w, pos, topk=10, compress_ratio=4,
                            k_scale=k_scale)
    assert torch.equal(got.cpu(), want)


def test_indexer_output_feeds_dsv4_attention(gen, device):
    """The indices are dsv4_attention's topk_indices for the same layer (Skv = 4 Sc tokens)."""
    sc, sq, h = 32, 128, 4
    q, k, w, _ = _case(gen, device, 1, sq, sc, h, 16)
    pos = torch.arange(sq, device=device)[None]
    idx = dsv4_attn.dsv4_indexer_topk(q, k, w, pos, topk=8, compress_ratio=4)
    qa = randn(gen, 1, sq, 2, 64, dtype=torch.float32, device=device)
    kv = randn(gen, 1, sq, 64, dtype=torch.float32, device=device)
    comp = randn(gen, 1, sc, 64, dtype=torch.float32, device=device)
    out = dsv4_attn.dsv4_attention(qa, kv, compressed_kv=comp, compress_ratio=4, topk_indices=idx,
                                   window=16)
    want, _ = ref.dsv4_attention(qa, kv, compressed_kv=comp, compress_ratio=4, topk_indices=idx,
                                 window=16)
    assert (out.double().cpu() - want).abs().max() < 1e-4


def test_indexer_bad_inputs_name_the_argument():
    q, k, w = torch.randn(1, 4, 2, 8), torch.randn(1, 6, 8), torch.randn(1, 4, 2)
    pos = torch.arange(4)[None]
    f = dsv4_attn.dsv4_indexer_topk
    bad = [
        (lambda: f(q, k, w, pos, topk=0, compress_ratio=4), "topk must be at least 1"),
        (lambda: f(q, k, w, pos, topk=2, compress_ratio=0), "compress_ratio must be at least 1"),
        (lambda: f(q, k[..., :4], w, pos, topk=2, compress_ratio=4), "k's last dim"),
        (lambda: f(q, k, w[..., :1], pos, topk=2, compress_ratio=4), r"weights must have shape"),
        (lambda: f(q, k, w, pos.float(), topk=2, compress_ratio=4), "positions must be int32"),
        (lambda: f(q.double(), k.double(), w, pos, topk=2, compress_ratio=4), "q must be bf16"),
        (lambda: f(q.to(torch.float8_e4m3fn), k.to(torch.float8_e4m3fn), w, pos, topk=2,
                   compress_ratio=4), "need k_scale"),
        (lambda: f(q[0], k[0], w[0], pos[0], topk=2, compress_ratio=4,
                   cu_seqlens_q=torch.tensor([0, 4])), "give both cu_seqlens"),
        (lambda: f(q, k, w, pos, topk=2, compress_ratio=4, max_seqlen_q=4),
         "apply to varlen calls only"),
        (lambda: f(q[0], k[0], w[0], pos[0], topk=2, compress_ratio=4,
                   cu_seqlens_q=torch.tensor([0, 4]), cu_seqlens_k=torch.tensor([0, 6]),
                   max_seqlen_q=-2), "max_seqlen_q and max_seqlen_k must be >= 0"),
        (lambda: f(q[0], k[0], w[0], pos[0], topk=2, compress_ratio=4,
                   cu_seqlens_q=torch.tensor([0, 4]), cu_seqlens_k=torch.tensor([0, 6]),
                   max_seqlen_k=3), "max_seqlen_k must be >= the longest"),
    ]
    for call, text in bad:
        with pytest.raises(RuntimeError, match=text):
            call()


def test_indexer_fake_kernel_and_compile():
    gen = torch.Generator().manual_seed(2)
    q, k, w, pos = _case(gen, "cpu", 1, 12, 10, 2, 8)
    torch.library.opcheck(torch.ops.dsv4.dsv4_indexer_topk.default, (q, k, w, pos),
                          {"topk": 4, "compress_ratio": 4})
    f = lambda q, k, w, pos: dsv4_attn.dsv4_indexer_topk(q, k, w, pos, topk=4,  # noqa: E731
                                                        compress_ratio=4)
    assert torch.equal(torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, w, pos),
                       f(q, k, w, pos))
