"""The ops as torch custom ops: torch.library.opcheck and torch.compile(fullgraph=True).

opcheck runs each op's schema, fake-kernel and AOT-dispatch checks on small samples;
the compile tests trace functions that call each op without a graph break and compare
against eager. aot_eager keeps CPU time low; one inductor test covers the default backend.
"""
import math

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from dsv4_attn import ops

from conftest import assert_lse_close, cu_seqlens, rand, randn


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


# ----------------------------------------------------------------------------- samples


def _fmha_samples(gen, device):
    yield (randn(gen, 1, 7, 4, 64, device=device), randn(gen, 1, 9, 2, 64, device=device),
           randn(gen, 1, 9, 2, 32, device=device)), {}
    yield (randn(gen, 2, 9, 4, 64, dtype=torch.float16, device=device),
           randn(gen, 2, 7, 1, 64, dtype=torch.float16, device=device),
           randn(gen, 2, 7, 1, 64, dtype=torch.float16, device=device)), dict(
        causal=True, window_left=3, sinks=randn(gen, 4, dtype=torch.float32, device=device),
        scale=0.2)
    yield (randn(gen, 10, 4, 64, device=device), randn(gen, 12, 2, 64, device=device),
           randn(gen, 12, 2, 64, device=device)), dict(
        causal=True, cu_seqlens_q=cu_seqlens([3, 0, 7], device),
        cu_seqlens_k=cu_seqlens([5, 2, 5], device), max_seqlen_q=7, max_seqlen_k=5)


def _dsv4_samples(gen, device):
    q, kv = randn(gen, 2, 9, 4, 64, device=device), randn(gen, 2, 20, 64, device=device)
    comp = randn(gen, 2, 5, 64, device=device)
    yield (q, kv), dict(window=4, sinks=randn(gen, 4, dtype=torch.float32, device=device))
    yield (q, kv), dict(window=3, compressed_kv=comp, compress_ratio=4)
    yield (q, kv), dict(window=3, compressed_kv=comp, compress_ratio=4, scale=0.3,
                        topk_indices=torch.randint(-1, 6, (2, 9, 3), generator=gen,
                                                   dtype=torch.int32).to(device))
    yield (randn(gen, 8, 4, 64, device=device), randn(gen, 15, 64, device=device)), dict(
        window=5, compressed_kv=randn(gen, 4, 64, device=device), compress_ratio=3,
        cu_seqlens_q=cu_seqlens([3, 0, 5], device), cu_seqlens_kv=cu_seqlens([6, 2, 7], device),
        cu_seqlens_compressed=cu_seqlens([2, 0, 2], device), max_seqlen_q=5, max_seqlen_kv=7)


def _merge_samples(gen, device):
    def lse(*shape):
        x = randn(gen, *shape, dtype=torch.float32, device=device)
        return x.masked_fill(rand(gen, *shape, device=device) < 0.2, -math.inf)
    yield (randn(gen, 2, 7, 4, 64, device=device), lse(2, 4, 7),
           randn(gen, 2, 7, 4, 64, device=device), lse(2, 4, 7)), {}
    yield (randn(gen, 10, 4, 32, device=device), lse(4, 10),
           randn(gen, 10, 4, 32, device=device), lse(4, 10)), {}


def _chunk_args(gen, device, b, t, h, hv, dk, dv, with_beta):
    q = torch.nn.functional.normalize(randn(gen, b, t, h, dk, dtype=torch.float32), dim=-1)
    k = torch.nn.functional.normalize(randn(gen, b, t, h, dk, dtype=torch.float32), dim=-1)
    args = [q.to(device, torch.bfloat16), k.to(device, torch.bfloat16),
            randn(gen, b, t, hv, dv, device=device), (-0.5 * rand(gen, b, t, hv)).to(device)]
    if with_beta:
        args.append(rand(gen, b, t, hv, device=device))
    return tuple(args)


def _chunk_samples(gen, device, with_beta):
    yield _chunk_args(gen, device, 2, 70, 1, 2, 32, 16, with_beta), dict(
        initial_state=randn(gen, 2, 2, 32, 16, dtype=torch.float32, device=device),
        output_final_state=True)
    yield _chunk_args(gen, device, 1, 12, 2, 2, 16, 16, with_beta), dict(
        cu_seqlens=cu_seqlens([5, 0, 7], device), output_final_state=False, scale=0.5)


SAMPLES = {
    "fmha": _fmha_samples,
    "dsv4_attention": _dsv4_samples,
    "merge_attn_states": _merge_samples,
    "chunk_gated_delta_rule": lambda gen, dev: _chunk_samples(gen, dev, True),
    "chunk_simple_gla": lambda gen, dev: _chunk_samples(gen, dev, False),
}


@pytest.mark.parametrize("name", list(SAMPLES))
def test_opcheck(gen, device, name):
    op = getattr(torch.ops.dsv4, name)
    for args, kwargs in SAMPLES[name](gen, device):
        torch.library.opcheck(op, args, kwargs)


# ----------------------------------------------------------------------------- torch.compile


def _attention_block(q, k, v, sinks):
    # An fmha split over two key halves, merged, then a residual: three ops in one graph.
    half = k.shape[1] // 2
    o_a, lse_a = ops.fmha(q, k[:, :half], v[:, :half], return_lse=True)
    o_b, lse_b = ops.fmha(q, k[:, half:], v[:, half:], return_lse=True)
    merged, lse = ops.merge_attn_states(o_a, lse_a, o_b, lse_b)
    windowed = ops.fmha(q, k, v, causal=True, window_left=5, sinks=sinks)
    return merged.float() + windowed.float(), lse


def _linear_block(q, k, v, g, beta, s0):
    o1, s1 = ops.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=s0,
                                        output_final_state=True)
    o2, none = ops.chunk_simple_gla(q, k, v, g, output_final_state=False)
    assert none is None
    return o1.float() - o2.float(), s1


def _varlen_block(q, k, v, cu_q, cu_k):
    out, lse = ops.fmha(q, k, v, causal=True, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                        max_seqlen_q=7, max_seqlen_k=9, return_lse=True)
    return out * 2, lse


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compile_attention_fullgraph(gen, device, backend):
    q = randn(gen, 2, 17, 4, 64, device=device)
    k = randn(gen, 2, 24, 2, 64, device=device)
    v = randn(gen, 2, 24, 2, 64, device=device)
    sinks = randn(gen, 4, dtype=torch.float32, device=device)
    compiled = torch.compile(_attention_block, fullgraph=True, backend=backend)
    out, lse = compiled(q, k, v, sinks)
    want_out, want_lse = _attention_block(q, k, v, sinks)
    torch.testing.assert_close(out, want_out)
    assert_lse_close(lse, want_lse, atol=0)


def _dsv4_layer(q, kv, comp, topk, sinks):
    # A CSA layer and an HCA layer on the same q, as a model's forward would call them.
    csa = ops.dsv4_attention(q, kv, sinks=sinks, compressed_kv=comp, compress_ratio=4,
                             topk_indices=topk)
    hca = ops.dsv4_attention(q, kv, sinks=sinks, window=16, compressed_kv=comp,
                             compress_ratio=4)
    return csa.float() + hca.float()


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compile_dsv4_attention_fullgraph(gen, device, backend):
    q, kv = randn(gen, 1, 12, 8, 64, device=device), randn(gen, 1, 40, 64, device=device)
    comp = randn(gen, 1, 10, 64, device=device)
    topk = torch.randint(-1, 10, (1, 12, 4), generator=gen, dtype=torch.int32).to(device)
    sinks = randn(gen, 8, dtype=torch.float32, device=device)
    compiled = torch.compile(_dsv4_layer, fullgraph=True, backend=backend)
    torch.testing.assert_close(compiled(q, kv, comp, topk, sinks),
                               _dsv4_layer(q, kv, comp, topk, sinks))


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compile_linear_attention_fullgraph(gen, device, backend):
    q, k, v, g, beta = _chunk_args(gen, device, 1, 70, 1, 2, 32, 16, with_beta=True)
    s0 = randn(gen, 1, 2, 32, 16, dtype=torch.float32, device=device)
    compiled = torch.compile(_linear_block, fullgraph=True, backend=backend)
    out, state = compiled(q, k, v, g, beta, s0)
    want_out, want_state = _linear_block(q, k, v, g, beta, s0)
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(state, want_state)


def test_compile_varlen_fullgraph(gen, device):
    q = randn(gen, 10, 4, 64, device=device)
    k = randn(gen, 12, 1, 64, device=device)
    cu_q, cu_k = cu_seqlens([3, 0, 7], device), cu_seqlens([9, 1, 2], device)
    compiled = torch.compile(_varlen_block, fullgraph=True, backend="aot_eager")
    out, lse = compiled(q, k, k, cu_q, cu_k)
    want_out, want_lse = _varlen_block(q, k, k, cu_q, cu_k)
    torch.testing.assert_close(out, want_out)
    assert_lse_close(lse, want_lse, atol=0)


def test_compile_dynamic_shapes(gen, device):
    # The fake kernels must produce symbolic shapes: one graph serves several lengths.
    def f(q, k, v):
        out, lse = ops.fmha(q, k, v, causal=True, return_lse=True)
        o, s = ops.chunk_simple_gla(q, k, v, lse.transpose(1, 2).contiguous().neg().sigmoid()
                                    .log(), output_final_state=True)
        return out, o, s

    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(f, fullgraph=True, backend=counter, dynamic=True)
    for s in (9, 33, 70):
        q, k, v = (randn(gen, 1, s, 2, 32, device=device) for _ in range(3))
        got = compiled(q, k, v)
        want = f(q, k, v)
        for a, b in zip(got, want):
            assert a.shape == b.shape
            torch.testing.assert_close(a, b)
    assert counter.frame_count == 1, f"recompiled: {counter.frame_count} graphs for 3 lengths"


def test_compile_inductor(gen, device):
    # Default backend on one op plus pointwise work around it.
    def f(out_a, lse_a, out_b, lse_b):
        out, lse = ops.merge_attn_states(out_a * 0.5, lse_a, out_b, lse_b + 1.0)
        return out.float().sum(-1), lse

    args = (randn(gen, 2, 7, 4, 32, device=device), randn(gen, 2, 4, 7, dtype=torch.float32,
                                                          device=device),
            randn(gen, 2, 7, 4, 32, device=device), randn(gen, 2, 4, 7, dtype=torch.float32,
                                                          device=device))
    compiled = torch.compile(f, fullgraph=True)
    got = compiled(*args)
    want = f(*args)
    torch.testing.assert_close(got[0], want[0], rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(got[1], want[1])
