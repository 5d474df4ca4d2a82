"""The ops are forward-only: a call that autograd would have to differentiate is refused at
once, naming the op and the argument, in eager mode and under torch.compile alike."""
import pytest
import torch

from dsv4_attn import ops

from conftest import randn

BF16 = torch.bfloat16
FORWARD_ONLY = r"requires grad, but the dsv4 ops are forward-only"


def _fmha_args(gen):
    return dict(q=randn(gen, 1, 5, 4, 32), k=randn(gen, 1, 6, 2, 32), v=randn(gen, 1, 6, 2, 32),
                sinks=randn(gen, 4, dtype=torch.float32))


def _chunk_args(gen):
    return dict(q=randn(gen, 1, 9, 2, 32), k=randn(gen, 1, 9, 2, 32), v=randn(gen, 1, 9, 2, 16),
                g=-torch.rand(1, 9, 2, generator=gen), beta=torch.rand(1, 9, 2, generator=gen))


def _call(op, args):
    args = dict(args)
    if op == "fmha":
        return ops.fmha(args.pop("q"), args.pop("k"), args.pop("v"), **args)
    if op == "merge_attn_states":
        return ops.merge_attn_states(**args)
    names = ("q", "k", "v", "g", "beta") if op == "chunk_gated_delta_rule" else ("q", "k", "v", "g")
    return getattr(ops, op)(*[args.pop(n) for n in names])


def _merge_args(gen):
    return dict(out_a=randn(gen, 1, 5, 4, 32), lse_a=randn(gen, 1, 4, 5, dtype=torch.float32),
                out_b=randn(gen, 1, 5, 4, 32), lse_b=randn(gen, 1, 4, 5, dtype=torch.float32))


CASES = [
    pytest.param("fmha", _fmha_args, "q", id="fmha-q"),
    pytest.param("fmha", _fmha_args, "v", id="fmha-v"),
    pytest.param("fmha", _fmha_args, "sinks", id="fmha-sinks"),
    pytest.param("merge_attn_states", _merge_args, "out_b", id="merge-out_b"),
    pytest.param("merge_attn_states", _merge_args, "lse_a", id="merge-lse_a"),
    pytest.param("chunk_gated_delta_rule", _chunk_args, "k", id="gdr-k"),
    pytest.param("chunk_gated_delta_rule", _chunk_args, "beta", id="gdr-beta"),
    pytest.param("chunk_simple_gla", _chunk_args, "g", id="gla-g"),
]


@pytest.mark.parametrize("op,make,name", CASES)
def test_requires_grad_raises_in_eager(gen, op, make, name):
    args = make(gen)
    args[name] = args[name].requires_grad_()
    with pytest.raises(RuntimeError, match=rf"{op}: {name} {FORWARD_ONLY}"):
        _call(op, args)


@pytest.mark.parametrize("op,make,name", CASES)
def test_requires_grad_is_fine_without_grad_mode(gen, op, make, name):
    args = make(gen)
    args[name] = args[name].requires_grad_()
    with torch.no_grad():
        _call(op, args)
    with torch.inference_mode():
        _call(op, args)


def test_upstream_weight_raises_in_eager(gen):
    # The gradient would flow to w through q: the call itself is refused.
    args = _fmha_args(gen)
    w = torch.nn.Parameter(torch.eye(32, dtype=BF16))
    args["q"] = args["q"] @ w
    with pytest.raises(RuntimeError, match=rf"fmha: q {FORWARD_ONLY}"):
        _call("fmha", args)


@pytest.mark.parametrize("op,make,name", [CASES[0], CASES[2], CASES[5]])
def test_requires_grad_raises_under_compile(gen, op, make, name):
    torch._dynamo.reset()
    args = make(gen)
    args[name] = args[name].requires_grad_()
    fn = torch.compile(lambda a: _call(op, a), backend="aot_eager", fullgraph=True)
    with pytest.raises(RuntimeError, match=rf"{op}: {name} {FORWARD_ONLY}"):
        fn(args)
    torch._dynamo.reset()


def test_compile_backward_through_fmha_does_not_give_silent_none(gen):
    # What used to happen: backward ran and left w.grad None. Now the forward is refused.
    torch._dynamo.reset()
    args = _fmha_args(gen)
    w = torch.nn.Parameter(torch.eye(32, dtype=BF16))

    def f(q, k, v, sinks):
        return ops.fmha(q @ w, k, v, sinks=sinks).float().sum()

    with pytest.raises(RuntimeError, match=FORWARD_ONLY):
        torch.compile(f, backend="aot_eager")(**args).backward()
    assert w.grad is None
    torch._dynamo.reset()
