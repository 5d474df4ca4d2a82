"""The float64 oracles checked against naive per-element loops and closed forms.

Everything here is pure torch on tiny inputs, so it runs without the compiled extension.
"""
import importlib.util
import math
import pathlib

import pytest
import torch

try:
    from dsv4_attn import reference as ref
except ImportError:  # extension not built: load the pure-torch module from its file
    _path = pathlib.Path(__file__).resolve().parents[1] / "dsv4_attn" / "reference.py"
    _spec = importlib.util.spec_from_file_location("dsv4_reference", _path)
    ref = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(ref)

F64 = torch.float64


def _randn(gen, *shape):
    return torch.randn(*shape, generator=gen, dtype=F64)


def _unit(x):
    return x / x.norm(dim=-1, keepdim=True)


# ----------------------------------------------------------------------------- attention


def _naive_attention(q, k, v, scale, causal, window_left, sinks):
    """One (batch, head, query) at a time with python floats."""
    b, sq, hq, _ = q.shape
    sk, hkv, dv = k.shape[1], k.shape[2], v.shape[3]
    out = torch.zeros(b, sq, hq, dv, dtype=F64)
    lse = torch.full((b, hq, sq), -math.inf, dtype=F64)
    for bi in range(b):
        for h in range(hq):
            kh = h // (hq // hkv)
            for i in range(sq):
                p = i + sk - sq
                keys = [j for j in range(sk)
                        if (not causal or j <= p) and (window_left < 0 or j >= p - window_left)]
                weights = [math.exp(scale * float(q[bi, i, h] @ k[bi, j, kh])) for j in keys]
                z = sum(weights) + (math.exp(float(sinks[h])) if sinks is not None else 0.0)
                if z == 0.0:
                    continue
                for w, j in zip(weights, keys):
                    out[bi, i, h] += w / z * v[bi, j, kh]
                lse[bi, h, i] = math.log(z)
    return out, lse


@pytest.mark.parametrize("sq,sk", [(5, 7), (7, 5), (6, 6), (1, 7)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window_left", [-1, 0, 2])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_attention_matches_naive_loop(gen, sq, sk, causal, window_left, with_sinks):
    b, hq, hkv, d, dv = 2, 4, 2, 8, 6
    q, k, v = _randn(gen, b, sq, hq, d), _randn(gen, b, sk, hkv, d), _randn(gen, b, sk, hkv, dv)
    sinks = _randn(gen, hq) if with_sinks else None
    scale = 0.7
    out, lse = ref.attention(q, k, v, scale=scale, causal=causal, window_left=window_left,
                             sinks=sinks)
    want_out, want_lse = _naive_attention(q, k, v, scale, causal, window_left, sinks)
    torch.testing.assert_close(out, want_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, want_lse, rtol=1e-12, atol=1e-12)


def test_attention_default_scale_and_gqa_mapping(gen):
    # With Hkv = 1 every query head must read the single kv head; default scale is D^-0.5.
    q, k, v = _randn(gen, 1, 3, 4, 16), _randn(gen, 1, 5, 1, 16), _randn(gen, 1, 5, 1, 8)
    out, lse = ref.attention(q, k, v)
    want_out, want_lse = _naive_attention(q, k, v, 16 ** -0.5, False, -1, None)
    torch.testing.assert_close(out, want_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, want_lse, rtol=1e-12, atol=1e-12)


def test_attention_fully_masked_rows_are_zero_and_neg_inf(gen):
    # Causal with Sq > Sk: the first Sq - Sk queries see no key at all.
    q, k, v = _randn(gen, 1, 9, 2, 8), _randn(gen, 1, 4, 2, 8), _randn(gen, 1, 4, 2, 8)
    out, lse = ref.attention(q, k, v, causal=True)
    assert not out.isnan().any() and not lse.isnan().any()
    assert (out[:, :5] == 0).all()
    assert (lse[:, :, :5] == -math.inf).all()
    assert torch.isfinite(lse[:, :, 5:]).all()


def test_attention_sink_only_rows(gen):
    # No visible key but a sink: out = 0 and lse = sink.
    q, k, v = _randn(gen, 1, 3, 2, 8), _randn(gen, 1, 0, 1, 8), _randn(gen, 1, 0, 1, 8)
    sinks = _randn(gen, 2)
    out, lse = ref.attention(q, k, v, sinks=sinks)
    assert out.shape == (1, 3, 2, 8) and (out == 0).all()
    torch.testing.assert_close(lse[0], sinks.view(2, 1).expand(2, 3))


def test_attention_empty_queries(gen):
    q, k, v = _randn(gen, 2, 0, 2, 8), _randn(gen, 2, 5, 2, 8), _randn(gen, 2, 5, 2, 4)
    out, lse = ref.attention(q, k, v, causal=True)
    assert out.shape == (2, 0, 2, 4) and lse.shape == (2, 2, 0)


def test_attention_varlen_equals_per_sequence_dense(gen):
    lens_q, lens_k = [3, 0, 5, 1, 2], [4, 2, 5, 0, 1]
    hq, hkv, d = 4, 1, 8
    cu_q = torch.tensor([0] + torch.tensor(lens_q).cumsum(0).tolist(), dtype=torch.int32)
    cu_k = torch.tensor([0] + torch.tensor(lens_k).cumsum(0).tolist(), dtype=torch.int32)
    q, k, v = _randn(gen, sum(lens_q), hq, d), _randn(gen, sum(lens_k), hkv, d), _randn(
        gen, sum(lens_k), hkv, d)
    sinks = _randn(gen, hq)
    out, lse = ref.attention(q, k, v, causal=True, window_left=1, sinks=sinks,
                             cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    assert out.shape == (sum(lens_q), hq, d) and lse.shape == (hq, sum(lens_q))
    for i in range(len(lens_q)):
        q0, q1, k0, k1 = cu_q[i], cu_q[i + 1], cu_k[i], cu_k[i + 1]
        want_out, want_lse = _naive_attention(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1],
                                              d ** -0.5, True, 1, sinks)
        torch.testing.assert_close(out[q0:q1], want_out[0], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(lse[:, q0:q1], want_lse[0], rtol=1e-12, atol=1e-12)


def test_attention_low_precision_inputs_come_back_float64(gen):
    q = _randn(gen, 1, 3, 2, 8).to(torch.bfloat16)
    out, lse = ref.attention(q, q, q)
    assert out.dtype == F64 and lse.dtype == F64 and out.device.type == "cpu"


@pytest.mark.parametrize("split", [0, 3, 7])
def test_merge_of_disjoint_halves_equals_whole(gen, split):
    q, k, v = _randn(gen, 2, 4, 2, 8), _randn(gen, 2, 7, 2, 8), _randn(gen, 2, 7, 2, 8)
    out_a, lse_a = ref.attention(q, k[:, :split], v[:, :split])
    out_b, lse_b = ref.attention(q, k[:, split:], v[:, split:])
    out, lse = ref.merge_attn_states(out_a, lse_a, out_b, lse_b)
    want_out, want_lse = ref.attention(q, k, v)
    torch.testing.assert_close(out, want_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, want_lse, rtol=1e-12, atol=1e-12)


def test_merge_two_empty_sides_gives_zero_and_neg_inf():
    out = torch.zeros(5, 2, 4, dtype=F64)  # varlen layout (total, H, Dv); lse (H, total)
    lse = torch.full((2, 5), -math.inf, dtype=F64)
    m_out, m_lse = ref.merge_attn_states(out, lse, out, lse)
    assert (m_out == 0).all() and (m_lse == -math.inf).all()


# ----------------------------------------------------------------------------- linear attention


def _naive_recurrence(q, k, v, g, beta, scale, s0):
    """One (v-head) at a time with explicit K x V loops; beta None means simple GLA."""
    b, t_len, h, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    o = torch.zeros(b, t_len, hv, dv, dtype=F64)
    final = torch.zeros(b, hv, dk, dv, dtype=F64)
    for bi in range(b):
        for vh in range(hv):
            qh = vh // (hv // h)
            s = [[float(s0[bi, vh, a, c]) if s0 is not None else 0.0 for c in range(dv)]
                 for a in range(dk)]
            for t in range(t_len):
                decay = math.exp(float(g[bi, t, vh]))
                s = [[decay * x for x in row] for row in s]
                kt, vt, qt = k[bi, t, qh].tolist(), v[bi, t, vh].tolist(), q[bi, t, qh].tolist()
                if beta is None:
                    write = vt
                else:
                    pred = [sum(kt[a] * s[a][c] for a in range(dk)) for c in range(dv)]
                    write = [float(beta[bi, t, vh]) * (vt[c] - pred[c]) for c in range(dv)]
                s = [[s[a][c] + kt[a] * write[c] for c in range(dv)] for a in range(dk)]
                for c in range(dv):
                    o[bi, t, vh, c] = scale * sum(qt[a] * s[a][c] for a in range(dk))
            final[bi, vh] = torch.tensor(s, dtype=F64)
    return o, final


def _chunk_inputs(gen, b, t_len, h, hv, dk, dv):
    q, k = _unit(_randn(gen, b, t_len, h, dk)), _unit(_randn(gen, b, t_len, h, dk))
    v = _randn(gen, b, t_len, hv, dv)
    g = -0.5 * torch.rand(b, t_len, hv, generator=gen, dtype=F64)
    beta = torch.rand(b, t_len, hv, generator=gen, dtype=F64)
    s0 = _randn(gen, b, hv, dk, dv)
    return q, k, v, g, beta, s0


@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("ratio", [1, 2])
def test_gated_delta_rule_matches_naive_loop(gen, with_state, ratio):
    q, k, v, g, beta, s0 = _chunk_inputs(gen, 2, 5, 2, 2 * ratio, 3, 4)
    s0 = s0 if with_state else None
    o, final = ref.gated_delta_rule(q, k, v, g, beta, scale=0.6, initial_state=s0)
    want_o, want_final = _naive_recurrence(q, k, v, g, beta, 0.6, s0)
    torch.testing.assert_close(o, want_o, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(final, want_final, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("ratio", [1, 2])
def test_simple_gla_matches_naive_loop(gen, ratio):
    q, k, v, g, _, s0 = _chunk_inputs(gen, 2, 5, 1, ratio, 3, 2)
    o, final = ref.simple_gla(q, k, v, g, initial_state=s0)
    want_o, want_final = _naive_recurrence(q, k, v, g, None, 3 ** -0.5, s0)
    torch.testing.assert_close(o, want_o, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(final, want_final, rtol=1e-12, atol=1e-12)


def test_simple_gla_matches_closed_form(gen):
    # o_t = scale * (sum_{s<=t} exp(G_t - G_s) (q_t . k_s) v_s + exp(G_t) S0^T q_t), G = cumsum(g).
    q, k, v, g, _, s0 = _chunk_inputs(gen, 1, 9, 1, 1, 6, 5)
    g[0, 3] = 0.0  # exact zeros in the log decay are legal
    scale = 0.9
    o, final = ref.simple_gla(q, k, v, g, scale=scale, initial_state=s0)
    gc = g[0, :, 0].cumsum(0)
    decay = torch.exp(gc[:, None] - gc[None, :]).tril()  # (t, s), zero for s > t
    scores = (q[0, :, 0] @ k[0, :, 0].T) * decay
    want = scale * (scores @ v[0, :, 0] + torch.exp(gc)[:, None] * (q[0, :, 0] @ s0[0, 0]))
    torch.testing.assert_close(o[0, :, 0], want, rtol=1e-12, atol=1e-12)
    want_final = torch.exp(gc[-1]) * s0[0, 0] + (
        torch.exp(gc[-1] - gc)[:, None] * k[0, :, 0]).T @ v[0, :, 0]
    torch.testing.assert_close(final[0, 0], want_final, rtol=1e-12, atol=1e-12)


def test_gated_delta_rule_beta_zero_only_decays(gen):
    q, k, v, g, beta, s0 = _chunk_inputs(gen, 1, 6, 1, 1, 4, 3)
    o, final = ref.gated_delta_rule(q, k, v, g, torch.zeros_like(beta), scale=1.0, initial_state=s0)
    gc = g[0, :, 0].cumsum(0)
    want = torch.exp(gc)[:, None] * (q[0, :, 0] @ s0[0, 0])
    torch.testing.assert_close(o[0, :, 0], want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(final[0, 0], torch.exp(gc[-1]) * s0[0, 0], rtol=1e-12, atol=1e-12)


def test_gated_delta_rule_beta_one_stores_value_exactly(gen):
    # With beta = 1 and a unit key, the state afterwards maps k_t to v_t: S^T k_t = v_t.
    q, k, v, g, _, s0 = _chunk_inputs(gen, 1, 4, 1, 1, 8, 5)
    for t in range(1, 5):
        _, final = ref.gated_delta_rule(q[:, :t], k[:, :t], v[:, :t], g[:, :t],
                                        torch.ones(1, t, 1, dtype=F64), initial_state=s0)
        torch.testing.assert_close(k[0, t - 1, 0] @ final[0, 0], v[0, t - 1, 0],
                                   rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("oracle", ["gated_delta_rule", "simple_gla"])
def test_recurrence_varlen_equals_per_sequence_dense(gen, oracle):
    lens = [3, 0, 6, 1]
    cu = torch.tensor([0, 3, 3, 9, 10], dtype=torch.int32)
    q, k, v, g, beta, _ = _chunk_inputs(gen, 1, sum(lens), 1, 2, 4, 3)
    s0 = _randn(gen, len(lens), 2, 4, 3)
    fn = getattr(ref, oracle)
    extra = (beta,) if oracle == "gated_delta_rule" else ()
    o, final = fn(q, k, v, g, *extra, initial_state=s0, cu_seqlens=cu)
    assert o.shape == (1, sum(lens), 2, 3) and final.shape == (len(lens), 2, 4, 3)
    for i in range(len(lens)):
        t0, t1 = int(cu[i]), int(cu[i + 1])
        sl = slice(t0, t1)
        extra_i = (beta[:, sl],) if extra else ()
        want_o, want_final = fn(q[:, sl], k[:, sl], v[:, sl], g[:, sl], *extra_i,
                                initial_state=s0[i:i + 1])
        torch.testing.assert_close(o[:, sl], want_o, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(final[i:i + 1], want_final, rtol=1e-12, atol=1e-12)
    # The zero-length sequence passes its initial state through untouched.
    torch.testing.assert_close(final[1], s0[1], rtol=0, atol=0)


def test_recurrence_does_not_modify_inputs(gen):
    q, k, v, g, beta, s0 = _chunk_inputs(gen, 1, 4, 1, 1, 4, 3)
    before = [t.clone() for t in (q, k, v, g, beta, s0)]
    ref.gated_delta_rule(q, k, v, g, beta, initial_state=s0)
    ref.simple_gla(q, k, v, g, initial_state=s0)
    for b, a in zip(before, (q, k, v, g, beta, s0)):
        assert torch.equal(a, b)
