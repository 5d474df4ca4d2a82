"""Bad inputs raise RuntimeError with a message naming the op, the argument and the requirement.

The launchers (csrc/fmha/*.cpp, csrc/sm90/chunk/*.cpp, csrc/ops/checks.h) word every failure as
"<op>: <argument> <requirement> (got <value>)"; each regex below matches the argument and
the requirement, not the whole sentence. One test per class of bad input, one case per
variant. Every case starts from a valid call, so only the named defect can trip a check.

Every case whose defect is in devices, dtypes, ranks or sizes also runs under FakeTensorMode
(what torch.compile traces with): the fake kernels must reject it with the same message.
Defects in the values of cu_seqlens can only be seen when the op runs (fake=False).
"""
import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_map_only

from dsv4_attn import ops

from conftest import cu_seqlens, randn

BF16 = torch.bfloat16


# ----------------------------------------------------------------------------- fmha inputs


def _dense(gen, device="cpu", **over):
    """A valid dense call's arguments; `over` replaces any of them."""
    args = dict(q=randn(gen, 1, 7, 4, 64, device=device),
                k=randn(gen, 1, 9, 2, 64, device=device),
                v=randn(gen, 1, 9, 2, 64, device=device))
    args.update(over)
    return args


def _varlen(gen, device="cpu", **over):
    """A valid varlen call: q (10, 4, 64) in sequences [3, 7], k/v (12, 2, 64) in [5, 7]."""
    args = dict(q=randn(gen, 10, 4, 64, device=device),
                k=randn(gen, 12, 2, 64, device=device),
                v=randn(gen, 12, 2, 64, device=device),
                cu_seqlens_q=cu_seqlens([3, 7], device),
                cu_seqlens_k=cu_seqlens([5, 7], device))
    args.update(over)
    return args


def _fmha(args):
    args = dict(args)
    q, k, v = args.pop("q"), args.pop("k"), args.pop("v")
    return ops.fmha(q, k, v, **args)


def _raises(match, fn, *args, fake=True, **kwargs):
    with pytest.raises(RuntimeError, match=match):
        fn(*args, **kwargs)
    if not fake:
        return
    mode = FakeTensorMode()
    fake_args, fake_kwargs = tree_map_only(torch.Tensor, mode.from_tensor, (args, kwargs))
    with mode, pytest.raises(RuntimeError, match=match):
        fn(*fake_args, **fake_kwargs)


def test_fmha_valid_base_calls_pass(gen):
    # Guards the cases below: each differs from these only by its defect.
    _fmha(_dense(gen, sinks=torch.zeros(4)))
    _fmha(_varlen(gen, max_seqlen_q=7, max_seqlen_k=7))


@pytest.mark.parametrize("make,match", [
    pytest.param(lambda g: _dense(g, q=randn(g, 1, 7, 4, 64, dtype=torch.float32),
                                  k=randn(g, 1, 9, 2, 64, dtype=torch.float32),
                                  v=randn(g, 1, 9, 2, 64, dtype=torch.float32)),
                 r"fmha: q must be bf16 or fp16 .*got Float", id="fp32-q"),
    pytest.param(lambda g: _dense(g, k=randn(g, 1, 9, 2, 64, dtype=torch.float16)),
                 r"fmha: k must have the same dtype as q", id="k-fp16-q-bf16"),
    pytest.param(lambda g: _dense(g, v=randn(g, 1, 9, 2, 64, dtype=torch.float16)),
                 r"fmha: v must have the same dtype as q", id="v-fp16-q-bf16"),
])
def test_fmha_wrong_dtype(gen, make, match):
    _raises(match, _fmha, make(gen))


@pytest.mark.parametrize("name", ["q", "k", "v"])
def test_fmha_last_dim_not_contiguous(gen, name):
    shape = {"q": (1, 7, 4, 64), "k": (1, 9, 2, 64), "v": (1, 9, 2, 64)}[name]
    bad = randn(gen, *shape[:2], shape[3], shape[2]).transpose(-1, -2)  # right shape, stride != 1
    assert bad.shape == shape and bad.stride(-1) != 1
    _raises(rf"fmha: {name} must be contiguous in its last dim", _fmha, _dense(gen, **{name: bad}))


@pytest.mark.parametrize("make,match", [
    pytest.param(lambda g: _dense(g, k=randn(g, 1, 9, 3, 64), v=randn(g, 1, 9, 3, 64)),
                 r"query heads must be a multiple of the KV heads.*Hq = 4, Hkv = 3",
                 id="hq-not-multiple-of-hkv"),
    pytest.param(lambda g: _dense(g, v=randn(g, 1, 9, 1, 64)),
                 r"fmha: v\.size\(2\) \(Hkv, as in k\) must be 2", id="v-heads-differ-from-k"),
    pytest.param(lambda g: _varlen(g, k=randn(g, 12, 3, 64), v=randn(g, 12, 3, 64)),
                 r"query heads must be a multiple of the KV heads", id="varlen-hq-hkv"),
])
def test_fmha_mismatched_heads(gen, make, match):
    _raises(match, _fmha, make(gen))


@pytest.mark.parametrize("make,match", [
    pytest.param(lambda g: _dense(g, k=randn(g, 1, 9, 2, 128)),
                 r"fmha: k must have the same head_dim as q \(q: 64, k: 128\)", id="k-d"),
    pytest.param(lambda g: _dense(g, v=randn(g, 1, 8, 2, 64)),
                 r"fmha: v\.size\(1\) \(Sk, as in k\) must be 9", id="v-sk"),
    pytest.param(lambda g: _varlen(g, v=randn(g, 11, 2, 64)),
                 r"fmha: v\.size\(0\) \(total_k, as in k\) must be 12", id="varlen-v-total"),
    pytest.param(lambda g: _dense(g, q=randn(g, 7, 4, 64)),
                 r"fmha: q must be 4-D", id="dense-q-3d"),
    pytest.param(lambda g: _varlen(g, k=randn(g, 1, 12, 2, 64)),
                 r"fmha: k must be 3-D", id="varlen-k-4d"),
])
def test_fmha_mismatched_shapes(gen, make, match):
    _raises(match, _fmha, make(gen))


@pytest.mark.parametrize("tensor", ["k", "v"])
def test_fmha_batch_mismatch(gen, tensor):
    bad = randn(gen, 2, 9, 2, 64)
    _raises(rf"fmha: {tensor}\.size\(0\) \(batch, as in q\) must be 1", _fmha,
            _dense(gen, **{tensor: bad}))


@pytest.mark.parametrize("make,match", [
    pytest.param(lambda g: _dense(g, q=randn(g, 1, 7, 4, 60), k=randn(g, 1, 9, 2, 60),
                                  v=randn(g, 1, 9, 2, 60)),
                 r"fmha: q\.size\(-1\) \(head_dim\) must be a positive multiple of 8.*got 60",
                 id="d60"),
    pytest.param(lambda g: _dense(g, v=randn(g, 1, 9, 2, 36)),
                 r"fmha: v\.size\(-1\) \(head_dim_v\) must be a positive multiple of 8.*got 36",
                 id="dv36"),
    pytest.param(lambda g: _dense(g, q=randn(g, 1, 7, 4, 520), k=randn(g, 1, 9, 2, 520),
                                  v=randn(g, 1, 9, 2, 520)),
                 r"fmha: q\.size\(-1\) \(head_dim\) must be .*at most 512.*got 520", id="d520"),
    pytest.param(lambda g: _dense(g, v=randn(g, 1, 9, 2, 576)),
                 r"fmha: v\.size\(-1\) \(head_dim_v\) must be .*at most 512.*got 576",
                 id="dv576"),
])
def test_fmha_bad_head_dim(gen, make, match):
    _raises(match, _fmha, make(gen))


@pytest.mark.parametrize("make,match", [
    pytest.param(lambda g: _varlen(g, cu_seqlens_q=cu_seqlens([3, 7]).float()),
                 r"fmha: cu_seqlens_q must be int32 or int64 \(got Float\)", id="float"),
    pytest.param(lambda g: _varlen(g, cu_seqlens_k=torch.tensor([1, 5, 12], dtype=torch.int32)),
                 r"fmha: cu_seqlens_k must start at 0 \(got 1\)", id="not-from-0"),
    pytest.param(lambda g: _varlen(g, cu_seqlens_q=torch.tensor([0, 6, 3, 10], dtype=torch.int32),
                                   cu_seqlens_k=torch.tensor([0, 5, 5, 12], dtype=torch.int32)),
                 r"fmha: cu_seqlens_q must be non-decreasing", id="decreasing"),
    pytest.param(lambda g: _varlen(g, cu_seqlens_q=torch.tensor([0, 3, 9], dtype=torch.int32)),
                 r"fmha: cu_seqlens_q must end at q\.size\(0\) = 10 \(got 9\)", id="short-q"),
    pytest.param(lambda g: _varlen(g, cu_seqlens_k=torch.tensor([0, 5, 13], dtype=torch.int32)),
                 r"fmha: cu_seqlens_k must end at k\.size\(0\) = 12 \(got 13\)", id="long-k"),
    pytest.param(lambda g: _varlen(g, cu_seqlens_k=None),
                 r"fmha: cu_seqlens_q and cu_seqlens_k must be given together", id="only-q"),
    pytest.param(lambda g: _varlen(g, cu_seqlens_q=None),
                 r"fmha: cu_seqlens_q and cu_seqlens_k must be given together", id="only-k"),
    pytest.param(lambda g: _varlen(g, cu_seqlens_q=cu_seqlens([3, 7]).view(1, 3)),
                 r"fmha: cu_seqlens_q must be 1-D", id="2d"),
    pytest.param(lambda g: _varlen(g, cu_seqlens_k=cu_seqlens([5, 0, 7])),
                 r"fmha: cu_seqlens_k must have the same length as cu_seqlens_q", id="n-differs"),
    pytest.param(lambda g: _varlen(g, max_seqlen_q=6),
                 r"fmha: max_seqlen_q must be >= the longest query sequence \(7\)",
                 id="max-seqlen-too-small"),
    pytest.param(lambda g: _dense(g, max_seqlen_k=9),
                 r"fmha: max_seqlen_q and max_seqlen_k apply to varlen calls only",
                 id="max-seqlen-dense"),
])
def test_fmha_bad_cu_seqlens(gen, request, make, match):
    values = any(v in request.node.callspec.id for v in
                 ("not-from-0", "decreasing", "short-q", "long-k", "max-seqlen-too-small"))
    _raises(match, _fmha, make(gen), fake=not values)


@pytest.mark.parametrize("sinks,match", [
    pytest.param(lambda: torch.zeros(3), r"fmha: sinks must have shape \(Hq,\) = \(4,\).*\[3\]",
                 id="wrong-length"),
    pytest.param(lambda: torch.zeros(1, 4), r"fmha: sinks must have shape \(Hq,\)", id="2d"),
    pytest.param(lambda: torch.zeros(4, dtype=BF16), r"fmha: sinks must be Float \(got BFloat16\)",
                 id="bf16"),
])
def test_fmha_bad_sinks(gen, sinks, match):
    _raises(match, _fmha, _dense(gen, sinks=sinks()))


@pytest.mark.parametrize("scale", [math.nan, math.inf])
def test_fmha_non_finite_scale(gen, scale):
    _raises(r"fmha: scale must be finite", _fmha, _dense(gen, scale=scale))


def test_fmha_path_validates_like_fmha(gen):
    q = randn(gen, 1, 7, 4, 64, dtype=torch.float32)
    _raises(r"fmha: q must be bf16 or fp16", ops.fmha_path, q, q, q, fake=False)


@pytest.mark.gpu
@pytest.mark.parametrize("make,match", [
    pytest.param(lambda g: _dense(g, "cuda", k=randn(g, 1, 9, 2, 64)),
                 r"fmha: k must be on the same device as q", id="k-cpu"),
    pytest.param(lambda g: _dense(g, "cuda", v=randn(g, 1, 9, 2, 64)),
                 r"fmha: v must be on the same device as q", id="v-cpu"),
    pytest.param(lambda g: _dense(g, "cuda", sinks=torch.zeros(4)),
                 r"fmha: sinks must be on the same device as q", id="sinks-cpu"),
    pytest.param(lambda g: _varlen(g, "cuda", cu_seqlens_q=cu_seqlens([3, 7])),
                 r"fmha: cu_seqlens_q must be on the same device as q", id="cu-q-cpu"),
])
def test_fmha_device_mix(gen, make, match):
    _raises(match, _fmha, make(gen), fake=False)  # fake mode: test_fake_kernels_check_devices


# ----------------------------------------------------------------------------- merge inputs


def _merge(gen, **over):
    args = dict(out_a=randn(gen, 1, 7, 4, 64), lse_a=randn(gen, 1, 4, 7, dtype=torch.float32),
                out_b=randn(gen, 1, 7, 4, 64), lse_b=randn(gen, 1, 4, 7, dtype=torch.float32))
    args.update(over)
    return args


def test_merge_valid_base_call_passes(gen):
    ops.merge_attn_states(**_merge(gen))


@pytest.mark.parametrize("make,match", [
    pytest.param(lambda g: _merge(g, out_a=randn(g, 1, 7, 4, 64, dtype=torch.float64),
                                  out_b=randn(g, 1, 7, 4, 64, dtype=torch.float64)),
                 r"merge_attn_states: out_a must be bf16, fp16 or fp32 \(got Double\)",
                 id="fp64-out"),
    pytest.param(lambda g: _merge(g, out_b=randn(g, 1, 7, 4, 64, dtype=torch.float16)),
                 r"merge_attn_states: out_b must have the same dtype as out_a", id="out-mix"),
    pytest.param(lambda g: _merge(g, lse_a=randn(g, 1, 4, 7)),
                 r"merge_attn_states: lse_a must be Float \(got BFloat16\)", id="lse-bf16"),
])
def test_merge_wrong_dtype(gen, make, match):
    _raises(match, ops.merge_attn_states, **make(gen))


@pytest.mark.parametrize("make,match", [
    pytest.param(lambda g: _merge(g, out_b=randn(g, 1, 8, 4, 64)),
                 r"merge_attn_states: out_b must have out_a's shape", id="out-shape"),
    pytest.param(lambda g: _merge(g, lse_a=randn(g, 1, 7, 4, dtype=torch.float32)),
                 r"merge_attn_states: lse_a must have shape \(B, H, Sq\)", id="lse-out-layout"),
    pytest.param(lambda g: _merge(g, lse_b=randn(g, 4, 7, dtype=torch.float32)),
                 r"merge_attn_states: lse_b must have shape \(B, H, Sq\)", id="lse-rank"),
    pytest.param(lambda g: _merge(g, out_a=randn(g, 7, 4, 64), out_b=randn(g, 7, 4, 64),
                                  lse_a=randn(g, 7, 4, dtype=torch.float32),
                                  lse_b=randn(g, 4, 7, dtype=torch.float32)),
                 r"merge_attn_states: lse_a must have shape \(H, total_q\)", id="varlen-lse"),
    pytest.param(lambda g: _merge(g, out_a=randn(g, 28, 64), out_b=randn(g, 28, 64)),
                 r"merge_attn_states: out_a must be \(B, Sq, H, Dv\) or \(total_q, H, Dv\)",
                 id="out-2d"),
])
def test_merge_mismatched_shapes(gen, make, match):
    _raises(match, ops.merge_attn_states, **make(gen))


@pytest.mark.gpu
def test_merge_device_mix(gen):
    args = _merge(gen)
    args["out_a"] = args["out_a"].cuda()
    _raises(r"merge_attn_states: lse_a must be on the same device as out_a",
            ops.merge_attn_states, fake=False, **args)


# ----------------------------------------------------------------------------- chunk inputs

CHUNK_OPS = ["chunk_gated_delta_rule", "chunk_simple_gla"]


def _chunk(gen, op, device="cpu", b=1, t=9, h=2, hv=4, dk=32, dv=16, **over):
    """A valid call's arguments for `op`; `over` replaces any of them (None drops beta)."""
    args = dict(q=randn(gen, b, t, h, dk, device=device), k=randn(gen, b, t, h, dk, device=device),
                v=randn(gen, b, t, hv, dv, device=device),
                g=-torch.rand(b, t, hv, generator=gen).to(device),
                beta=torch.rand(b, t, hv, generator=gen).to(device))
    if op == "chunk_simple_gla":
        del args["beta"]
    args.update(over)
    return args


def _call_chunk(op, args):
    fn = getattr(ops, op)
    args = dict(args)
    pos = [args.pop(n) for n in ("q", "k", "v", "g", "beta") if n in args]
    return fn(*pos, **args)


@pytest.mark.parametrize("op", CHUNK_OPS)
def test_chunk_valid_base_calls_pass(gen, op):
    _call_chunk(op, _chunk(gen, op, initial_state=torch.zeros(1, 4, 32, 16),
                           output_final_state=True))
    _call_chunk(op, _chunk(gen, op, initial_state=torch.zeros(3, 4, 32, 16),
                           cu_seqlens=cu_seqlens([4, 0, 5])))


@pytest.mark.parametrize("op", CHUNK_OPS)
@pytest.mark.parametrize("over,match", [
    pytest.param(lambda g: dict(q=randn(g, 1, 9, 2, 32, dtype=torch.float64),
                                k=randn(g, 1, 9, 2, 32, dtype=torch.float64),
                                v=randn(g, 1, 9, 4, 16, dtype=torch.float64)),
                 r"q must be bf16, fp16 or fp32 \(got Double\)", id="fp64-qkv"),
    pytest.param(lambda g: dict(k=randn(g, 1, 9, 2, 32, dtype=torch.float16)),
                 r"k must have the same dtype as q", id="k-fp16"),
    pytest.param(lambda g: dict(v=randn(g, 1, 9, 4, 16, dtype=torch.float16)),
                 r"v must have the same dtype as q", id="v-fp16"),
    pytest.param(lambda g: dict(g=torch.zeros(1, 9, 4, dtype=torch.float64)),
                 r"g must be fp32, bf16 or fp16 \(got Double\)", id="g-fp64"),
    pytest.param(lambda g: dict(initial_state=torch.zeros(1, 4, 32, 16, dtype=BF16)),
                 r"initial_state must be Float \(got BFloat16\)", id="state-bf16"),
    pytest.param(lambda g: dict(cu_seqlens=cu_seqlens([4, 5]).float()),
                 r"cu_seqlens must be int32 or int64 \(got Float\)", id="cu-float"),
])
def test_chunk_wrong_dtype(gen, op, over, match):
    _raises(rf"{op}: {match}", _call_chunk, op, _chunk(gen, op, **over(gen)))


@pytest.mark.parametrize("over,match", [
    pytest.param(lambda g: dict(beta=torch.rand(1, 9, 4, generator=g).double()),
                 r"beta must be fp32, bf16 or fp16 \(got Double\)", id="beta-fp64"),
    pytest.param(lambda g: dict(beta=torch.rand(1, 9, 2, generator=g)),
                 r"beta must have shape \(B, T, HV\)", id="beta-shape"),
    pytest.param(lambda g: dict(beta=torch.rand(1, 9, generator=g)),
                 r"beta must have shape \(B, T, HV\)", id="beta-rank"),
])
def test_chunk_bad_beta(gen, over, match):
    op = "chunk_gated_delta_rule"
    _raises(rf"{op}: {match}", _call_chunk, op, _chunk(gen, op, **over(gen)))


@pytest.mark.parametrize("op", CHUNK_OPS)
@pytest.mark.parametrize("over,match", [
    pytest.param(lambda g: dict(g=torch.zeros(1, 9, 2)), r"g must have shape \(B, T, HV\)",
                 id="g-heads"),
    pytest.param(lambda g: dict(g=torch.zeros(1, 8, 4)), r"g must have shape \(B, T, HV\)",
                 id="g-time"),
    pytest.param(lambda g: dict(g=torch.zeros(1, 9, 4, 1)), r"g must have shape \(B, T, HV\)",
                 id="g-rank"),
    pytest.param(lambda g: dict(v=randn(g, 1, 9, 3, 16), g=torch.zeros(1, 9, 3),
                                beta=torch.zeros(1, 9, 3)),
                 r"the v-heads HV must be a multiple of the qk-heads H \(got H = 2, HV = 3\)",
                 id="hv-not-multiple-of-h"),
    pytest.param(lambda g: dict(k=randn(g, 1, 9, 2, 64)), r"k must have q's shape",
                 id="k-dim"),
    pytest.param(lambda g: dict(v=randn(g, 1, 8, 4, 16)), r"v\.size\(1\) \(T, as in q\) must be 9",
                 id="v-time"),
    pytest.param(lambda g: dict(q=randn(g, 9, 2, 32), k=randn(g, 9, 2, 32)),
                 r"q must be 4-D", id="q-3d"),
    pytest.param(lambda g: dict(initial_state=torch.zeros(1, 4, 16, 32)),
                 r"initial_state must have shape \(N, HV, K, V\) = \(1, 4, 32, 16\)",
                 id="state-kv-swapped"),
    pytest.param(lambda g: dict(initial_state=torch.zeros(2, 4, 32, 16)),
                 r"initial_state must have shape \(N, HV, K, V\) = \(1, 4, 32, 16\)",
                 id="state-n"),
    pytest.param(lambda g: dict(initial_state=torch.zeros(2, 4, 32, 16),
                                cu_seqlens=cu_seqlens([4, 0, 5])),
                 r"initial_state must have shape \(N, HV, K, V\) = \(3, 4, 32, 16\)",
                 id="varlen-state-n"),
])
def test_chunk_mismatched_shapes(gen, op, over, match):
    args = over(gen)
    if op == "chunk_simple_gla":
        args.pop("beta", None)
    _raises(rf"{op}: {match}", _call_chunk, op, _chunk(gen, op, **args))


@pytest.mark.parametrize("op", CHUNK_OPS)
@pytest.mark.parametrize("over,match", [
    pytest.param(lambda g: dict(b=2, cu_seqlens=cu_seqlens([4, 5])),
                 r"with cu_seqlens, q must have batch size 1 \(got B = 2\)", id="batch2"),
    pytest.param(lambda g: dict(cu_seqlens=torch.tensor([1, 4, 9], dtype=torch.int32)),
                 r"cu_seqlens must start at 0", id="not-from-0"),
    pytest.param(lambda g: dict(cu_seqlens=torch.tensor([0, 6, 4, 9], dtype=torch.int32)),
                 r"cu_seqlens must be non-decreasing", id="decreasing"),
    pytest.param(lambda g: dict(cu_seqlens=cu_seqlens([4, 4])),
                 r"cu_seqlens must end at T = q\.size\(1\) = 9 \(got 8\)", id="short"),
    pytest.param(lambda g: dict(cu_seqlens=cu_seqlens([4, 5]).view(1, 3)),
                 r"cu_seqlens must be 1-D", id="2d"),
])
def test_chunk_bad_cu_seqlens(gen, request, op, over, match):
    values = any(v in request.node.callspec.id for v in ("not-from-0", "decreasing", "short"))
    _raises(rf"{op}: {match}", _call_chunk, op, _chunk(gen, op, **over(gen)), fake=not values)


@pytest.mark.parametrize("op", CHUNK_OPS)
def test_chunk_non_finite_scale(gen, op):
    _raises(rf"{op}: scale must be finite", _call_chunk, op, _chunk(gen, op, scale=math.nan))


@pytest.mark.gpu
@pytest.mark.parametrize("op", CHUNK_OPS)
@pytest.mark.parametrize("name,make", [
    pytest.param("k", lambda g: randn(g, 1, 9, 2, 32), id="k-cpu"),
    pytest.param("g", lambda g: torch.zeros(1, 9, 4), id="g-cpu"),
    pytest.param("initial_state", lambda g: torch.zeros(1, 4, 32, 16), id="state-cpu"),
    pytest.param("cu_seqlens", lambda g: cu_seqlens([9]), id="cu-cpu"),
])
def test_chunk_device_mix(gen, op, name, make):
    args = _chunk(gen, op, "cuda", **{name: make(gen)})
    _raises(rf"{op}: {name} must be on the same device as q", _call_chunk, op, args, fake=False)


# ----------------------------------------------------------------------------- dsv4_attention inputs


def _dsv4(gen, device="cpu", **over):
    """A valid CSA call: q (1, 7, 4, 64), kv (1, 9, 64), compressed (1, 3, 64), top-k 2."""
    args = dict(q=randn(gen, 1, 7, 4, 64, device=device), kv=randn(gen, 1, 9, 64, device=device),
                compressed_kv=randn(gen, 1, 3, 64, device=device), compress_ratio=4,
                topk_indices=torch.zeros(1, 7, 2, dtype=torch.int32, device=device),
                sinks=torch.zeros(4, device=device))
    args.update(over)
    return args


def _dsv4_varlen(gen, device="cpu", **over):
    """A valid varlen HCA call: sequences of [3, 4] queries over [5, 4] kv rows, [1, 1] compressed."""
    args = dict(q=randn(gen, 7, 4, 64, device=device), kv=randn(gen, 9, 64, device=device),
                compressed_kv=randn(gen, 2, 64, device=device), compress_ratio=4,
                cu_seqlens_q=cu_seqlens([3, 4], device), cu_seqlens_kv=cu_seqlens([5, 4], device),
                cu_seqlens_compressed=cu_seqlens([1, 1], device))
    args.update(over)
    return args


def _call_dsv4(args):
    args = dict(args)
    return ops.dsv4_attention(args.pop("q"), args.pop("kv"), **args)


def test_dsv4_valid_base_calls_pass(gen):
    _call_dsv4(_dsv4(gen))
    _call_dsv4(_dsv4_varlen(gen, max_seqlen_q=4, max_seqlen_kv=5))


@pytest.mark.parametrize("make,match", [
    pytest.param(lambda g: _dsv4(g, q=randn(g, 1, 7, 4, 64, dtype=torch.float64)),
                 r"dsv4_attention: q must be bf16, fp16 or fp32 \(got Double\)", id="fp64-q"),
    pytest.param(lambda g: _dsv4(g, kv=randn(g, 1, 9, 64, dtype=torch.float16)),
                 r"dsv4_attention: kv must have the same dtype as q", id="kv-fp16"),
    pytest.param(lambda g: _dsv4(g, compressed_kv=randn(g, 1, 3, 64, dtype=torch.float16)),
                 r"dsv4_attention: compressed_kv must have the same dtype as q", id="comp-fp16"),
    pytest.param(lambda g: _dsv4(g, topk_indices=torch.zeros(1, 7, 2, dtype=torch.int64)),
                 r"dsv4_attention: topk_indices must be Int \(got Long\)", id="topk-int64"),
    pytest.param(lambda g: _dsv4(g, sinks=torch.zeros(4, dtype=BF16)),
                 r"dsv4_attention: sinks must be Float \(got BFloat16\)", id="sinks-bf16"),
])
def test_dsv4_wrong_dtype(gen, make, match):
    _raises(match, _call_dsv4, make(gen))


@pytest.mark.parametrize("make,match", [
    pytest.param(lambda g: _dsv4(g, kv=randn(g, 1, 9, 1, 64)),
                 r"dsv4_attention: kv must be 3-D \(B, Skv, D\)", id="kv-4d"),
    pytest.param(lambda g: _dsv4(g, q=randn(g, 7, 4, 64)),
                 r"dsv4_attention: q must be 4-D \(B, Sq, Hq, D\)", id="q-3d"),
    pytest.param(lambda g: _dsv4(g, kv=randn(g, 2, 9, 64)),
                 r"dsv4_attention: kv\.size\(0\) \(batch, as in q\) must be 1", id="kv-batch"),
    pytest.param(lambda g: _dsv4(g, kv=randn(g, 1, 6, 64)),
                 r"dsv4_attention: q has more tokens than kv \(Sq = 7, Skv = 6\)", id="sq>skv"),
    pytest.param(lambda g: _dsv4(g, kv=randn(g, 1, 9, 32)),
                 r"dsv4_attention: kv must have the same head_dim as q \(q: 64, kv: 32\)",
                 id="kv-d"),
    pytest.param(lambda g: _dsv4(g, compressed_kv=randn(g, 1, 3, 128)),
                 r"dsv4_attention: compressed_kv must have the same head_dim as q", id="comp-d"),
    pytest.param(lambda g: _dsv4(g, q=randn(g, 1, 7, 4, 60), kv=randn(g, 1, 9, 60),
                                 compressed_kv=randn(g, 1, 3, 60)),
                 r"dsv4_attention: q\.size\(-1\) \(head_dim\) must be a positive multiple of 8",
                 id="d60"),
    pytest.param(lambda g: _dsv4(g, q=randn(g, 1, 7, 4, 576), kv=randn(g, 1, 9, 576),
                                 compressed_kv=randn(g, 1, 3, 576)),
                 r"dsv4_attention: q\.size\(-1\) \(head_dim\) must be .*at most 512", id="d576"),
    pytest.param(lambda g: _dsv4(g, topk_indices=torch.zeros(1, 6, 2, dtype=torch.int32)),
                 r"dsv4_attention: topk_indices must have shape \(B, Sq, K\) = \(1, 7, K\)",
                 id="topk-sq"),
    pytest.param(lambda g: _dsv4_varlen(g, topk_indices=torch.zeros(1, 7, 2, dtype=torch.int32)),
                 r"dsv4_attention: topk_indices must have shape \(total_q, K\)", id="topk-varlen"),
    pytest.param(lambda g: _dsv4(g, sinks=torch.zeros(3)),
                 r"dsv4_attention: sinks must have shape \(Hq,\) = \(4,\)", id="sinks-len"),
    pytest.param(lambda g: _dsv4(g, kv=randn(g, 1, 64, 9).transpose(1, 2)),
                 r"dsv4_attention: kv must be contiguous in its last dim", id="kv-stride"),
])
def test_dsv4_bad_shapes(gen, make, match):
    _raises(match, _call_dsv4, make(gen))


@pytest.mark.parametrize("make,match", [
    pytest.param(lambda g: _dsv4(g, compress_ratio=0),
                 r"dsv4_attention: compress_ratio must be >= 1 when compressed_kv is given "
                 r"\(got 0\)", id="ratio0"),
    pytest.param(lambda g: _dsv4(g, compressed_kv=None, topk_indices=None),
                 r"dsv4_attention: compress_ratio applies only with compressed_kv", id="ratio-alone"),
    pytest.param(lambda g: _dsv4(g, compressed_kv=None, compress_ratio=0),
                 r"dsv4_attention: topk_indices select rows of compressed_kv, which was not given",
                 id="topk-alone"),
    pytest.param(lambda g: _dsv4(g, window=-1),
                 r"dsv4_attention: window must be >= 0 .*got -1", id="window-neg"),
    pytest.param(lambda g: _dsv4(g, scale=math.inf),
                 r"dsv4_attention: scale must be finite", id="scale-inf"),
    pytest.param(lambda g: _dsv4(g, max_seqlen_q=7),
                 r"dsv4_attention: max_seqlen_q and max_seqlen_kv apply to varlen calls only",
                 id="max-seqlen-dense"),
])
def test_dsv4_bad_arguments(gen, make, match):
    _raises(match, _call_dsv4, make(gen))


@pytest.mark.parametrize("make,match,values", [
    pytest.param(lambda g: _dsv4_varlen(g, cu_seqlens_kv=None),
                 r"dsv4_attention: cu_seqlens_q and cu_seqlens_kv must be given together", False,
                 id="kv-missing"),
    pytest.param(lambda g: _dsv4_varlen(g, cu_seqlens_compressed=None),
                 r"dsv4_attention: a varlen call with compressed_kv needs cu_seqlens_compressed",
                 False, id="comp-cu-missing"),
    pytest.param(lambda g: _dsv4(g, cu_seqlens_compressed=cu_seqlens([3])),
                 r"dsv4_attention: cu_seqlens_compressed goes with compressed_kv in a varlen call",
                 False, id="comp-cu-dense"),
    pytest.param(lambda g: _dsv4_varlen(g, cu_seqlens_kv=cu_seqlens([9])),
                 r"dsv4_attention: cu_seqlens_kv must have the same length as cu_seqlens_q", False,
                 id="n-differs"),
    pytest.param(lambda g: _dsv4_varlen(g, cu_seqlens_q=cu_seqlens([3, 4]).float()),
                 r"dsv4_attention: cu_seqlens_q must be int32 or int64 \(got Float\)", False,
                 id="cu-float"),
    pytest.param(lambda g: _dsv4_varlen(g, cu_seqlens_kv=cu_seqlens([2, 7])),
                 r"dsv4_attention: sequence 0 has more queries than kv tokens \(Sq = 3, Skv = 2\)",
                 True, id="sq>skv"),
    pytest.param(lambda g: _dsv4_varlen(g, cu_seqlens_compressed=cu_seqlens([1, 2])),
                 r"dsv4_attention: cu_seqlens_compressed must end at compressed_kv\.size\(0\) = 2",
                 True, id="comp-total"),
    pytest.param(lambda g: _dsv4_varlen(g, max_seqlen_kv=4),
                 r"dsv4_attention: max_seqlen_kv must be >= the longest kv sequence \(5\)", True,
                 id="max-seqlen-small"),
])
def test_dsv4_bad_cu_seqlens(gen, make, match, values):
    _raises(match, _call_dsv4, make(gen), fake=not values)


@pytest.mark.gpu
@pytest.mark.parametrize("name,make", [
    pytest.param("kv", lambda g: randn(g, 1, 9, 64), id="kv-cpu"),
    pytest.param("compressed_kv", lambda g: randn(g, 1, 3, 64), id="comp-cpu"),
    pytest.param("topk_indices", lambda g: torch.zeros(1, 7, 2, dtype=torch.int32), id="topk-cpu"),
    pytest.param("sinks", lambda g: torch.zeros(4), id="sinks-cpu"),
])
def test_dsv4_device_mix(gen, name, make):
    _raises(rf"dsv4_attention: {name} must be on the same device as q", _call_dsv4,
            _dsv4(gen, "cuda", **{name: make(gen)}), fake=False)
