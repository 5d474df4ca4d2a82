"""The chunk ops take what transformers' Qwen3-Next and flash-linear-attention pass them.

- g and beta in bf16 or fp16 (used in fp32): the same result as passing their fp32 values;
- cu_seqlens in int64: the same result as int32;
- use_qk_l2norm_in_kernel=True: the oracle on l2-normalized q and k (fla's meaning).

Each case runs on CPU and, gpu-marked, on CUDA; K = V = 128 takes the sm90 kernel on a Hopper
GPU, K, V = 32, 48 the reference path there (the path is asserted where it matters).
"""
import pytest
import torch

from dsv4_attn import ops
from dsv4_attn import reference as ref

from conftest import assert_close_to_ref, cu_seqlens, rand, randn


def _inputs(gen, device, t=130, h=2, hv=4, dk=128, dv=128, dtype=torch.bfloat16):
    # Unnormalized q, k: what a model hands over when it asks for the in-kernel l2norm.
    q = randn(gen, 1, t, h, dk, dtype=dtype, device=device)
    k = randn(gen, 1, t, h, dk, dtype=dtype, device=device)
    v = randn(gen, 1, t, hv, dv, dtype=dtype, device=device)
    g = (-0.5 * rand(gen, 1, t, hv)).to(device)
    beta = rand(gen, 1, t, hv).clamp_min(1e-3).to(device)
    return q, k, v, g, beta


DIMS = [pytest.param(128, 128, id="k128"), pytest.param(32, 48, id="k32v48")]


@pytest.mark.parametrize("dk,dv", DIMS)
@pytest.mark.parametrize("gate_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_half_gates_equal_their_fp32_values(gen, device, gate_dtype, dk, dv):
    q, k, v, g, beta = _inputs(gen, device, dk=dk, dv=dv)
    q, k = torch.nn.functional.normalize(q.float(), dim=-1).to(q.dtype), \
        torch.nn.functional.normalize(k.float(), dim=-1).to(k.dtype)
    g_h, beta_h = g.to(gate_dtype), beta.to(gate_dtype)
    o, s = ops.chunk_gated_delta_rule(q, k, v, g_h, beta_h, output_final_state=True)
    o32, s32 = ops.chunk_gated_delta_rule(q, k, v, g_h.float(), beta_h.float(),
                                          output_final_state=True)
    assert torch.equal(o, o32) and torch.equal(s, s32)
    want_o, want_s = ref.gated_delta_rule(q, k, v, g_h.float(), beta_h.float())
    assert_close_to_ref(o, want_o, v.dtype, what="o")
    assert_close_to_ref(s, want_s, v.dtype, what="final_state")
    o_gla, _ = ops.chunk_simple_gla(q, k, v, g_h)
    o_gla32, _ = ops.chunk_simple_gla(q, k, v, g_h.float())
    assert torch.equal(o_gla, o_gla32)


@pytest.mark.parametrize("op", ["chunk_gated_delta_rule", "chunk_simple_gla"])
def test_int64_cu_seqlens_equals_int32(gen, device, op):
    lens = [70, 0, 5, 64]
    q, k, v, g, beta = _inputs(gen, device, t=sum(lens))
    q, k = torch.nn.functional.normalize(q.float(), dim=-1).to(q.dtype), \
        torch.nn.functional.normalize(k.float(), dim=-1).to(k.dtype)
    args = (q, k, v, g, beta) if op == "chunk_gated_delta_rule" else (q, k, v, g)
    fn = getattr(ops, op)
    cu32 = cu_seqlens(lens, device)
    o32, s32 = fn(*args, cu_seqlens=cu32, output_final_state=True)
    o64, s64 = fn(*args, cu_seqlens=cu32.long(), output_final_state=True)
    assert torch.equal(o32, o64) and torch.equal(s32, s64)


@pytest.mark.parametrize("dk,dv", DIMS)
@pytest.mark.parametrize("lens", [None, [70, 0, 5, 64]], ids=["dense", "varlen"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_qk_l2norm_in_kernel(gen, device, dtype, lens, dk, dv):
    t = 130 if lens is None else sum(lens)
    q, k, v, g, beta = _inputs(gen, device, t=t, dk=dk, dv=dv, dtype=dtype)
    q, k = 3.0 * q, 0.5 * k  # far from unit norm: a missing normalization cannot pass
    cu = None if lens is None else cu_seqlens(lens, device)
    s0 = randn(gen, 1 if lens is None else len(lens), 4, dk, dv, dtype=torch.float32,
               device=device)
    o, s = ops.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=s0, cu_seqlens=cu,
                                      output_final_state=True, use_qk_l2norm_in_kernel=True)
    want_o, want_s = ref.gated_delta_rule(q, k, v, g, beta, initial_state=s0, cu_seqlens=cu,
                                          use_qk_l2norm_in_kernel=True)
    assert_close_to_ref(o, want_o, dtype, what="o")
    assert_close_to_ref(s, want_s, dtype, what="final_state")
    # The flag is exactly "normalize first": the op on pre-normalized inputs agrees.
    o_pre, _ = ops.chunk_gated_delta_rule(ref.l2norm(q).to(device), ref.l2norm(k).to(device), v,
                                          g, beta, initial_state=s0, cu_seqlens=cu)
    assert_close_to_ref(o, o_pre, dtype, what="o vs pre-normalized")


def test_l2norm_default_is_off(gen):
    q, k, v, g, beta = _inputs(gen, "cpu", t=20, dk=32, dv=32)
    o_default, _ = ops.chunk_gated_delta_rule(q, k, v, g, beta)
    o_off, _ = ops.chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=False)
    o_on, _ = ops.chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
    assert torch.equal(o_default, o_off)
    assert not torch.allclose(o_default.float(), o_on.float())
