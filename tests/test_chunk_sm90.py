"""GPU tests of the sm90 chunk_gated_delta_rule / chunk_simple_gla kernel (issue 4).

Every case asserts the sm90 path ran, then compares against the float64 token-by-token oracle
with relative RMS error ||ours - ref|| / ||ref|| <= 5e-3 for o and for final_state. Inputs
are fresh per case and look like a model's: q and k L2-normalised, beta in (0, 1), gates that
include exact zeros and values down to -20 per token. Outputs come from allocator blocks
poisoned with NaN bit patterns, so an unwritten element fails the NaN check.
"""
import pytest
import torch
import torch.nn.functional as F

import dsv4_attn
from dsv4_attn import reference as ref

from conftest import cu_seqlens, poison_allocator, rel_rms

pytestmark = pytest.mark.gpu

REL_RMS_LIMIT = 5e-3
OPS = ["gated_delta_rule", "simple_gla"]


def _is_sm90():
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


needs_sm90 = pytest.mark.skipif(not _is_sm90(), reason="needs an sm_90 (Hopper) GPU")


def _gates(gen, shape, kind):
    """Log-decays per token. mild: (-0.5, 0] with 10% exact zeros; extreme: 30% exact zeros,
    20% exactly -20, the rest in (-5, 0]; zero: no decay at all."""
    u = torch.rand(*shape, generator=gen)
    if kind == "zero":
        return torch.zeros(shape)
    if kind == "mild":
        return (-0.5 * torch.rand(*shape, generator=gen)).masked_fill(u < 0.1, 0.0)
    g = -5.0 * torch.rand(*shape, generator=gen)
    return torch.where(u < 0.3, torch.zeros(()), torch.where(u < 0.5, torch.full((), -20.0), g))


def make_inputs(gen, b, t, h, hv, n_states, gates="mild", dtype=torch.bfloat16, d=128):
    q = F.normalize(torch.randn(b, t, h, d, generator=gen), dim=-1).to("cuda", dtype)
    k = F.normalize(torch.randn(b, t, h, d, generator=gen), dim=-1).to("cuda", dtype)
    v = torch.randn(b, t, hv, d, generator=gen).to("cuda", dtype)
    g = _gates(gen, (b, t, hv), gates).cuda()
    beta = torch.rand(b, t, hv, generator=gen).clamp_min(1e-3).cuda()
    s0 = torch.randn(n_states, hv, d, d, generator=gen).cuda()
    return q, k, v, g, beta, s0


def run_op(op, q, k, v, g, beta, **kw):
    if op == "gated_delta_rule":
        return dsv4_attn.chunk_gated_delta_rule(q, k, v, g, beta, **kw)
    return dsv4_attn.chunk_simple_gla(q, k, v, g, **kw)


def run_oracle(op, q, k, v, g, beta, **kw):
    kw = {key: val for key, val in kw.items() if key != "output_final_state"}
    if op == "gated_delta_rule":
        return ref.gated_delta_rule(q, k, v, g, beta, **kw)
    return ref.simple_gla(q, k, v, g, **kw)


def assert_rel_rms(ours, want, what):
    assert tuple(ours.shape) == tuple(want.shape), f"{what}: shape {tuple(ours.shape)}"
    assert not torch.isnan(ours).any(), f"{what}: NaN (or an unwritten poisoned element)"
    err = rel_rms(ours, want)
    assert err <= REL_RMS_LIMIT, f"{what}: rel-RMS error {err:.3e} > {REL_RMS_LIMIT:.0e}"


def check_case(gen, op, b, t, h, hv, gates, with_state, output_final_state=True,
               dtype=torch.bfloat16, lens=None):
    n = len(lens) if lens is not None else b
    q, k, v, g, beta, s0 = make_inputs(gen, b, t, h, hv, n, gates, dtype)
    cu = cu_seqlens(lens, "cuda") if lens is not None else None
    assert dsv4_attn.chunk_simple_gla_path(q, k, v, g, cu_seqlens=cu) == "sm90"
    kw = dict(initial_state=s0 if with_state else None, output_final_state=output_final_state,
              cu_seqlens=cu)
    poison_allocator(v.numel() * v.element_size() + n * hv * 128 * 128 * 4 + (1 << 20), "cuda")
    o, final = run_op(op, q, k, v, g, beta, **kw)
    want_o, want_final = run_oracle(op, q, k, v, g, beta, **kw)
    assert o.dtype == dtype and o.shape == v.shape
    assert_rel_rms(o, want_o, "o")
    if output_final_state:
        assert final.dtype == torch.float32 and tuple(final.shape) == (n, hv, 128, 128)
        assert_rel_rms(final, want_final, "final_state")
    else:
        assert final is None
    return q, k, v, g, beta, kw


# (B, T, H, HV, gates, initial_state): T straddles the chunk, GVA ratios 1, 2, 4, 6 and 8 (the
# delta rule's inverse kernel takes 1, 2, 2 and 4 v-heads per CTA).
DENSE = [
    pytest.param(2, 1, 2, 2, "mild", True, id="t1-gva1-state"),
    pytest.param(1, 63, 2, 4, "extreme", False, id="t63-gva2-extreme"),
    pytest.param(2, 64, 1, 1, "mild", True, id="t64-gva1-state"),
    pytest.param(1, 65, 2, 8, "extreme", True, id="t65-gva4-extreme-state"),
    pytest.param(1, 1000, 1, 2, "mild", True, id="t1000-gva2-state"),
    pytest.param(1, 1000, 2, 2, "zero", False, id="t1000-gva1-nodecay"),
    pytest.param(1, 4096, 1, 4, "extreme", True, id="t4096-gva4-extreme-state"),
    pytest.param(1, 4096, 1, 1, "mild", False, id="t4096-gva1"),
    pytest.param(2, 200, 1, 6, "extreme", True, id="t200-gva6-extreme-state"),
    pytest.param(1, 130, 1, 8, "mild", False, id="t130-gva8"),
]


@needs_sm90
@pytest.mark.parametrize("b,t,h,hv,gates,with_state", DENSE)
@pytest.mark.parametrize("op", OPS)
def test_chunk_sm90_dense(gen, op, b, t, h, hv, gates, with_state):
    check_case(gen, op, b, t, h, hv, gates, with_state)


@needs_sm90
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [torch.float16], ids=["fp16"])
def test_chunk_sm90_fp16(gen, op, dtype):
    check_case(gen, op, 2, 300, 2, 4, "mild", True, dtype=dtype)


@needs_sm90
@pytest.mark.parametrize("op", OPS)
def test_chunk_sm90_no_final_state(gen, op):
    check_case(gen, op, 1, 200, 1, 2, "extreme", True, output_final_state=False)


# The delta rule's half-fused form (the chunk kernel's prep solves the even chunks' inverses, the
# inverse kernel the odd ones), forced on dense cases that straddle chunks, every v-head grouping
# and the fp16 input type; DSV4_CHUNK_SEGMENTS=1 keeps the call unsplit, where the form applies.
FUSED = [
    pytest.param(2, 1, 2, 2, "mild", True, torch.bfloat16, id="t1-gva1-state"),
    pytest.param(1, 130, 2, 8, "extreme", True, torch.bfloat16, id="t130-gva4-extreme-state"),
    pytest.param(2, 200, 1, 6, "extreme", False, torch.bfloat16, id="t200-gva6-extreme"),
    pytest.param(1, 1000, 2, 2, "zero", True, torch.float16, id="t1000-gva1-nodecay-fp16"),
    pytest.param(1, 4096, 1, 4, "mild", True, torch.bfloat16, id="t4096-gva4-state"),
]


@needs_sm90
@pytest.mark.parametrize("b,t,h,hv,gates,with_state,dtype", FUSED)
def test_chunk_sm90_delta_fused_inverse(gen, monkeypatch, b, t, h, hv, gates, with_state, dtype):
    monkeypatch.setenv("DSV4_CHUNK_SEGMENTS", "1")
    monkeypatch.setenv("DSV4_CHUNK_FUSED", "1")
    q, k, v, g, beta, kw = check_case(gen, "gated_delta_rule", b, t, h, hv, gates, with_state,
                                      dtype=dtype)
    o1, f1 = run_op("gated_delta_rule", q, k, v, g, beta, **kw)
    o2, f2 = run_op("gated_delta_rule", q, k, v, g, beta, **kw)
    assert torch.equal(o1, o2) and torch.equal(f1, f2), "half-fused form not deterministic"


@needs_sm90
def test_chunk_sm90_delta_fused_inverse_chosen(gen, monkeypatch):
    """A dense call of more than one wave of (sequence, v-head) CTAs takes the half-fused form
    by itself (bitwise the forced form's output), and uses qk l2norm in kernel correctly."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    hv = 8
    b = sms // hv + 1  # B * HV > SMs
    q, k, v, g, beta, s0 = make_inputs(gen, b, 100, 2, hv, b, "extreme")
    kw = dict(initial_state=s0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    q, k = 3.0 * q, 0.5 * k  # not unit: the kernel normalizes them
    o, final = run_op("gated_delta_rule", q, k, v, g, beta, **kw)
    monkeypatch.setenv("DSV4_CHUNK_FUSED", "1")
    o_f, final_f = run_op("gated_delta_rule", q, k, v, g, beta, **kw)
    assert torch.equal(o, o_f) and torch.equal(final, final_f)
    monkeypatch.setenv("DSV4_CHUNK_FUSED", "0")
    o_s, final_s = run_op("gated_delta_rule", q, k, v, g, beta, **kw)
    want_o, want_final = run_oracle("gated_delta_rule", q, k, v, g, beta, **kw)
    for ours in (o, o_s):
        assert_rel_rms(ours, want_o, "o")
    for ours in (final, final_s):
        assert_rel_rms(ours, want_final, "final_state")


VARLEN = [
    pytest.param([1, 64, 65, 1000, 0], 2, 4, True, id="mixed-gva2-state"),
    pytest.param([0, 65, 1000, 1, 64], 1, 4, False, id="mixed-gva4"),
    pytest.param([1000, 0, 64, 65, 1], 2, 2, True, id="mixed-gva1-state"),
]


@needs_sm90
@pytest.mark.parametrize("lens,h,hv,with_state", VARLEN)
@pytest.mark.parametrize("gates", ["mild", "extreme"])
@pytest.mark.parametrize("op", OPS)
def test_chunk_sm90_varlen(gen, op, gates, lens, h, hv, with_state):
    check_case(gen, op, 1, sum(lens), h, hv, gates, with_state, lens=lens)


@needs_sm90
@pytest.mark.parametrize("op", OPS)
def test_chunk_sm90_varlen_empty_sequence_keeps_state(gen, op):
    lens = [65, 0, 130]
    q, k, v, g, beta, s0 = make_inputs(gen, 1, sum(lens), 2, 2, len(lens))
    _, final = run_op(op, q, k, v, g, beta, initial_state=s0, output_final_state=True,
                      cu_seqlens=cu_seqlens(lens, "cuda"))
    assert torch.equal(final[1], s0[1])


@needs_sm90
@pytest.mark.parametrize("op", OPS)
def test_chunk_sm90_deterministic(gen, op):
    q, k, v, g, beta, s0 = make_inputs(gen, 1, 1000, 2, 4, 1, "mild")
    kw = dict(initial_state=s0, output_final_state=True)
    o1, f1 = run_op(op, q, k, v, g, beta, **kw)
    o2, f2 = run_op(op, q, k, v, g, beta, **kw)
    assert torch.equal(o1, o2) and torch.equal(f1, f2)


@needs_sm90
@pytest.mark.parametrize("op", OPS)
def test_chunk_sm90_matches_reference_path(gen, op, monkeypatch):
    """The kernel and the fp32 reference path agree on a multi-chunk GVA case."""
    q, k, v, g, beta, s0 = make_inputs(gen, 2, 333, 2, 4, 2, "extreme")
    kw = dict(initial_state=s0, output_final_state=True)
    o, final = run_op(op, q, k, v, g, beta, **kw)
    monkeypatch.setenv("DSV4_DISABLE_SM90", "1")
    assert dsv4_attn.chunk_simple_gla_path(q, k, v, g) == "reference"
    o_ref, final_ref = run_op(op, q, k, v, g, beta, **kw)
    assert rel_rms(o, o_ref) <= REL_RMS_LIMIT and rel_rms(final, final_ref) <= REL_RMS_LIMIT


@needs_sm90
def test_chunk_uncovered_sizes_take_reference_path(gen):
    q, k, v, g, *_ = make_inputs(gen, 1, 70, 1, 2, 1, d=64)
    assert dsv4_attn.chunk_simple_gla_path(q, k, v, g) == "reference"
    # A strided q (non-unit innermost stride) is not expressible as a TMA box.
    q2 = torch.randn(1, 70, 1, 256, device="cuda", dtype=torch.bfloat16)[..., ::2]
    k2 = torch.randn(1, 70, 1, 128, device="cuda", dtype=torch.bfloat16)
    v2 = torch.randn(1, 70, 2, 128, device="cuda", dtype=torch.bfloat16)
    assert dsv4_attn.chunk_simple_gla_path(q2, k2, v2, g) == "reference"


def _capture(op, static, **kw):
    """One warm-up call, then the op on the `static` inputs (q, k, v, g, beta first) captured
    into a CUDA graph: the graph and its outputs, which each replay refreshes."""
    run_op(op, *static[:5], **kw)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = run_op(op, *static[:5], **kw)
    return graph, outputs


@needs_sm90
@pytest.mark.parametrize("op", OPS)
def test_chunk_sm90_cuda_graph_replay(gen, op):
    """Dense calls are capturable (no host sync on the sm90 path) and replays see new data."""
    static = list(make_inputs(gen, 2, 200, 2, 4, 2, "mild"))
    graph, (o, final) = _capture(op, static, initial_state=static[5], output_final_state=True)
    for _ in range(2):
        fresh = make_inputs(gen, 2, 200, 2, 4, 2, "mild")
        for dst, src in zip(static, fresh):
            dst.copy_(src)
        graph.replay()
        want_o, want_final = run_op(op, *fresh[:5], initial_state=fresh[5],
                                    output_final_state=True)
        assert torch.equal(o, want_o) and torch.equal(final, want_final)


def _many_lengths(gen, n, longest=8192):
    """n sequence lengths from 0 to `longest`, log-uniform, with zeros, ones, a full-chunk length
    and the longest among them, shuffled."""
    lens = torch.exp(torch.rand(n, generator=gen) * torch.log(torch.tensor(float(longest)))).long()
    lens[:5] = torch.tensor([0, 1, 64, longest, 0])
    return lens[torch.randperm(n, generator=gen)].tolist()


@needs_sm90
@pytest.mark.parametrize("n", [64, 256])
@pytest.mark.parametrize("op", OPS)
def test_chunk_sm90_varlen_many_sequences(gen, op, n, monkeypatch):
    """A varlen call over many sequences (longest first on the device) is bitwise equal to one
    dense call per sequence, and agrees with the fp32 reference path."""
    monkeypatch.setenv("DSV4_CHUNK_SEGMENTS", "1")  # the dense calls unsplit, as varlen runs
    lens = _many_lengths(gen, n)
    q, k, v, g, beta, s0 = make_inputs(gen, 1, sum(lens), 1, 2, n, "mild")
    cu = cu_seqlens(lens, "cuda")
    kw = dict(initial_state=s0, output_final_state=True)
    poison_allocator(v.numel() * v.element_size() + n * 2 * 128 * 128 * 4 + (1 << 20), "cuda")
    o, final = run_op(op, q, k, v, g, beta, cu_seqlens=cu, **kw)
    assert not torch.isnan(o).any() and not torch.isnan(final).any()
    starts = cu.tolist()
    for i in range(n):
        a, b = starts[i], starts[i + 1]
        if a == b:
            assert torch.equal(final[i], s0[i]), f"sequence {i} (empty): state changed"
            continue
        o_i, f_i = run_op(op, q[:, a:b], k[:, a:b], v[:, a:b], g[:, a:b], beta[:, a:b],
                          initial_state=s0[i:i + 1], output_final_state=True)
        assert torch.equal(o[:, a:b], o_i), f"sequence {i} (length {b - a}): o differs"
        assert torch.equal(final[i:i + 1], f_i), f"sequence {i} (length {b - a}): state differs"
    monkeypatch.setenv("DSV4_DISABLE_SM90", "1")
    o_ref, final_ref = run_op(op, q, k, v, g, beta, cu_seqlens=cu, **kw)
    assert rel_rms(o, o_ref) <= REL_RMS_LIMIT and rel_rms(final, final_ref) <= REL_RMS_LIMIT


@needs_sm90
@pytest.mark.parametrize("n", [64, 256])
@pytest.mark.parametrize("op", OPS)
def test_chunk_sm90_varlen_cuda_graph_new_lengths(gen, op, n):
    """A varlen call is capturable (no host sync) and a replay follows new cu_seqlens contents
    (same N and T) and new data: n sequences of 0 to 8192 tokens."""
    lens = _many_lengths(gen, n)
    total = sum(lens)
    static = list(make_inputs(gen, 1, total, 2, 4, n, "mild"))
    cu = cu_seqlens(lens, "cuda")
    graph, (o, final) = _capture(op, static, initial_state=static[5], output_final_state=True,
                                 cu_seqlens=cu)
    for _ in range(2):
        new_lens = torch.tensor(_many_lengths(gen, n), dtype=torch.float64)
        # The same total: scale the lengths, then give the rounding remainder to the last one.
        new_lens = (new_lens * total / new_lens.sum()).floor().long()
        new_lens[-1] += total - int(new_lens.sum())
        new_cu = cu_seqlens(new_lens.tolist(), "cuda")
        fresh = make_inputs(gen, 1, total, 2, 4, n, "mild")
        for dst, src in zip(static, fresh):
            dst.copy_(src)
        cu.copy_(new_cu)
        graph.replay()
        want_o, want_final = run_op(op, *fresh[:5], initial_state=fresh[5],
                                    output_final_state=True, cu_seqlens=new_cu)
        assert torch.equal(o, want_o) and torch.equal(final, want_final)


def _head_gates(gen, b, t, hv):
    """Exactly zero gates (no decay, where truncating the history is never exact) on the first
    half of the v-heads, strong decay (down to -5 per token) on the rest."""
    g = -5.0 * torch.rand(b, t, hv, generator=gen)
    g[..., : hv // 2] = 0.0
    return g.cuda()


# How far a segmented call may move from the unsplit kernel (rel-RMS; o, final_state). Simple
# GLA's combine is exact and its warm-ups drop at most e^-10 of the history; the delta rule's
# segment maps come from a pass whose state is rounded to 16 bits per chunk like the unsplit
# walk's, so the two differ by that rounding.
SEGMENTS_VS_WHOLE = {"simple_gla": (2e-3, 1e-4), "gated_delta_rule": (5e-3, 5e-3)}


def _segment_gates(gen, b, t, hv, kind):
    """heads: _head_gates (no decay on half the heads, strong decay on the rest); weak: about
    -0.6 per chunk on every head, so every segment's starting state matters; strong: every
    head forgets its history within one chunk."""
    if kind == "heads":
        return _head_gates(gen, b, t, hv)
    if kind == "weak":
        return (-0.02 * torch.rand(b, t, hv, generator=gen)).cuda()
    return (-5.0 * torch.rand(b, t, hv, generator=gen)).cuda()


@needs_sm90
@pytest.mark.parametrize("segments", [3, 7])
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("gates", ["heads", "weak", "strong"])
@pytest.mark.parametrize("op", OPS)
def test_chunk_sm90_segments_match_oracle(gen, monkeypatch, op, gates, segments, with_state):
    """A sequence cut into segments (forced) matches the oracle and the unsplit kernel, with
    weak, strong and mixed decay, a ragged last segment and two sequences."""
    b, t, h, hv = 2, 1000, 2, 4
    q, k, v, _, beta, s0 = make_inputs(gen, b, t, h, hv, b)
    g = _segment_gates(gen, b, t, hv, gates)
    kw = dict(initial_state=s0 if with_state else None, output_final_state=True)
    monkeypatch.setenv("DSV4_CHUNK_SEGMENTS", "1")
    o_whole, f_whole = run_op(op, q, k, v, g, beta, **kw)
    monkeypatch.setenv("DSV4_CHUNK_SEGMENTS", str(segments))
    poison_allocator(v.numel() * v.element_size() + b * hv * 128 * 128 * 4 + (1 << 20), "cuda")
    o, final = run_op(op, q, k, v, g, beta, **kw)
    want_o, want_final = run_oracle(op, q, k, v, g, beta, **kw)
    assert_rel_rms(o, want_o, "o")
    assert_rel_rms(final, want_final, "final_state")
    o_limit, final_limit = SEGMENTS_VS_WHOLE[op]
    assert rel_rms(o, o_whole) <= o_limit, f"o vs unsplit: {rel_rms(o, o_whole):.2e}"
    assert rel_rms(final, f_whole) <= final_limit, f"final vs unsplit: {rel_rms(final, f_whole):.2e}"
    o2, f2 = run_op(op, q, k, v, g, beta, **kw)
    assert torch.equal(o, o2) and torch.equal(final, f2), "not deterministic"


def _exact_then_planned(monkeypatch, segments, op, q, k, v, g, beta, **kw):
    """The call cut into `segments` segments twice: every head through the exact combine
    (DSV4_CHUNK_WARMUP=0), then as the segment plan decides (the allocator poisoned between)."""
    monkeypatch.setenv("DSV4_CHUNK_SEGMENTS", str(segments))
    monkeypatch.setenv("DSV4_CHUNK_WARMUP", "0")
    exact = run_op(op, q, k, v, g, beta, **kw)
    monkeypatch.delenv("DSV4_CHUNK_WARMUP")
    states = 2 * segments * v.shape[2] * 128 * 128 * 4  # local and start (or maps)
    poison_allocator(v.numel() * v.element_size() + states + (1 << 20), "cuda")
    return exact, run_op(op, q, k, v, g, beta, **kw)


@needs_sm90
@pytest.mark.parametrize("per_token, warm", [(0.0375, False), (0.041, True), (0.2, True)])
@pytest.mark.parametrize("op", OPS)
def test_chunk_sm90_segment_warmup_decision(gen, monkeypatch, op, per_token, warm):
    """The segment plan starts a segment from a warm-up only where the history provably fades
    to e^-10 within a segment's length (4 chunks here, so a constant gate of -10/256 per token
    is the edge). Below the edge the call is bitwise the exact combine's; above it, it differs
    from it (the warm-up ran; a much faster decay would underflow the dropped history to
    exactly zero in fp32, and the two would agree bitwise). Both match the oracle."""
    b, t, h, hv = 1, 1024, 2, 4
    q, k, v, _, beta, s0 = make_inputs(gen, b, t, h, hv, b)
    g = torch.full((b, t, hv), -per_token, device="cuda")
    kw = dict(initial_state=s0, output_final_state=True)
    (o_exact, f_exact), (o, final) = _exact_then_planned(monkeypatch, 4, op, q, k, v, g, beta,
                                                         **kw)
    same = torch.equal(o, o_exact) and torch.equal(final, f_exact)
    assert same != warm, "a warm-up was taken" if same is False else "no warm-up was taken"
    want_o, want_final = run_oracle(op, q, k, v, g, beta, **kw)
    assert_rel_rms(o, want_o, "o")
    assert_rel_rms(final, want_final, "final_state")


@needs_sm90
@pytest.mark.parametrize("op", OPS)
def test_chunk_sm90_segment_plan_whole_head(gen, monkeypatch, op):
    """A head takes warm-ups only if all of its segments found one, although the delta rule's
    plan decides each segment in a warp of its own (four per CTA): eight segments, and heads
    whose gates change halfway, so that one group of four segments finds warm-ups and the other
    does not. Those heads must be bitwise the exact combine's; the decaying head must not."""
    b, t, h, hv = 1, 2048, 2, 4
    q, k, v, _, beta, s0 = make_inputs(gen, b, t, h, hv, b)
    g = torch.zeros(b, t, hv, device="cuda")
    g[..., 0] = -0.2                # every segment finds a one-chunk warm-up
    g[:, : t // 2, 2] = -0.2        # segments 1-4 find one, 5-7 do not
    g[:, t // 2 :, 3] = -0.2        # segments 5-7 find one, 1-4 do not; head 1: none
    kw = dict(initial_state=s0, output_final_state=True)
    (o_exact, f_exact), (o, final) = _exact_then_planned(monkeypatch, 8, op, q, k, v, g, beta,
                                                         **kw)
    for head in (1, 2, 3):
        assert torch.equal(o[:, :, head], o_exact[:, :, head]), f"head {head}: o not exact"
        assert torch.equal(final[:, head], f_exact[:, head]), f"head {head}: state not exact"
    assert not torch.equal(o[:, :, 0], o_exact[:, :, 0]), "head 0 took no warm-up"
    want_o, want_final = run_oracle(op, q, k, v, g, beta, **kw)
    assert_rel_rms(o, want_o, "o")
    assert_rel_rms(final, want_final, "final_state")


@needs_sm90
@pytest.mark.parametrize("op", OPS)
def test_chunk_sm90_segments_strided_views(gen, monkeypatch, op):
    """Segments of transposed (B, H, T, D) views, two sequences: every pass reads q, k and v
    through their strides (nothing is merged or copied), with and without a final state."""
    b, t, h, hv = 2, 700, 2, 4
    q, k, v, g, beta, s0 = make_inputs(gen, b, t, h, hv, b)
    views = [x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v)]
    assert not views[0].is_contiguous()
    monkeypatch.setenv("DSV4_CHUNK_SEGMENTS", "3")
    assert dsv4_attn.chunk_simple_gla_path(*views, g) == "sm90"
    for output_final_state in (True, False):
        kw = dict(initial_state=s0, output_final_state=output_final_state)
        poison_allocator(v.numel() * v.element_size() + 6 * hv * 128 * 128 * 4 + (1 << 20), "cuda")
        o, final = run_op(op, *views, g, beta, **kw)
        want_o, want_final = run_oracle(op, q, k, v, g, beta, **kw)
        assert_rel_rms(o, want_o, "o")
        if output_final_state:
            assert_rel_rms(final, want_final, "final_state")
        else:
            assert final is None


@needs_sm90
def test_chunk_sm90_delta_segments_l2norm_in_kernel(gen, monkeypatch):
    """The delta rule cut into segments with use_qk_l2norm_in_kernel (q and k of norm 2 and 3):
    every pass normalizes them the same way."""
    b, t, h, hv = 1, 1500, 2, 4
    q, k, v, _, beta, s0 = make_inputs(gen, b, t, h, hv, b)
    g = _head_gates(gen, b, t, hv)
    kw = dict(initial_state=s0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    monkeypatch.setenv("DSV4_CHUNK_SEGMENTS", "4")
    o, final = run_op("gated_delta_rule", 2 * q, 3 * k, v, g, beta, **kw)
    want_o, want_final = run_oracle("gated_delta_rule", 2 * q, 3 * k, v, g, beta, **kw)
    assert_rel_rms(o, want_o, "o")
    assert_rel_rms(final, want_final, "final_state")


@needs_sm90
@pytest.mark.parametrize("t", [65536, 131072])
@pytest.mark.parametrize("op", OPS)
def test_chunk_sm90_long_few_heads(gen, monkeypatch, op, t):
    """The long few-head shapes (both ops split them into segments on their own) against the
    fp32 reference path: zero gates on half the heads, strong decay on the rest, an initial and
    a final state."""
    q, k, v, _, beta, s0 = make_inputs(gen, 1, t, 2, 8, 1)
    g = _head_gates(gen, 1, t, 8)
    kw = dict(initial_state=s0, output_final_state=True)
    o, final = run_op(op, q, k, v, g, beta, **kw)
    assert not torch.isnan(o).any() and not torch.isnan(final).any()
    monkeypatch.setenv("DSV4_DISABLE_SM90", "1")
    o_ref, final_ref = run_op(op, q, k, v, g, beta, **kw)
    assert rel_rms(o, o_ref) <= REL_RMS_LIMIT, f"o: {rel_rms(o, o_ref):.2e}"
    assert rel_rms(final, final_ref) <= REL_RMS_LIMIT, f"final: {rel_rms(final, final_ref):.2e}"


@needs_sm90
@pytest.mark.parametrize("op", OPS)
def test_chunk_sm90_segments_cuda_graph(gen, monkeypatch, op):
    """The segmented call (its passes and the combine) is capturable and replays see new
    data."""
    monkeypatch.setenv("DSV4_CHUNK_SEGMENTS", "3")
    static = list(make_inputs(gen, 2, 500, 2, 4, 2, "mild"))
    kw = dict(initial_state=static[5], output_final_state=True)
    run_op(op, *static[:5], **kw)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o, final = run_op(op, *static[:5], **kw)
    fresh = make_inputs(gen, 2, 500, 2, 4, 2, "extreme")
    for dst, src in zip(static, fresh):
        dst.copy_(src)
    graph.replay()
    want_o, want_final = run_op(op, *fresh[:5], initial_state=fresh[5],
                                output_final_state=True)
    assert torch.equal(o, want_o) and torch.equal(final, want_final)
