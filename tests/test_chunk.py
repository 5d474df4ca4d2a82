"""dsv4.chunk_gated_delta_rule and dsv4.chunk_simple_gla against the token-by-token oracles.

T in {1, 63, 64, 65, 200} straddles the 64-token chunk; GVA ratios (HV / H) 1 and 2;
K = V = 128 and K, V = 32, 48; with and without initial state and final state; varlen with
an empty sequence. Inputs look like a model's: q, k L2-normalised, g a log decay in
(-0.5, 0] with some exact zeros, beta in (0, 1).
"""
import pytest
import torch
import torch.nn.functional as F

from dsv4_attn import ops
from dsv4_attn import reference as ref

from conftest import HALF_DTYPES, assert_close_to_ref, cu_seqlens, rand, randn

OPS = ["gated_delta_rule", "simple_gla"]


def _inputs(gen, b, t, h, hv, dk, dv, dtype, device, n_states):
    q = F.normalize(randn(gen, b, t, h, dk, dtype=torch.float32), dim=-1).to(device, dtype)
    k = F.normalize(randn(gen, b, t, h, dk, dtype=torch.float32), dim=-1).to(device, dtype)
    v = randn(gen, b, t, hv, dv, dtype=dtype, device=device)
    g = -0.5 * rand(gen, b, t, hv)
    g = g.masked_fill(rand(gen, b, t, hv) < 0.1, 0.0).to(device)  # some gates exactly open
    beta = rand(gen, b, t, hv).clamp_min(1e-3).to(device)
    s0 = randn(gen, n_states, hv, dk, dv, dtype=torch.float32, device=device)
    return q, k, v, g, beta, s0


def _run(op, q, k, v, g, beta, **kw):
    if op == "gated_delta_rule":
        return (ops.chunk_gated_delta_rule(q, k, v, g, beta, **kw),
                ref.gated_delta_rule(q, k, v, g, beta, **_ref_kw(kw)))
    return (ops.chunk_simple_gla(q, k, v, g, **kw),
            ref.simple_gla(q, k, v, g, **_ref_kw(kw)))


def _ref_kw(kw):
    return {key: val for key, val in kw.items() if key != "output_final_state"}


def _check(o, final, want_o, want_final, v, want_final_shape, output_final_state):
    dtype = v.dtype
    assert o.dtype == dtype and o.device == v.device and o.shape == v.shape
    assert_close_to_ref(o, want_o, dtype, what="o")
    if not output_final_state:
        assert final is None
        return
    assert final.dtype == torch.float32 and final.device == v.device
    assert tuple(final.shape) == want_final_shape
    assert_close_to_ref(final, want_final, dtype, what="final_state")


# (B, T, H, HV, K, V, initial_state, output_final_state)
DENSE_CASES = [
    pytest.param(2, 1, 2, 2, 128, 128, False, True, id="t1-gva1-k128"),
    pytest.param(1, 63, 2, 4, 32, 48, True, True, id="t63-gva2-k32v48-state"),
    pytest.param(2, 64, 2, 2, 128, 128, True, False, id="t64-gva1-k128-state-nofinal"),
    pytest.param(1, 65, 1, 2, 32, 48, False, True, id="t65-gva2-k32v48"),
    pytest.param(2, 200, 2, 4, 128, 128, True, True, id="t200-gva2-k128-state"),
    pytest.param(1, 200, 2, 2, 32, 48, False, False, id="t200-gva1-k32v48-nofinal"),
]


@pytest.mark.parametrize("b,t,h,hv,dk,dv,with_state,output_final_state", DENSE_CASES)
@pytest.mark.parametrize("dtype", HALF_DTYPES + [torch.float32], ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("op", OPS)
def test_chunk_dense(gen, device, op, dtype, b, t, h, hv, dk, dv, with_state,
                     output_final_state):
    q, k, v, g, beta, s0 = _inputs(gen, b, t, h, hv, dk, dv, dtype, device, b)
    kw = dict(initial_state=s0 if with_state else None, output_final_state=output_final_state)
    (o, final), (want_o, want_final) = _run(op, q, k, v, g, beta, **kw)
    _check(o, final, want_o, want_final, v, (b, hv, dk, dv), output_final_state)


# (lengths, H, HV, K, V, initial_state, output_final_state)
VARLEN_CASES = [
    pytest.param([3, 0, 65, 130], 2, 2, 128, 128, True, True, id="gva1-k128-state"),
    pytest.param([64, 0, 1, 63], 1, 2, 32, 48, False, True, id="gva2-k32v48"),
    pytest.param([0, 200, 0], 2, 4, 32, 48, True, False, id="gva2-edges-empty-nofinal"),
]


@pytest.mark.parametrize("lens,h,hv,dk,dv,with_state,output_final_state", VARLEN_CASES)
@pytest.mark.parametrize("op", OPS)
def test_chunk_varlen(gen, device, op, lens, h, hv, dk, dv, with_state, output_final_state):
    n = len(lens)
    q, k, v, g, beta, s0 = _inputs(gen, 1, sum(lens), h, hv, dk, dv, torch.bfloat16, device, n)
    cu = cu_seqlens(lens, device)
    kw = dict(initial_state=s0 if with_state else None, output_final_state=output_final_state,
              cu_seqlens=cu)
    (o, final), (want_o, want_final) = _run(op, q, k, v, g, beta, **kw)
    _check(o, final, want_o, want_final, v, (n, hv, dk, dv), output_final_state)
    if output_final_state:
        # An empty sequence hands back its initial state (or zeros) untouched.
        for i, length in enumerate(lens):
            if length == 0:
                want = s0[i] if with_state else torch.zeros_like(s0[i])
                torch.testing.assert_close(final[i], want, rtol=1e-6, atol=0)


@pytest.mark.parametrize("op", OPS)
def test_chunk_varlen_equals_separate_calls(gen, device, op):
    # Packing sequences must not leak state between them.
    lens = [65, 0, 7, 130]
    q, k, v, g, beta, s0 = _inputs(gen, 1, sum(lens), 1, 2, 64, 64, torch.bfloat16, device,
                                   len(lens))
    fn = ops.chunk_gated_delta_rule if op == "gated_delta_rule" else ops.chunk_simple_gla
    extra = (beta,) if op == "gated_delta_rule" else ()
    o, final = fn(q, k, v, g, *extra, initial_state=s0, output_final_state=True,
                  cu_seqlens=cu_seqlens(lens, device))
    start = 0
    for i, n in enumerate(lens):
        sl = slice(start, start + n)
        extra_i = (beta[:, sl],) if extra else ()
        o_i, final_i = fn(q[:, sl], k[:, sl], v[:, sl], g[:, sl], *extra_i,
                          initial_state=s0[i:i + 1], output_final_state=True)
        assert_close_to_ref(o[:, sl], o_i, torch.bfloat16, what=f"o of sequence {i}")
        assert_close_to_ref(final[i:i + 1], final_i, torch.float16, what=f"state of sequence {i}")
        start += n


@pytest.mark.parametrize("op", OPS)
def test_chunk_explicit_scale_and_strided_inputs(gen, device, op):
    # (B, H, T, K) storage passed as (B, T, H, K) views.
    b, t, h, hv, dk, dv = 2, 65, 2, 2, 64, 32
    q = F.normalize(randn(gen, b, h, t, dk, dtype=torch.float32), dim=-1).to(device,
                                                                             torch.bfloat16)
    k = F.normalize(randn(gen, b, h, t, dk, dtype=torch.float32), dim=-1).to(device,
                                                                             torch.bfloat16)
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    v = randn(gen, b, hv, t, dv, device=device).transpose(1, 2)
    g = (-0.5 * rand(gen, b, hv, t)).to(device).transpose(1, 2)
    beta = rand(gen, b, hv, t).to(device).transpose(1, 2)
    (o, final), (want_o, want_final) = _run(op, q, k, v, g, beta, scale=0.3,
                                            output_final_state=True)
    _check(o, final, want_o, want_final, v, (b, hv, dk, dv), True)


@pytest.mark.parametrize("op", OPS)
def test_chunk_strong_decay(gen, device, op):
    # Cumulative log decay reaches about -1000 inside one chunk: a chunked form that divides
    # exp(G_i) by exp(G_j) overflows or gives NaN here.
    q, k, v, _, beta, s0 = _inputs(gen, 1, 130, 1, 2, 32, 48, torch.bfloat16, device, 1)
    g = (-30.0 * rand(gen, 1, 130, 2)).to(device)
    (o, final), (want_o, want_final) = _run(op, q, k, v, g, beta, initial_state=s0,
                                            output_final_state=True)
    _check(o, final, want_o, want_final, v, (1, 2, 32, 48), True)


@pytest.mark.parametrize("op", OPS)
def test_chunk_zero_tokens(gen, device, op):
    # T = 0: empty o, and the final state is the initial state.
    q, k, v, g, beta, s0 = _inputs(gen, 2, 0, 1, 2, 32, 48, torch.bfloat16, device, 2)
    (o, final), _ = _run(op, q, k, v, g, beta, initial_state=s0, output_final_state=True)
    assert o.shape == (2, 0, 2, 48) and torch.equal(final, s0)


@pytest.mark.slow
@pytest.mark.parametrize("op", OPS)
def test_chunk_long_sequence(gen, device, op):
    # Many chunks: error must not grow with the number of state hand-offs.
    q, k, v, g, beta, s0 = _inputs(gen, 1, 1000, 1, 2, 128, 128, torch.bfloat16, device, 1)
    (o, final), (want_o, want_final) = _run(op, q, k, v, g, beta, initial_state=s0,
                                            output_final_state=True)
    _check(o, final, want_o, want_final, v, (1, 2, 128, 128), True)


@pytest.mark.parametrize("op", OPS)
def test_chunk_does_not_modify_inputs(gen, device, op):
    lens = [3, 0, 65]
    q, k, v, g, beta, s0 = _inputs(gen, 1, sum(lens), 1, 2, 32, 48, torch.bfloat16, device, 3)
    cu = cu_seqlens(lens, device)
    args = (q, k, v, g, beta, s0, cu)
    before = [x.clone() for x in args]
    _run(op, q, k, v, g, beta, initial_state=s0, output_final_state=True, cu_seqlens=cu)
    for a, b in zip(args, before):
        assert torch.equal(a, b)


def test_chunk_path_names_an_implementation(gen, device):
    q = randn(gen, 1, 7, 2, 64, device=device)
    v = randn(gen, 1, 7, 4, 32, device=device)
    g = torch.zeros(1, 7, 4, device=device)
    for path in (ops.chunk_gated_delta_rule_path(q, q, v, g, g), ops.chunk_simple_gla_path(q, q, v, g)):
        assert path in ("sm90", "reference")
        if device.type == "cpu":
            assert path == "reference"
