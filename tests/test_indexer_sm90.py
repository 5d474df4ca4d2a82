"""dsv4_indexer_topk on the sm90 kernels (csrc/sm90/indexer): the tensor-core scores and the
top-k kernel against the float64 oracle (reference.indexer_topk) and the reference path.

Small-integer inputs with a power-of-two scale make every score exact in fp32 and float64, so
the picks, their order and the tie rule (ties to the lower row; integer scores tie often) are
compared exactly. Gaussian inputs are checked by the float64 score at each rank.
"""
import pytest
import torch

import dsv4_attn
from dsv4_attn import reference as ref

from conftest import stable_seed
from test_fmha_sm90 import needs_sm90

pytestmark = [pytest.mark.gpu, needs_sm90]


def _ints(gen, *shape, lo=-2, hi=3):
    return torch.randint(lo, hi, shape, generator=gen).float()


def _case(seed, b, sq, sc, h, dtype, ratio=4, shuffle=False, pos64=True):
    gen = torch.Generator().manual_seed(stable_seed(seed, b, sq, sc, h, dtype, ratio))
    q = _ints(gen, b, sq, h, 128).to(dtype).cuda()
    k = _ints(gen, b, sc, 128).to(dtype).cuda()
    w = _ints(gen, b, sq, h).cuda()
    # The last sq positions of a prompt whose closed rows number sc, minus a few so the first
    # queries see fewer rows than the last.
    pos = torch.arange(sq)[None].repeat(b, 1) + ratio * sc - sq
    if shuffle:
        pos = torch.stack([p[torch.randperm(sq, generator=gen)] for p in pos])
    pos = pos.to(torch.int64 if pos64 else torch.int32).cuda()
    return q, k, w, pos


def _poisoned_run(q, k, w, pos, **kw):
    """The op after the allocator's memory was filled with garbage, so stale values show."""
    junk = torch.full((64 << 20,), -7, dtype=torch.int32, device="cuda")
    del junk
    return dsv4_attn.dsv4_indexer_topk(q, k, w, pos, **kw)


@pytest.mark.parametrize("b,sq,sc,h,topk,ratio", [
    (2, 50, 300, 64, 64, 4),      # early queries see fewer rows than topk
    (1, 40, 5000, 64, 512, 4),    # three key splits, a full radix select
    (1, 100, 200, 8, 16, 4),      # 64 queries per block
    (1, 9, 130, 256, 8, 4),       # one query per consumer
    (2, 33, 700, 16, 700, 1),     # topk = Sc: every row, sorted
    (1, 8, 3000, 32, 2048, 1),    # the largest topk
    (1, 20, 40, 128, 64, 128),    # a few closed rows, -1 tails
])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_kernel_matches_oracle_exactly(b, sq, sc, h, topk, ratio, dtype):
    q, k, w, pos = _case("exact", b, sq, sc, h, dtype, ratio)
    kw = dict(topk=topk, compress_ratio=ratio, scale=0.5)
    assert dsv4_attn.dsv4_indexer_topk_path(q, k, w, pos, **kw) == "sm90"
    got = _poisoned_run(q, k, w, pos, **kw)
    want = ref.indexer_topk(q.cpu(), k.cpu(), w.cpu(), pos.cpu(), **kw)
    assert got.dtype == torch.int32 and got.shape == (b, sq, topk)
    assert torch.equal(got.cpu(), want)


def test_kernel_shuffled_int32_positions_and_negative_scale():
    """Positions in any order (the block's causal bound is its largest), int32, and a negative
    scale (ReLU(scale q.k) keeps its sign inside)."""
    q, k, w, pos = _case("shuffle", 2, 70, 900, 64, torch.bfloat16, shuffle=True, pos64=False)
    kw = dict(topk=128, compress_ratio=4, scale=-0.25)
    got = dsv4_attn.dsv4_indexer_topk(q, k, w, pos, **kw)
    want = ref.indexer_topk(q.cpu(), k.cpu(), w.cpu(), pos.cpu(), **kw)
    assert torch.equal(got.cpu(), want)


def test_kernel_row_scales():
    q, k, w, pos = _case("kscale", 1, 30, 600, 64, torch.bfloat16)
    gen = torch.Generator().manual_seed(3)
    k_scale = torch.exp2(_ints(gen, 1, 600, lo=-1, hi=2)).cuda()
    kw = dict(topk=100, compress_ratio=4, scale=0.5, k_scale=k_scale)
    got = dsv4_attn.dsv4_indexer_topk(q, k, w, pos, **kw)
    want = ref.indexer_topk(q.cpu(), k.cpu(), w.cpu(), pos.cpu(), **kw)
    assert torch.equal(got.cpu(), want)


def test_kernel_keys_past_shared_memory():
    """More closed rows than a top-k CTA stages (32768): the passes read the workspace."""
    q, k, w, pos = _case("long", 1, 3, 33000, 8, torch.bfloat16)
    kw = dict(topk=512, compress_ratio=4, scale=0.5)
    got = dsv4_attn.dsv4_indexer_topk(q, k, w, pos, **kw)
    want = ref.indexer_topk(q.cpu(), k.cpu(), w.cpu(), pos.cpu(), **kw)
    assert torch.equal(got.cpu(), want)


def test_kernel_chunks_equal_the_reference_path(monkeypatch):
    """A call whose scores exceed one workspace runs in interleaved chunks; the reference path
    (on the GPU, DSV4_DISABLE_SM90=1) gives the same exact picks."""
    q, k, w, pos = _case("chunks", 4, 1000, 6000, 16, torch.bfloat16)
    kw = dict(topk=512, compress_ratio=4, scale=0.5)
    plan = dsv4_attn.launch_plan("dsv4_indexer_topk", q, k, w, pos, **kw)
    assert "chunks=2x" in plan, plan
    got = dsv4_attn.dsv4_indexer_topk(q, k, w, pos, **kw)
    assert torch.equal(dsv4_attn.dsv4_indexer_topk(q, k, w, pos, **kw), got)  # deterministic
    monkeypatch.setenv("DSV4_DISABLE_SM90", "1")
    assert dsv4_attn.dsv4_indexer_topk_path(q, k, w, pos, **kw) == "reference"
    assert torch.equal(got, dsv4_attn.dsv4_indexer_topk(q, k, w, pos, **kw))


def test_kernel_gaussian_scores_at_each_rank():
    gen = torch.Generator().manual_seed(11)
    b, sq, sc, h, topk = 1, 96, 2048, 64, 512
    q = torch.randn(b, sq, h, 128, generator=gen).bfloat16().cuda()
    k = torch.randn(b, sc, 128, generator=gen).bfloat16().cuda()
    w = torch.randn(b, sq, h, generator=gen).cuda()
    pos = (torch.arange(sq) + 4 * sc - sq)[None].cuda()
    got = dsv4_attn.dsv4_indexer_topk(q, k, w, pos, topk=topk, compress_ratio=4).cpu()
    score = ref.indexer_scores(q[0].cpu(), k[0].cpu(), w[0].cpu(), pos[0].cpu(), 4)
    best = score.sort(dim=1, descending=True).values[:, :topk]
    chosen = score.gather(1, got[0].long().clamp(min=0))
    assert (got[0] >= 0).all()
    assert torch.allclose(chosen, best, atol=1e-3, rtol=1e-4)
    assert all(len(set(r.tolist())) == topk for r in got[0])


def test_kernel_in_a_cuda_graph():
    """Captured once, replayed with new positions and new keys: no host sync, no stale plan."""
    q, k, w, pos = _case("graph", 1, 64, 1000, 64, torch.bfloat16)
    kw = dict(topk=256, compress_ratio=4, scale=0.5)
    dsv4_attn.dsv4_indexer_topk(q, k, w, pos, **kw)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = dsv4_attn.dsv4_indexer_topk(q, k, w, pos, **kw)
    gen = torch.Generator().manual_seed(9)
    for step in range(2):
        pos.copy_(torch.randint(0, 4 * 1000, pos.shape, generator=gen))
        k.copy_(_ints(gen, *k.shape).to(k.dtype))
        graph.replay()
        want = ref.indexer_topk(q.cpu(), k.cpu(), w.cpu(), pos.cpu(), **kw)
        assert torch.equal(out.cpu(), want)


def test_route_names_its_reasons():
    q, k, w, pos = _case("route", 1, 16, 64, 64, torch.bfloat16)
    plan = lambda *a, **kw: dsv4_attn.launch_plan("dsv4_indexer_topk", *a, topk=8,  # noqa: E731
                                                  compress_ratio=4, **kw)
    assert plan(q, k, w, pos).startswith("sm90 indexer queries_per_block=8")
    assert "head dim is not 128" in plan(q[..., :64], k[..., :64], w, pos)
    assert "power of two" in plan(q[:, :, :48], k, w[..., :48], pos)
    assert "q is not bf16" in plan(q.float(), k.float(), w, pos)
    assert "topk above 2048" in dsv4_attn.launch_plan("dsv4_indexer_topk", q, k, w, pos,
                                                      topk=4096, compress_ratio=4)
    heads_strided = q.transpose(1, 2).contiguous().transpose(1, 2)  # (B, Sq, H, D), H outer
    assert "strides" in plan(heads_strided, k, w, pos)
    exact = dict(topk=8, compress_ratio=4, scale=0.5)  # exact scores: the paths agree on ties
    got = dsv4_attn.dsv4_indexer_topk(heads_strided, k, w, pos, **exact)
    assert torch.equal(got, dsv4_attn.dsv4_indexer_topk(q, k, w, pos, **exact))
