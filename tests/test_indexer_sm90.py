"""dsv4_indexer_topk on the sm90 kernels (csrc/sm90/indexer): the tensor-core scores and the
top-k kernel against the float64 oracle (reference.indexer_topk) and the reference path.

Small-integer inputs with a power-of-two scale make every score exact in fp32 and float64, so
the picks, their order and the tie rule (ties to the lower row; integer scores tie often) are
compared exactly. Gaussian inputs are checked by the float64 score at each rank. The FP8 serving
mode (float8_e4m3 q and k, row scales) is checked exactly on small integers, and on quantized
Gaussian inputs against the quantization bound.
"""
import math
import re

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
    (1, 9, 130, 128, 8, 4),       # one query per consumer
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


@pytest.mark.parametrize("b,sq,sc,h,topk,ratio", [
    (2, 50, 300, 64, 64, 4),      # early queries see fewer rows than topk
    (1, 40, 2048, 64, 512, 4),    # the longest rows a warp takes, a full radix select
    (1, 100, 200, 8, 16, 4),      # 64 queries per block
    (1, 20, 40, 128, 64, 128),    # a few closed rows, -1 tails
])
def test_warp_topk_matches_oracle_exactly(monkeypatch, b, sq, sc, h, topk, ratio):
    """The warp top-k, which the plan takes only for launches of many rows, on small calls."""
    monkeypatch.setenv("DSV4_INDEXER_TOPK", "warp")
    q, k, w, pos = _case("warp", b, sq, sc, h, torch.bfloat16, ratio)
    kw = dict(topk=topk, compress_ratio=ratio, scale=0.5)
    assert dsv4_attn.launch_plan("dsv4_indexer_topk", q, k, w, pos, **kw).endswith(" topk=warp")
    got = _poisoned_run(q, k, w, pos, **kw)
    assert torch.equal(got.cpu(), ref.indexer_topk(q.cpu(), k.cpu(), w.cpu(), pos.cpu(), **kw))


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


def _pipelined_case(seed):
    """Scores past one workspace: interleaved chunks over two buffers, each buffer reused."""
    q, k, w, pos = _case(seed, 4, 1000, 6000, 16, torch.bfloat16)
    kw = dict(topk=512, compress_ratio=4, scale=0.5)
    plan = dsv4_attn.launch_plan("dsv4_indexer_topk", q, k, w, pos, **kw)
    assert "buffers=2" in plan and int(re.search(r"chunks=(\d+)x", plan)[1]) >= 3, plan
    return q, k, w, pos, kw


def test_kernel_chunks_equal_the_reference_path(monkeypatch):
    """The second buffer's chunks run on a side stream beside the first's; the reference path
    (on the GPU, DSV4_DISABLE_SM90=1) gives the same exact picks."""
    q, k, w, pos, kw = _pipelined_case("chunks")
    got = dsv4_attn.dsv4_indexer_topk(q, k, w, pos, **kw)
    assert torch.equal(dsv4_attn.dsv4_indexer_topk(q, k, w, pos, **kw), got)  # deterministic
    monkeypatch.setenv("DSV4_DISABLE_SM90", "1")
    assert dsv4_attn.dsv4_indexer_topk_path(q, k, w, pos, **kw) == "reference"
    assert torch.equal(got, dsv4_attn.dsv4_indexer_topk(q, k, w, pos, **kw))


def test_pipelined_chunks_in_a_cuda_graph(monkeypatch):
    """The side stream joins the capture and the current stream waits for it: a replay with new
    keys gives the reference path's picks, and work queued after it sees the whole output."""
    q, k, w, pos, kw = _pipelined_case("pgraph")
    dsv4_attn.dsv4_indexer_topk(q, k, w, pos, **kw)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = dsv4_attn.dsv4_indexer_topk(q, k, w, pos, **kw)
        copied = out.clone()  # on the capturing stream, after the op
    gen = torch.Generator().manual_seed(5)
    k.copy_(_ints(gen, *k.shape).to(k.dtype))
    graph.replay()
    monkeypatch.setenv("DSV4_DISABLE_SM90", "1")
    want = dsv4_attn.dsv4_indexer_topk(q, k, w, pos, **kw)
    assert torch.equal(out, want)
    assert torch.equal(copied, want)


@pytest.mark.parametrize("sc,form", [(2048, "warp"), (2048, "cta"), (6000, "cta")])
def test_kernel_gaussian_scores_at_each_rank(monkeypatch, sc, form):
    """Few ties: the first pass's bin is compacted, in each form of the top-k."""
    monkeypatch.setenv("DSV4_INDEXER_TOPK", form)  # rows past 2048 take a CTA whatever it says
    gen = torch.Generator().manual_seed(11)
    b, sq, h, topk = 1, 96, 64, 512
    q = torch.randn(b, sq, h, 128, generator=gen).bfloat16().cuda()
    k = torch.randn(b, sc, 128, generator=gen).bfloat16().cuda()
    w = torch.randn(b, sq, h, generator=gen).cuda()
    pos = (torch.arange(sq) + 4 * sc - sq)[None].cuda()
    plan = dsv4_attn.launch_plan("dsv4_indexer_topk", q, k, w, pos, topk=topk, compress_ratio=4)
    assert plan.endswith(f" topk={form}"), plan
    got = dsv4_attn.dsv4_indexer_topk(q, k, w, pos, topk=topk, compress_ratio=4).cpu()
    score = ref.indexer_scores(q[0].cpu(), k[0].cpu(), w[0].cpu(), pos[0].cpu(), 4)
    best = score.sort(dim=1, descending=True).values[:, :topk]
    chosen = score.gather(1, got[0].long().clamp(min=0))
    assert (got[0] >= 0).all()
    assert torch.allclose(chosen, best, atol=1e-3, rtol=1e-4)
    assert all(len(set(r.tolist())) == topk for r in got[0])
    # Near-ties in floats, and the same picks, in the same order, on a second call.
    again = dsv4_attn.dsv4_indexer_topk(q, k, w, pos, topk=topk, compress_ratio=4).cpu()
    assert torch.equal(got, again), "not bitwise deterministic"


def test_kernel_all_scores_equal():
    """Zero weights: every score ties, the first pass's bin holds every row (too many to
    compact), and the list is the first topk rows in order."""
    q, k, w, pos = _case("equal", 3, 3, 9000, 8, torch.bfloat16)
    kw = dict(topk=512, compress_ratio=4, scale=0.5)
    assert dsv4_attn.launch_plan("dsv4_indexer_topk", q, k, w, pos, **kw).endswith(" topk=cta")
    got = dsv4_attn.dsv4_indexer_topk(q, k, torch.zeros_like(w), pos, **kw)
    want = ref.indexer_topk(q.cpu(), k.cpu(), torch.zeros_like(w).cpu(), pos.cpu(), **kw)
    assert torch.equal(got.cpu(), want)
    assert torch.equal(got[..., :8].cpu(), torch.arange(8).int().expand(3, 3, 8))


FP8 = torch.float8_e4m3fn


def _fp8_case(seed, b, sq, sc, h, ratio=4, signed_scales=False):
    """Small integers (exact in float8_e4m3) and power-of-two row scales: exact scores."""
    q, k, w, pos = _case(seed, b, sq, sc, h, FP8, ratio)
    gen = torch.Generator().manual_seed(stable_seed(seed, "k_scale", b, sc))
    k_scale = torch.exp2(_ints(gen, b, sc, lo=-2, hi=2))
    if signed_scales:  # a negative row scale takes the epilogue's per-element path
        k_scale *= torch.where(torch.rand(b, sc, generator=gen) < 0.1, -1.0, 1.0)
    return q, k, w, pos, k_scale.cuda()


@pytest.mark.parametrize("b,sq,sc,h,topk,ratio,signed", [
    (1, 40, 5000, 64, 512, 4, False),    # three key splits, a full radix select
    (1, 100, 200, 8, 16, 4, False),      # 64 queries per block
    (1, 9, 130, 128, 8, 4, True),        # one query per consumer, some negative row scales
    (2, 33, 700, 16, 700, 1, True),      # topk = Sc
    (1, 20, 40, 128, 64, 128, False),    # a few closed rows, -1 tails
])
def test_fp8_kernel_matches_oracle_exactly(b, sq, sc, h, topk, ratio, signed):
    q, k, w, pos, k_scale = _fp8_case("fp8", b, sq, sc, h, ratio, signed)
    kw = dict(topk=topk, compress_ratio=ratio, scale=0.5, k_scale=k_scale)
    assert dsv4_attn.dsv4_indexer_topk_path(q, k, w, pos, **kw) == "sm90"
    got = _poisoned_run(q, k, w, pos, **kw)
    want = ref.indexer_topk(q.cpu().float(), k.cpu().float(), w.cpu(), pos.cpu(),
                            **dict(kw, k_scale=k_scale.cpu()))
    assert torch.equal(got.cpu(), want)


def test_fp8_nan_in_one_query_stays_in_it():
    """A NaN in one query's q (e4m3's 0x7F) leaves every other query's picks exact: the head sum
    drops a NaN term as the exact mode's fmaxf does, so it cannot reach the queries that share
    the consumer's wgmma."""
    q, k, w, pos, k_scale = _fp8_case("fp8nan", 1, 16, 600, 64)
    q.view(torch.uint8)[0, 5, 3, 7] = 0x7F
    kw = dict(topk=64, compress_ratio=4, scale=0.5, k_scale=k_scale)
    got = _poisoned_run(q, k, w, pos, **kw).cpu()
    clean = q.clone()
    clean.view(torch.uint8)[0, 5, 3, 7] = 0
    want = ref.indexer_topk(clean.cpu().float(), k.cpu().float(), w.cpu(), pos.cpu(),
                            **dict(kw, k_scale=k_scale.cpu()))
    others = torch.arange(16) != 5
    assert torch.equal(got[0, others], want[0, others])


def test_fp8_kernel_within_the_quantization_bound():
    """The serving mode as vLLM feeds it: q quantized per (token, head) with its scale folded
    into the weights, k per row with k_scale. Against the dequantized inputs' float64 scores the
    picks are the top-k up to the accumulator's rounding; against the unquantized inputs each
    pick is within the realized quantization error of the k-th best (E below)."""
    gen = torch.Generator().manual_seed(12)
    sq, sc, h, topk, scale = 64, 3000, 64, 512, 128 ** -0.5
    q = torch.randn(sq, h, 128, generator=gen, dtype=torch.float64)
    k = torch.randn(sc, 128, generator=gen, dtype=torch.float64)
    w = torch.randn(sq, h, generator=gen, dtype=torch.float64)
    pos = torch.arange(sq) + 4 * sc - sq
    q_scale = (q.abs().amax(-1) / 448).float().double()
    k_scale = (k.abs().amax(-1) / 448).float()
    q8, k8 = (q / q_scale[..., None]).to(FP8), (k / k_scale.double()[:, None]).to(FP8)
    w_folded = (w * q_scale).float()
    got = dsv4_attn.dsv4_indexer_topk(q8[None].cuda(), k8[None].cuda(), w_folded[None].cuda(),
                                      pos[None].cuda(), topk=topk, compress_ratio=4,
                                      k_scale=k_scale[None].cuda())[0].cpu().long()
    assert (got >= 0).all() and all(len(set(r.tolist())) == topk for r in got)
    q_deq, k_deq = q8.double() * q_scale[..., None], k8.double() * k_scale.double()[:, None]
    deq = ref.indexer_scores(q_deq, k_deq, w, pos, 4, scale)
    true = ref.indexer_scores(q, k, w, pos, 4, scale)
    # The kernel's rounding, of each head's sum of |products|, weighted like the score: 2^-10
    # while FP8 wgmma accumulates (about 14 bits kept), 2^-9 where the head sum's terms are
    # rounded to bf16, 2^-16 for the weights' hi + lo parts.
    rounding = 2.0 ** -10 + 2.0 ** -9 + 2.0 ** -16
    slack = rounding * scale * torch.einsum("ih,ihd,sd->is", w.abs(), q_deq.abs(), k_deq.abs())
    kth = deq.sort(dim=1, descending=True).values[:, topk - 1:topk]
    assert (deq.gather(1, got) >= kth - slack.gather(1, got) - slack.amax(1, keepdim=True)).all()
    visible = deq > -math.inf
    err = torch.where(visible, (deq - true).abs() + slack, 0.0)  # E: realized error + rounding
    true_kth = true.sort(dim=1, descending=True).values[:, topk - 1:topk]
    assert (true.gather(1, got) >= true_kth - err.gather(1, got) -
            err.amax(1, keepdim=True)).all()


def _varlen_case(seed, lens_q, lens_c, h, dtype, ratio=4):
    """Sequences packed along T and total_c; sequence j's queries are the last lens_q[j]
    positions of a prompt with lens_c[j] closed rows (negative where lens_q is the larger)."""
    gen = torch.Generator().manual_seed(stable_seed(seed, *lens_q, *lens_c, h, dtype))
    t, c = sum(lens_q), sum(lens_c)
    q = _ints(gen, t, h, 128).to(dtype).cuda()
    k = _ints(gen, c, 128).to(dtype).cuda()
    w = _ints(gen, t, h).cuda()
    pos = torch.cat([torch.arange(n) + ratio * m - n for n, m in zip(lens_q, lens_c)]).cuda()
    cu = lambda lens: torch.tensor([0, *lens]).cumsum(0).int().cuda()  # noqa: E731
    k_scale = torch.exp2(_ints(gen, c, lo=-2, hi=2)).cuda() if dtype == FP8 else None
    return q, k, w, pos, cu(lens_q), cu(lens_c), k_scale


@pytest.mark.parametrize("lens_q,lens_c,h,topk", [
    ([50, 0, 300, 7], [100, 40, 3000, 0], 64, 512),  # an empty sequence, one with no rows
    ([1, 1, 1, 1, 1], [5000, 10, 700, 2100, 1], 64, 256),  # decode-like: one query each
    ([130, 70], [33000, 200], 8, 512),  # rows past a top-k CTA's shared memory
])
@pytest.mark.parametrize("dtype", [torch.bfloat16, FP8], ids=["bf16", "fp8"])
def test_varlen_kernel_matches_oracle_exactly(lens_q, lens_c, h, topk, dtype):
    q, k, w, pos, cu_q, cu_k, k_scale = _varlen_case("varlen", lens_q, lens_c, h, dtype)
    kw = dict(topk=topk, compress_ratio=4, scale=0.5, k_scale=k_scale, cu_seqlens_q=cu_q,
              cu_seqlens_k=cu_k, max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_c))
    assert dsv4_attn.dsv4_indexer_topk_path(q, k, w, pos, **kw) == "sm90"
    got = _poisoned_run(q, k, w, pos, **kw)
    cpu = {n: (v.cpu() if isinstance(v, torch.Tensor) else v) for n, v in kw.items()
           if not n.startswith("max_seqlen")}
    want = ref.indexer_topk(q.cpu().float(), k.cpu().float(), w.cpu(), pos.cpu(), **cpu)
    assert got.shape == (sum(lens_q), topk)
    assert torch.equal(got.cpu(), want)
    # Without max_seqlen_* the op reads them from cu_seqlens (a host sync) and agrees.
    del kw["max_seqlen_q"], kw["max_seqlen_k"]
    assert torch.equal(dsv4_attn.dsv4_indexer_topk(q, k, w, pos, **kw), got)


def test_varlen_kernel_in_a_cuda_graph():
    """A serving step: captured once, replayed with new sequence lengths and positions under
    the same max_seqlen bounds, with no host sync."""
    h, topk = 64, 128
    q, k, w, pos, cu_q, cu_k, _ = _varlen_case("vgraph", [40, 24], [900, 300], h, torch.bfloat16)
    kw = dict(topk=topk, compress_ratio=4, scale=0.5, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
              max_seqlen_q=64, max_seqlen_k=1200)
    dsv4_attn.dsv4_indexer_topk(q, k, w, pos, **kw)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = dsv4_attn.dsv4_indexer_topk(q, k, w, pos, **kw)
    for lens_q, lens_c in (([10, 54], [1200, 0]), ([64, 0], [2, 1198])):
        cu_q.copy_(torch.tensor([0, *lens_q]).cumsum(0))
        cu_k.copy_(torch.tensor([0, *lens_c]).cumsum(0))
        pos.copy_(torch.cat([torch.arange(n) + 4 * m - n for n, m in zip(lens_q, lens_c)]))
        out.fill_(-7)
        graph.replay()
        want = ref.indexer_topk(q.cpu(), k.cpu(), w.cpu(), pos.cpu(), topk=topk, compress_ratio=4,
                                scale=0.5, cu_seqlens_q=cu_q.cpu(), cu_seqlens_k=cu_k.cpu())
        assert torch.equal(out.cpu(), want)


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


@pytest.mark.parametrize("dtype", [torch.bfloat16, FP8], ids=["bf16", "fp8"])
def test_workspace_under_64mb_at_a_128k_prompt(dtype):
    """Issue 46's bound: a 128k prompt's scores go through a workspace of chunks, under 64 MB,
    never a Sq x Sc tensor (the plan alone: nothing runs on these uninitialised tensors)."""
    sq, sc, h = 131072, 32768, 64
    q = torch.empty(1, sq, h, 128, device="cuda", dtype=dtype)
    k = torch.empty(1, sc, 128, device="cuda", dtype=dtype)
    w = torch.empty(1, sq, h, device="cuda")
    pos = torch.arange(sq, device="cuda")[None]
    kw = dict(topk=512, compress_ratio=4)
    if dtype == FP8:
        kw["k_scale"] = torch.ones(1, sc, device="cuda")
    plan = dsv4_attn.launch_plan("dsv4_indexer_topk", q, k, w, pos, **kw)
    assert plan.startswith("sm90 indexer "), plan
    assert int(re.search(r" workspace=(\d+)MB", plan).group(1)) < 64, plan


def test_route_names_its_reasons(monkeypatch):
    q, k, w, pos = _case("route", 1, 16, 64, 64, torch.bfloat16)
    plan = lambda *a, **kw: dsv4_attn.launch_plan("dsv4_indexer_topk", *a, topk=8,  # noqa: E731
                                                  compress_ratio=4, **kw)
    assert plan(q, k, w, pos).startswith("sm90 indexer queries_per_block=8")
    assert plan(q, k, w, pos).endswith(" topk=cta")  # 16 short rows: a CTA each, for latency
    # Short rows, four or more a launch per SM: a warp per query.
    many = 4 * torch.cuda.get_device_properties(0).multi_processor_count
    reps = -(-many // 16)
    q_many, w_many = q.repeat(1, reps, 1, 1)[:, :many], w.repeat(1, reps, 1)[:, :many]
    assert plan(q_many, k, w_many, pos.repeat(1, reps)[:, :many]).endswith(" topk=warp")
    monkeypatch.setenv("DSV4_INDEXER_TOPK", "warp")
    assert plan(q, k, w, pos).endswith(" topk=warp")
    assert dsv4_attn.launch_plan("dsv4_indexer_topk", q, k, w, pos, topk=513,
                                 compress_ratio=4).endswith(" topk=cta")  # past a warp's list
    long_k = torch.cat([k] * 33, dim=1)  # 2112 rows: past a warp's keys
    assert plan(q, long_k, w, pos).endswith(" topk=cta")
    monkeypatch.setenv("DSV4_INDEXER_TOPK", "block")
    with pytest.raises(RuntimeError, match="DSV4_INDEXER_TOPK must be cta or warp, got 'block'"):
        plan(q, k, w, pos)
    monkeypatch.delenv("DSV4_INDEXER_TOPK")
    assert "head dim is not 128" in plan(q[..., :64], k[..., :64], w, pos)
    assert "power of two" in plan(q[:, :, :48], k, w[..., :48], pos)
    wide = torch.cat([q] * 4, dim=2)  # 256 heads: more than a consumer's 128 columns
    assert "from 8 to 128" in plan(wide, k, torch.cat([w] * 4, dim=-1), pos)
    assert "q is not bf16, fp16 or float8_e4m3fn" in plan(q.float(), k.float(), w, pos)
    assert "topk above 2048" in dsv4_attn.launch_plan("dsv4_indexer_topk", q, k, w, pos,
                                                      topk=4096, compress_ratio=4)
    heads_strided = q.transpose(1, 2).contiguous().transpose(1, 2)  # (B, Sq, H, D), H outer
    assert "strides" in plan(heads_strided, k, w, pos)
    exact = dict(topk=8, compress_ratio=4, scale=0.5)  # exact scores: the paths agree on ties
    got = dsv4_attn.dsv4_indexer_topk(heads_strided, k, w, pos, **exact)
    assert torch.equal(got, dsv4_attn.dsv4_indexer_topk(q, k, w, pos, **exact))
    # A lone query's stride is never used: any value keeps the call on the kernel.
    one = q[:, -1:]
    one_odd = one.as_strided(one.shape, (one.stride(0), 7, one.stride(2), 1))
    one_w, one_pos = w[:, -1:], pos[:, -1:]
    assert plan(one_odd, k, one_w, one_pos).startswith("sm90 ")
    got = dsv4_attn.dsv4_indexer_topk(one_odd, k, one_w, one_pos, **exact)
    assert torch.equal(got, dsv4_attn.dsv4_indexer_topk(one.contiguous(), k, one_w, one_pos,
                                                        **exact))


# ----------------------------------------------------------------------------- the paged form
# dsv4_indexer_topk_paged on the paged score kernel (paged_score.cuh) and the same top-k kernel,
# over caches written by test_indexer._paged_cache (power-of-two row scales, small integers:
# exact scores, so picks and ties compare exactly with the float64 oracle).


def _paged(seed, lens, tokens, heads, block_pad=0, index_dtype=torch.int32):
    from test_indexer import _paged_case
    gen = torch.Generator().manual_seed(stable_seed(seed, *lens, tokens, heads, block_pad))
    q, cache, w, pos, table, lens_t = _paged_case(gen, "cuda", lens, tokens, heads, 64, FP8,
                                                  block_pad)
    return q, cache, w, pos.to(index_dtype), table.to(index_dtype), lens_t.to(index_dtype)


def _poisoned_paged(*args, **kw):
    junk = torch.full((64 << 20,), -7, dtype=torch.int32, device="cuda")
    del junk
    return dsv4_attn.dsv4_indexer_topk_paged(*args, **kw)


@pytest.mark.parametrize("lens,tokens,heads,topk,block_pad,index_dtype", [
    ([37, 0, 200], 1, 64, 16, 0, torch.int32),       # decode: an empty request, a partial page
    ([1000, 3000, 64, 5], 2, 32, 512, 48, torch.int32),  # MTP, several splits, padded blocks
    ([700, 130], 3, 8, 64, 0, torch.int64),          # 8 heads: 16 queries a block; int64 indices
    ([2100, 9], 1, 128, 2048, 0, torch.int32),       # 128 heads, the largest topk, -1 tails
    ([1500, 640], 2, 64, 128, 0, torch.int32),       # 64 heads, 2 queries: 128 columns
    ([1900, 2000, 300], 1, 64, 512, 0, torch.int32),  # a 33-page table: past a warp's rows
])
def test_paged_kernel_matches_oracle_exactly(lens, tokens, heads, topk, block_pad, index_dtype):
    args = _paged("paged", lens, tokens, heads, block_pad, index_dtype)
    kw = dict(topk=topk, compress_ratio=4, scale=0.5)
    assert dsv4_attn.dsv4_indexer_topk_paged_path(*args, **kw) == "sm90"
    got = _poisoned_paged(*args, **kw)
    want = ref.indexer_topk_paged(*args, **kw)
    assert got.shape == (len(lens), tokens, topk)
    assert torch.equal(got.cpu(), want)


def test_paged_kernel_gaussian_queries_are_deterministic():
    """Gaussian queries and weights over the cache (near-ties in floats): two calls give the
    same picks, bitwise, and every pick is a closed row of its request."""
    q, cache, w, pos, table, lens = _paged("paged-gauss", [3000, 700], 2, 64)
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(q.shape, generator=gen).to(FP8).cuda()
    w = torch.randn(w.shape, generator=gen).cuda()
    args, kw = (q, cache, w, pos, table, lens), dict(topk=512, compress_ratio=4)
    assert dsv4_attn.dsv4_indexer_topk_paged_path(*args, **kw) == "sm90"
    got = _poisoned_paged(*args, **kw)
    assert torch.equal(got, _poisoned_paged(*args, **kw)), "not bitwise deterministic"
    closed = torch.div(pos.long() + 1, 4, rounding_mode="floor")[..., None]  # (B, N, 1)
    assert ((got >= -1) & (got < closed)).all()


def test_paged_warp_topk_matches_oracle_exactly(monkeypatch):
    """The warp top-k on a decode step's rows, near its longest (the plan takes CTAs for so few)."""
    monkeypatch.setenv("DSV4_INDEXER_TOPK", "warp")
    args = _paged("pwarp", [1900, 1984, 300, 1100], 2, 64)  # a 32-page table: 2048 rows
    kw = dict(topk=512, compress_ratio=4, scale=0.5)
    assert dsv4_attn.launch_plan("dsv4_indexer_topk_paged", *args, **kw).endswith(" topk=warp")
    got = _poisoned_paged(*args, **kw)
    assert torch.equal(got.cpu(), ref.indexer_topk_paged(*args, **kw))


def test_paged_kernel_sees_only_closed_rows():
    """Queries whose closed rows stop short of the context (positions behind it) and a ratio of
    one: each query's list ends at its own bound, not the request's."""
    q, cache, w, pos, table, lens = _paged("closed", [900, 400], 4, 64)
    pos = pos - 4 * torch.tensor([[300], [10]], device="cuda") + torch.arange(4, device="cuda")
    for ratio in (4, 1):
        kw = dict(topk=256, compress_ratio=ratio, scale=0.5)
        got = dsv4_attn.dsv4_indexer_topk_paged(q, cache, w, pos, table, lens, **kw)
        assert torch.equal(got.cpu(), ref.indexer_topk_paged(q, cache, w, pos, table, lens, **kw))


def test_paged_kernel_in_a_cuda_graph():
    """A decode step captured once and replayed with new context lengths, positions and block
    tables (no host sync: the plan depends on shapes only)."""
    q, cache, w, pos, table, lens = _paged("pgraph", [600, 300, 50], 1, 64)
    kw = dict(topk=128, compress_ratio=4, scale=0.5)
    dsv4_attn.dsv4_indexer_topk_paged(q, cache, w, pos, table, lens, **kw)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = dsv4_attn.dsv4_indexer_topk_paged(q, cache, w, pos, table, lens, **kw)
    gen = torch.Generator().manual_seed(3)
    num_blocks, width = cache.shape[0], table.shape[1]
    for new_lens in ([300, 600, 1], [64, 0, 640]):  # at most width * 64 = 704 rows
        lens.copy_(torch.tensor(new_lens))
        pos.copy_(4 * lens[:, None] - 1)
        table.copy_(torch.randint(0, num_blocks, (3, width), generator=gen))
        out.fill_(-7)
        graph.replay()
        assert torch.equal(out.cpu(), ref.indexer_topk_paged(q, cache, w, pos, table, lens, **kw))


def test_paged_route_names_its_reasons():
    q, cache, w, pos, table, lens = _paged("proute", [100, 20], 1, 16)
    plan = lambda *a, **kw: dsv4_attn.launch_plan("dsv4_indexer_topk_paged", *a,  # noqa: E731
                                                  topk=8, compress_ratio=4, **kw)
    assert plan(q, cache, w, pos, table, lens).startswith(
        "sm90 indexer queries_per_block=4 columns=64 ")  # 16 heads, one query: 64 columns
    assert "not float8_e4m3fn" in plan(q.float(), cache, w, pos, table, lens)
    assert "power of two" in plan(q[:, :, :12], cache, w[..., :12], pos, table, lens)
    assert "64 rows" in plan(q, cache[:, :32], w, pos, table, lens)
    assert "topk above 2048" in dsv4_attn.launch_plan(
        "dsv4_indexer_topk_paged", q, cache, w, pos, table, lens, topk=4096, compress_ratio=4)
    heads_outer = torch.empty(q.shape[0], q.shape[2], 2, 128, dtype=q.dtype, device="cuda")
    heads_outer.copy_(q.transpose(1, 2).expand(-1, -1, 2, -1))
    heads_strided = heads_outer.transpose(1, 2)  # two tokens a request, heads outermost
    two = lambda t: torch.cat([t, t], dim=1)  # noqa: E731
    assert "strides" in plan(heads_strided, cache, two(w), two(pos), table, lens)
    # A decode step's lone token: its stride is never used, so any value stays on the kernel.
    q_odd = q.as_strided(q.shape, (q.stride(0), 5, q.stride(2), 1))
    assert plan(q_odd, cache, w, pos, table, lens).startswith("sm90 ")
    # Off the kernel, the reference path gives the same picks (exact scores).
    kw = dict(topk=8, compress_ratio=4, scale=0.5)
    got = dsv4_attn.dsv4_indexer_topk_paged(q, cache, w, pos, table, lens, **kw)
    assert torch.equal(got, dsv4_attn.dsv4_indexer_topk_paged(q.float(), cache, w, pos, table,
                                                              lens, **kw))
    assert torch.equal(got, dsv4_attn.dsv4_indexer_topk_paged(q_odd, cache, w, pos, table, lens,
                                                              **kw))
