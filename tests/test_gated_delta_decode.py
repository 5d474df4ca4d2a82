"""gated_delta_rule_decode: one decode step of the gated delta rule over a state pool, against
the float64 oracle (reference.gated_delta_rule from the same state), against the chunk op (a
sequence decoded token by token equals one chunked call), and, on a Hopper GPU, the sm90
kernel against the reference path, against the oracle with poisoned outputs, and decoding a
sequence step by step against the sm90 chunk kernel. Pools with -1 and shuffled slots, strided
pools, T = 1 to 4, fp32 and bf16 states, qk l2norm, CUDA-graph replay, bad inputs.
"""
import pytest
import torch

import dsv4_attn
from dsv4_attn import reference as ref

from conftest import poison_allocator, rel_rms, stable_seed
from test_fmha_sm90 import needs_sm90


def _inputs(b, t, h, hv, d, dtype, gen, device):
    r = lambda *s: torch.randn(*s, generator=gen, device=device)  # noqa: E731
    q, k, v = r(b, t, h, d).to(dtype), r(b, t, h, d).to(dtype), r(b, t, hv, d).to(dtype)
    g = -torch.rand(b, t, hv, generator=gen, device=device) * 0.5   # log-decay <= 0
    beta = torch.rand(b, t, hv, generator=gen, device=device)
    if dtype != torch.float32:  # the kernels see what the 16-bit tensors hold
        k = torch.nn.functional.normalize(k.float(), dim=-1).to(dtype)
    else:
        k = torch.nn.functional.normalize(k, dim=-1)
    return q, k, v, g, beta


def _oracle(q, k, v, g, beta, start, l2norm):
    """o (B, T, HV, V) and the final states, float64, from start states (B, HV, K, V)."""
    return ref.gated_delta_rule(q, k, v, g, beta, initial_state=start.double(),
                                use_qk_l2norm_in_kernel=l2norm)


CASES = [  # (B, T, H, HV, K = V, state dtype, with a pool, l2norm)
    (3, 1, 2, 4, 32, torch.float32, True, False),
    (2, 2, 1, 2, 16, torch.float32, False, True),
    (4, 4, 2, 2, 32, torch.bfloat16, True, True),
    (1, 3, 1, 3, 8, torch.float32, True, False),
]


@pytest.mark.parametrize("b,t,h,hv,d,state_dtype,pool,l2norm", CASES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_decode_matches_oracle(device, b, t, h, hv, d, state_dtype, pool, l2norm, dtype):
    gen = torch.Generator(device=device).manual_seed(stable_seed(b, t, hv, d, pool, l2norm))
    q, k, v, g, beta = _inputs(b, t, h, hv, d, dtype, gen, device)
    n = 2 * b + 3 if pool else b
    state = (torch.randn(n, hv, d, d, generator=gen, device=device) * 0.3).to(state_dtype)
    before = state.clone()
    indices = None
    if pool:  # shuffled slots, the last sequence skipped (the only one: every sequence)
        indices = torch.randperm(n, generator=gen, device=device)[:b]
        indices[-1] = -1
    slots = indices if pool else torch.arange(b, device=device)
    live = slots >= 0
    start = before[slots.clamp(min=0)].float()
    want_o, want_s = _oracle(q.cpu(), k.cpu(), v.cpu(), g.cpu(), beta.cpu(), start.cpu(), l2norm)
    o = dsv4_attn.gated_delta_rule_decode(q, k, v, g, beta, state, state_indices=indices,
                                          use_qk_l2norm_in_kernel=l2norm)
    assert o.dtype == dtype and o.shape == v.shape
    tol = 2e-2 if dtype == torch.bfloat16 or state_dtype == torch.bfloat16 else 1e-4
    live_cpu = live.cpu()
    assert torch.equal(o[~live], torch.zeros_like(o[~live]))
    if not live.any():
        assert torch.equal(state, before)
        return
    err = (o.cpu().double()[live_cpu] - want_o[live_cpu]).abs().max().item()
    assert err <= tol * max(1.0, want_o[live_cpu].abs().max().item()), f"o error {err:.2e}"
    got_s = state[slots[live]].cpu().double()
    err = (got_s - want_s[live_cpu]).abs().max().item()
    assert err <= tol * max(1.0, want_s.abs().max().item()), f"state error {err:.2e}"
    untouched = torch.ones(n, dtype=torch.bool)
    untouched[slots[live].cpu()] = False
    assert torch.equal(state.cpu()[untouched], before.cpu()[untouched])


def test_decode_steps_equal_one_chunked_call(device):
    gen = torch.Generator(device=device).manual_seed(7)
    b, t, h, hv, d = 2, 5, 2, 4, 32
    q, k, v, g, beta = _inputs(b, t, h, hv, d, torch.bfloat16, gen, device)
    start = torch.randn(b, hv, d, d, generator=gen, device=device) * 0.3
    o_chunk, s_chunk = dsv4_attn.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=start,
                                                        output_final_state=True)
    state = start.clone()
    outs = [dsv4_attn.gated_delta_rule_decode(q[:, i:i + 1], k[:, i:i + 1], v[:, i:i + 1],
                                              g[:, i:i + 1], beta[:, i:i + 1], state)
            for i in range(t)]
    # Both compute in fp32 from the same bf16 inputs and round o to bf16 once.
    o_steps = torch.cat(outs, 1)
    assert (o_steps.float() - o_chunk.float()).abs().max() <= 1e-2 * o_chunk.float().abs().max()
    assert torch.allclose(state, s_chunk, atol=1e-4, rtol=1e-3)


def test_decode_bad_inputs_name_the_argument():
    q = torch.randn(2, 1, 2, 16)
    v, g, beta = torch.randn(2, 1, 4, 16), torch.randn(2, 1, 4), torch.rand(2, 1, 4)
    state = torch.zeros(5, 4, 16, 16)
    f = dsv4_attn.gated_delta_rule_decode
    bad = [
        (lambda: f(q, q, v, g, beta, state), "state must hold one state per sequence"),
        (lambda: f(q, q, v, g, beta, state.half(), state_indices=torch.arange(2)),
         "state must be fp32 or bf16"),
        (lambda: f(q, q, v, g, beta, state, state_indices=torch.arange(3)),
         r"state_indices must have shape \(B,\)"),
        (lambda: f(q, q, v, g, beta, state, state_indices=torch.arange(2).float()),
         "state_indices must be int32 or int64"),
        (lambda: f(q, q, v, g[:, :, :2], beta, state, state_indices=torch.arange(2)),
         r"g must have shape \(B, T, HV\)"),
        (lambda: f(q, q, v, g, beta, state[:, :, :8], state_indices=torch.arange(2)),
         r"state must have shape \(N, HV, K, V\)"),
        (lambda: f(q.int(), q.int(), v.int(), g, beta, state, state_indices=torch.arange(2)),
         "q must be bf16, fp16 or fp32"),
    ]
    for call, text in bad:
        with pytest.raises(RuntimeError, match=text):
            call()


def test_decode_strided_state_pool(device):
    """A pool that is a strided view (HV-major storage) is updated in place like a contiguous
    one (the kernel takes contiguous pools; this one runs on the reference path)."""
    gen = torch.Generator(device=device).manual_seed(8)
    q, k, v, g, beta = _inputs(3, 1, 2, 4, 16, torch.float32, gen, device)
    storage = torch.randn(4, 6, 16, 16, generator=gen, device=device)
    strided = storage.transpose(0, 1)  # (N, HV, K, V), not contiguous
    dense = strided.contiguous()
    idx = torch.tensor([4, -1, 0], device=device)
    got = dsv4_attn.gated_delta_rule_decode(q, k, v, g, beta, strided, state_indices=idx)
    want = dsv4_attn.gated_delta_rule_decode(q, k, v, g, beta, dense, state_indices=idx)
    assert torch.equal(got, want) and torch.equal(strided, dense)
    assert dsv4_attn.gated_delta_rule_decode_path(q, k, v, g, beta, strided,
                                                  state_indices=idx) == "reference"


@pytest.mark.gpu
def test_decode_inputs_on_two_devices_name_the_argument():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    q, k, v, g, beta = (x.cuda() for x in _inputs(2, 1, 2, 4, 128, torch.bfloat16,
                                                  torch.Generator().manual_seed(1), "cpu"))
    state = torch.zeros(4, 4, 128, 128)
    f = dsv4_attn.gated_delta_rule_decode
    with pytest.raises(RuntimeError, match="state must be on the same device as q"):
        f(q, k, v, g, beta, state)
    with pytest.raises(RuntimeError, match="state_indices must be on the same device as q"):
        f(q, k, v, g, beta, state.cuda(), state_indices=torch.arange(2))


def test_decode_fake_kernel_and_compile():
    gen = torch.Generator().manual_seed(3)
    q, k, v, g, beta = _inputs(2, 1, 1, 2, 16, torch.float32, gen, "cpu")
    state = torch.randn(4, 2, 16, 16, generator=gen)
    idx = torch.tensor([2, 0])
    torch.library.opcheck(torch.ops.dsv4.gated_delta_rule_decode.default,
                          (q, k, v, g, beta, state.clone()), {"state_indices": idx},
                          test_utils=("test_schema", "test_autograd_registration",
                                      "test_faketensor", "test_aot_dispatch_static"))

    def step(q, k, v, g, beta, state, idx):
        return dsv4_attn.gated_delta_rule_decode(q, k, v, g, beta, state, state_indices=idx)

    eager_state, compiled_state = state.clone(), state.clone()
    want = step(q, k, v, g, beta, eager_state, idx)
    got = torch.compile(step, fullgraph=True, backend="aot_eager")(q, k, v, g, beta,
                                                                  compiled_state, idx)
    assert torch.equal(got, want) and torch.equal(compiled_state, eager_state)


# --------------------------------------------------------------------------------- sm90 kernel


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("t", [1, 2, 3, 4])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32],
                         ids=["bf16", "fp16", "fp32"])
def test_decode_kernel_matches_reference(monkeypatch, t, state_dtype, dtype):
    gen = torch.Generator(device="cuda").manual_seed(stable_seed("decode-gpu", t, dtype))
    b, h, hv, d = 9, 4, 8, 128
    q, k, v, g, beta = _inputs(b, t, h, hv, d, dtype, gen, "cuda")
    pool = (torch.randn(40, hv, d, d, generator=gen, device="cuda") * 0.1).to(state_dtype)
    idx = torch.randperm(40, generator=gen, device="cuda")[:b].int()
    idx[3] = -1
    idx[5] = 40  # past the pool: skipped too
    for l2norm in (False, True):
        state = pool.clone()
        assert dsv4_attn.gated_delta_rule_decode_path(q, k, v, g, beta, state,
                                                      state_indices=idx) == "sm90"
        o = dsv4_attn.gated_delta_rule_decode(q, k, v, g, beta, state, state_indices=idx,
                                              use_qk_l2norm_in_kernel=l2norm)
        again_state = pool.clone()
        again = dsv4_attn.gated_delta_rule_decode(q, k, v, g, beta, again_state,
                                                  state_indices=idx,
                                                  use_qk_l2norm_in_kernel=l2norm)
        assert torch.equal(o, again) and torch.equal(state, again_state)  # deterministic
        ref_state = pool.clone()
        with monkeypatch.context() as m:
            m.setenv("DSV4_DISABLE_SM90", "1")
            want = dsv4_attn.gated_delta_rule_decode(q, k, v, g, beta, ref_state,
                                                     state_indices=idx,
                                                     use_qk_l2norm_in_kernel=l2norm)
        tol = 1e-3 if dtype == torch.float32 and state_dtype == torch.float32 else 2e-2
        assert (o.float() - want.float()).abs().max().item() <= tol
        assert torch.equal(o[3], torch.zeros_like(o[3])) and torch.equal(o[5], torch.zeros_like(o[5]))
        assert (state.float() - ref_state.float()).abs().max().item() <= tol
        untouched = torch.ones(40, dtype=torch.bool, device="cuda")
        untouched[idx[(idx >= 0) & (idx < 40)].long()] = False
        assert torch.equal(state[untouched], pool[untouched])


@pytest.mark.gpu
@needs_sm90
def test_decode_kernel_in_a_cuda_graph():
    """A decode step captured once, replayed with new tokens and new slots."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    b, h, hv, d = 4, 2, 4, 128
    q, k, v, g, beta = _inputs(b, 1, h, hv, d, torch.bfloat16, gen, "cuda")
    pool = torch.randn(16, hv, d, d, generator=gen, device="cuda") * 0.1
    idx = torch.arange(b, device="cuda")
    dsv4_attn.gated_delta_rule_decode(q, k, v, g, beta, pool.clone(), state_indices=idx)
    torch.cuda.synchronize()
    state = pool.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o = dsv4_attn.gated_delta_rule_decode(q, k, v, g, beta, state, state_indices=idx)
    for step in range(2):
        new = _inputs(b, 1, h, hv, d, torch.bfloat16, gen, "cuda")
        for dst, src in zip((q, k, v, g, beta), new):
            dst.copy_(src)
        idx.copy_(torch.randperm(16, generator=gen, device="cuda")[:b])
        state.copy_(pool)
        graph.replay()
        check = pool.clone()
        want = dsv4_attn.gated_delta_rule_decode(q, k, v, g, beta, check, state_indices=idx)
        assert torch.equal(o, want) and torch.equal(state, check)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("t", [1, 2])
@pytest.mark.parametrize("l2norm", [False, True])
def test_decode_kernel_against_oracle_with_poisoned_outputs(t, l2norm):
    """The kernel (K = V = 128) against the float64 oracle, its output allocated over NaN
    bytes: skipped sequences come back as zeros, the others within bf16's error."""
    gen = torch.Generator(device="cuda").manual_seed(stable_seed("decode-oracle", t, l2norm))
    b, h, hv, d = 5, 2, 4, 128
    q, k, v, g, beta = _inputs(b, t, h, hv, d, torch.bfloat16, gen, "cuda")
    pool = torch.randn(12, hv, d, d, generator=gen, device="cuda") * 0.1
    idx = torch.randperm(12, generator=gen, device="cuda")[:b]
    idx[1] = -1
    state = pool.clone()
    assert dsv4_attn.gated_delta_rule_decode_path(q, k, v, g, beta, state,
                                                  state_indices=idx) == "sm90"
    live = (idx >= 0).cpu()
    want_o, want_s = _oracle(q.cpu(), k.cpu(), v.cpu(), g.cpu(), beta.cpu(),
                             pool[idx.clamp(min=0)].cpu(), l2norm)
    poison_allocator(v.numel() * v.element_size() + (1 << 20), "cuda")
    o = dsv4_attn.gated_delta_rule_decode(q, k, v, g, beta, state, state_indices=idx,
                                          use_qk_l2norm_in_kernel=l2norm)
    o = o.cpu().double()
    assert torch.equal(o[~live], torch.zeros_like(o[~live]))
    scale = max(1.0, want_o[live].abs().max().item())
    assert (o[live] - want_o[live]).abs().max().item() <= 2e-2 * scale
    got_s = state[idx[live.cuda()]].cpu().double()
    assert (got_s - want_s[live]).abs().max().item() <= 1e-3 * max(1.0, want_s.abs().max().item())


@pytest.mark.gpu
@needs_sm90
def test_decode_kernel_steps_equal_the_chunk_kernel():
    """A sequence decoded token by token on the decode kernel equals one call of the sm90
    chunk kernel over the same tokens, outputs and final state."""
    gen = torch.Generator(device="cuda").manual_seed(11)
    b, t, h, hv, d = 2, 6, 2, 4, 128
    q, k, v, g, beta = _inputs(b, t, h, hv, d, torch.bfloat16, gen, "cuda")
    start = torch.randn(b, hv, d, d, generator=gen, device="cuda") * 0.1
    assert dsv4_attn.chunk_gated_delta_rule_path(q, k, v, g, beta, initial_state=start,
                                                 output_final_state=True) == "sm90"
    o_chunk, s_chunk = dsv4_attn.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=start,
                                                        output_final_state=True)
    state = start.clone()
    outs = []
    for i in range(t):
        step = [x[:, i:i + 1] for x in (q, k, v, g, beta)]
        assert dsv4_attn.gated_delta_rule_decode_path(*step, state) == "sm90"
        outs.append(dsv4_attn.gated_delta_rule_decode(*step, state))
    # The chunk kernel is within 5e-3 rel-RMS of the oracle (test_chunk_sm90), the steps closer.
    assert rel_rms(torch.cat(outs, 1), o_chunk) <= 1e-2
    assert rel_rms(state, s_chunk) <= 1e-2
