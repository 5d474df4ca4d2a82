"""dsv4_indexer_topk (DeepSeek-V4's lightning indexer) against the float64 oracle
(reference.indexer_topk): dense and varlen, lists shorter than topk, queries that see nothing,
ties (small-integer inputs make scores exact in fp32 and float64, so the tie rule is checked
exactly), fp8 q and k with row scales, the output feeding dsv4_attention, and bad inputs; then
dsv4_indexer_topk_paged over a paged FP8 indexer cache written here (reference.indexer_topk_paged,
and the dense op on the same rows).
These shapes (head dims under 128) take the reference path on every device, except the paged
form's FP8 decode case, which runs the sm90 kernel on a Hopper GPU; the kernels are tested in
test_indexer_sm90.py.
"""
import math

import pytest
import torch

import dsv4_attn
from dsv4_attn import reference as ref

from conftest import randn
from test_fmha_sm90 import _is_sm90


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


@pytest.mark.parametrize("h", [1, 8, 64])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("ratio", [1, 4])
@pytest.mark.parametrize("mode", ["bf16", "fp8"])
def test_indexer_oracle_matrix(gen, device, h, d, ratio, mode):
    """Issue 46's matrix, H 1/8/64 x D 64/128 x r 1/4 in both modes, exactly against the float64
    oracle on small integers (a power-of-two scale and row scales keep every score exact). On a
    Hopper GPU the D = 128, H >= 8 cases run the kernels, the rest the reference path."""
    b, sq, sc, topk = 2, 40, 100 // ratio + 30, 32
    q, k, w, pos = _case(gen, device, b, sq, sc, h, d)
    kw = dict(topk=topk, compress_ratio=ratio, scale=0.5)
    if mode == "fp8":
        kw["k_scale"] = torch.exp2(_ints(gen, b, sc, device=device, lo=-1, hi=2))
        q, k = q.to(torch.float8_e4m3fn), k.to(torch.float8_e4m3fn)
    else:
        q, k = q.bfloat16(), k.bfloat16()
    got = dsv4_attn.dsv4_indexer_topk(q, k, w, pos, **kw)
    want = ref.indexer_topk(q.float(), k.float(), w, pos, **kw)
    assert got.dtype == torch.int32 and got.shape == (b, sq, topk)
    assert torch.equal(got.cpu(), want.cpu())
    kernel = _is_sm90() and device.type == "cuda" and d == 128 and h >= 8
    assert dsv4_attn.dsv4_indexer_topk_path(q, k, w, pos, **kw) == ("sm90" if kernel
                                                                    else "reference")


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


# ----------------------------------------------------------------------------- the paged form


def _paged_cache(gen, keys, lens, rows_per_block, device, block_pad=0):
    """vLLM's paged FP8 indexer cache for requests whose rows are keys[b, :lens[b]] (float,
    (B, S, 128)), written here independently of the op: each row quantized with a power-of-two
    scale (so the dequantized rows are exact), the blocks of all requests shuffled over the
    cache, and each table padded with junk entries past its rows (never read). Returns the
    (num_blocks, P, 1, 132) uint8 view (block_pad extra bytes per block) and the block table."""
    p = rows_per_block
    need = [(n + p - 1) // p for n in lens]
    width = max(need) + 1
    num_blocks = sum(need) + 2  # two blocks no request uses
    physical = torch.randperm(num_blocks, generator=gen).tolist()
    table = torch.full((len(lens), width), 10 ** 6, dtype=torch.int32)  # junk past the rows
    stride = p * 132 + block_pad
    raw = torch.zeros(num_blocks, stride, dtype=torch.uint8)
    for b, n in enumerate(lens):
        for j in range(need[b]):
            table[b, j] = physical.pop()
        for s in range(n):
            row = keys[b, s].double()
            amax = max(float(row.abs().max()), 1e-4)
            scale = 2.0 ** math.ceil(math.log2(amax / 448))
            values = (row / scale).to(torch.float8_e4m3fn).view(torch.uint8)
            block, r = raw[int(table[b, s // p])], s % p
            block[128 * r:128 * (r + 1)] = values
            block[128 * p + 4 * r:128 * p + 4 * (r + 1)] = torch.tensor(
                [scale], dtype=torch.float32).view(torch.uint8)
    cache = raw.to(device).as_strided((num_blocks, p, 1, 132), (stride, 132, 132, 1))
    return cache, table.to(device)


def _paged_case(gen, device, lens, tokens, heads, rows_per_block, q_dtype=torch.float32,
                block_pad=0):
    b = len(lens)
    keys = torch.randint(-8, 9, (b, max(lens) + 1, 128), generator=gen).float()
    cache, table = _paged_cache(gen, keys, lens, rows_per_block, device, block_pad)
    q = _ints(gen, b, tokens, heads, 128, device=device).to(q_dtype)
    w = _ints(gen, b, tokens, heads, device=device)
    # Each request's last `tokens` positions, so that its last query sees every row (ratio 4).
    pos = torch.stack([torch.arange(tokens) + 4 * n - tokens for n in lens]).to(device)
    lens_t = torch.tensor(lens, dtype=torch.int32, device=device)
    return q, cache, w, pos, table, lens_t


@pytest.mark.parametrize("lens,tokens,heads,rows_per_block,topk", [
    ([37, 0, 200], 1, 8, 64, 16),      # decode: an empty request, one within a block
    ([130, 64, 5], 2, 64, 16, 64),     # two tokens per request (MTP), lists shorter than topk
    ([300], 4, 1, 2, 300),             # pages of 2 rows, topk = every row
])
@pytest.mark.parametrize("q_dtype", [torch.float32, torch.float8_e4m3fn], ids=["fp32", "fp8"])
def test_indexer_paged_matches_oracle_exactly(gen, device, lens, tokens, heads, rows_per_block,
                                              topk, q_dtype):
    q, cache, w, pos, table, lens_t = _paged_case(gen, device, lens, tokens, heads,
                                                  rows_per_block, q_dtype)
    kw = dict(topk=topk, compress_ratio=4, scale=0.5)
    got = dsv4_attn.dsv4_indexer_topk_paged(q, cache, w, pos, table, lens_t, **kw)
    want = ref.indexer_topk_paged(q, cache, w, pos, table, lens_t, **kw)
    assert got.dtype == torch.int32 and got.shape == (len(lens), tokens, topk)
    assert torch.equal(got.cpu(), want)
    # The sm90 kernel takes float8_e4m3 q over 64-row pages (test_indexer_sm90.py tests it).
    kernel = (torch.device(device).type == "cuda" and _is_sm90() and
              q_dtype == torch.float8_e4m3fn and rows_per_block == 64 and heads >= 8)
    assert dsv4_attn.dsv4_indexer_topk_paged_path(q, cache, w, pos, table, lens_t,
                                                  **kw) == ("sm90" if kernel else "reference")


def test_indexer_paged_equals_the_dense_op_on_the_same_rows(gen, device):
    """Each request against dsv4_indexer_topk over its dequantized rows, with a padded block
    stride (exact scores, so the two ops must agree on every pick and tie)."""
    lens, tokens, heads = [90, 17], 3, 16
    q, cache, w, pos, table, lens_t = _paged_case(gen, device, lens, tokens, heads, 64,
                                                  block_pad=48)
    pos = pos - 2  # the last queries see all but the last rows
    kw = dict(topk=32, compress_ratio=4, scale=0.5)
    got = dsv4_attn.dsv4_indexer_topk_paged(q, cache, w, pos, table, lens_t, **kw)
    for b, n in enumerate(lens):
        keys = ref.indexer_cache_rows(cache, table[b], n).float().to(device)
        dense = dsv4_attn.dsv4_indexer_topk(q[b:b + 1], keys[None], w[b:b + 1], pos[b:b + 1],
                                            **kw)
        assert torch.equal(got[b], dense[0])


def test_indexer_paged_bad_inputs_name_the_argument():
    gen = torch.Generator().manual_seed(4)
    q, cache, w, pos, table, lens = _paged_case(gen, "cpu", [20, 3], 1, 2, 16)
    f = lambda **kw: dsv4_attn.dsv4_indexer_topk_paged(  # noqa: E731
        **{**dict(q=q, k_cache=cache, weights=w, positions=pos, block_table=table,
                  context_lens=lens, topk=4, compress_ratio=4), **kw})
    bad = [
        (dict(q=q[..., :64]), r"q.size\(3\) \(the indexer cache's head dim\) must be 128"),
        (dict(k_cache=cache.view(torch.int8)), "k_cache must be Byte"),
        (dict(k_cache=cache[..., :128]), r"k_cache.size\(3\) \(bytes per row.*must be 132"),
        (dict(k_cache=cache[:, ::2]), "k_cache must be a view of whole blocks"),
        (dict(weights=w[..., :1]), "weights must have shape"),
        (dict(positions=pos.float()), "positions must be int32 or int64"),
        (dict(block_table=table[:1]), r"block_table.size\(0\) \(B, as in q\) must be 2"),
        (dict(context_lens=lens + 100), r"context_lens must lie in \[0, max_blocks \* P"),
        (dict(block_table=torch.where(table == table[0, 0], -3, table)),
         "block_table's blocks within context_lens must lie in"),
        (dict(topk=0), "topk must be at least 1"),
    ]
    for kw, text in bad:
        with pytest.raises(RuntimeError, match=text):
            f(**kw)


def test_indexer_paged_fake_kernel_and_compile():
    gen = torch.Generator().manual_seed(5)
    args = _paged_case(gen, "cpu", [20, 3], 2, 2, 16)
    torch.library.opcheck(torch.ops.dsv4.dsv4_indexer_topk_paged.default, args,
                          {"topk": 4, "compress_ratio": 4})
    f = lambda *a: dsv4_attn.dsv4_indexer_topk_paged(*a, topk=4, compress_ratio=4)  # noqa: E731
    assert torch.equal(torch.compile(f, fullgraph=True, backend="aot_eager")(*args), f(*args))
