"""GPU tests of the sm90 fmha kernel (issue 3): oracle parity by FlashAttention's rule,
every stride pattern the TMA descriptors accept, poisoned outputs, determinism.

Tolerance: max |ours - ref| <= 2 * max |lowp - ref| + 1e-3, where ref is float64 attention on
the same (bf16/fp16) inputs and lowp is SDPA run in the input dtype (sinks folded in as an
extra zero key whose additive mask is the sink logit). The same rule holds for lse, with lowp
the logsumexp of scores from a low-precision matmul.
"""
import math
import random

import pytest
import torch
import torch.nn.functional as F

import dsv4_attn

from conftest import poison_allocator, stable_seed

pytestmark = pytest.mark.gpu


def _is_sm90():
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


needs_sm90 = pytest.mark.skipif(not _is_sm90(), reason="needs an sm_90 (Hopper) GPU")


def _visible(sq, sk, causal, window_left, device):
    pos = torch.arange(sq, device=device)[:, None] + (sk - sq)
    key = torch.arange(sk, device=device)[None, :]
    vis = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if causal:
        vis &= key <= pos
    if window_left >= 0:
        vis &= key >= pos - window_left
    return vis


def _expand_kv(x, group):  # (B, S, Hkv, D) -> (B, Hq, S, D)
    return x.transpose(1, 2).repeat_interleave(group, dim=1)


def oracle(q, k, v, scale, causal, window_left, sinks):
    """float64 attention by explicit masking on the GPU. Returns out (B,Sq,Hq,Dv), lse (B,Hq,Sq)."""
    group = q.shape[2] // k.shape[2]
    qd = q.double().transpose(1, 2)
    kd, vd = _expand_kv(k.double(), group), _expand_kv(v.double(), group)
    s = torch.matmul(qd, kd.transpose(-1, -2)) * scale
    s = s.masked_fill(~_visible(q.shape[1], k.shape[1], causal, window_left, q.device), -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    if sinks is not None:
        lse = torch.logaddexp(lse, sinks.double()[None, :, None])
    shift = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    out = torch.matmul(torch.exp(s - shift[..., None]), vd)
    return out.transpose(1, 2), lse


def lowp_reference(q, k, v, scale, causal, window_left, sinks):
    """SDPA in the input dtype (the error budget), with sinks as an extra masked-in zero key."""
    b, sq, hq, d = q.shape
    sk, group = k.shape[1], hq // k.shape[2]
    kk, vv = _expand_kv(k, group), _expand_kv(v, group)
    bias = torch.zeros(hq, sq, sk, dtype=torch.float32, device=q.device)
    bias = bias.masked_fill(~_visible(sq, sk, causal, window_left, q.device), -math.inf)
    if sinks is not None:
        kk = torch.cat([kk, kk.new_zeros(b, hq, 1, d)], dim=2)
        vv = torch.cat([vv, vv.new_zeros(b, hq, 1, v.shape[-1])], dim=2)
        bias = torch.cat([bias, sinks[:, None, None].expand(hq, sq, 1)], dim=2)
    dead = torch.isinf(bias).all(-1)  # SDPA makes NaN on rows with nothing visible
    bias = bias.masked_fill(dead[..., None], 0.0)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), kk, vv, attn_mask=bias.to(q.dtype),
                                         scale=scale)
    out = out.masked_fill(dead[None, :, :, None], 0.0).transpose(1, 2)
    s = torch.matmul(q.transpose(1, 2), kk.transpose(-1, -2)).float() * scale + bias
    lse = torch.logsumexp(s, -1).masked_fill(dead[None], -math.inf)
    return out, lse


def make_inputs(b, sq, sk, hq, hkv, d, dtype, layout, gen):
    dev = "cuda"

    def rand(*shape):
        return torch.randn(*shape, generator=gen, device=dev, dtype=torch.float32).to(dtype)

    if layout == "bshd":
        q, k, v = rand(b, sq, hq, d), rand(b, sk, hkv, d), rand(b, sk, hkv, d)
    elif layout == "bhsd":  # (B, H, S, D) storage passed as a transposed view, no copy
        q = rand(b, hq, sq, d).transpose(1, 2)
        k = rand(b, hkv, sk, d).transpose(1, 2)
        v = rand(b, hkv, sk, d).transpose(1, 2)
    elif layout == "packed_qkv":  # slices of one (B, S, H, 3, D) projection output
        assert hq == hkv and sq == sk
        qkv = rand(b, sq, hq, 3, d)
        q, k, v = qkv[:, :, :, 0], qkv[:, :, :, 1], qkv[:, :, :, 2]
    elif layout == "k_is_v":  # MQA/GQA with K = V the same tensor
        q, k = rand(b, sq, hq, d), rand(b, sk, hkv, d)
        v = k
    else:
        raise ValueError(layout)
    return q, k, v


def check_case(b, sq, sk, hq, hkv, d, causal, window_left, with_sinks, dtype=torch.bfloat16,
               layout="bshd", seed=0, expect_path="sm90", transform=None, out_factor=2.0,
               rms_factor=None):
    """transform(q, k, v) -> (q, k, v), if given, reshapes the random inputs' values.
    out's max error may be out_factor times the input-dtype SDPA's (FlashAttention's rule: 2) plus
    1e-3; with rms_factor, its relative RMS error also at most rms_factor times SDPA's."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = make_inputs(b, sq, sk, hq, hkv, d, dtype, layout, gen)
    if transform is not None:
        q, k, v = transform(q, k, v)
    sinks = (torch.randn(hq, generator=gen, device="cuda") * 2) if with_sinks else None
    scale = 1.0 / math.sqrt(d)
    kwargs = dict(causal=causal, window_left=window_left, sinks=sinks)
    assert dsv4_attn.fmha_path(q, k, v, **kwargs) == expect_path

    poison_allocator(2 * b * sq * hq * d * 4 + (1 << 20), "cuda")
    out, lse = dsv4_attn.fmha(q, k, v, return_lse=True, **kwargs)
    ref_out, ref_lse = oracle(q, k, v, scale, causal, window_left, sinks)
    low_out, low_lse = lowp_reference(q, k, v, scale, causal, window_left, sinks)

    assert not torch.isnan(out).any(), "NaN (or an unwritten poisoned element) in out"
    assert not torch.isnan(lse).any(), "NaN (or an unwritten poisoned element) in lse"
    out_err = (out.double() - ref_out).abs().max().item()
    out_tol = out_factor * (low_out.double() - ref_out).abs().max().item() + 1e-3
    assert out_err <= out_tol, f"out error {out_err:.3e} > tolerance {out_tol:.3e}"
    if rms_factor is not None:
        def rel_rms(x):
            return ((x.double() - ref_out).pow(2).mean() / ref_out.pow(2).mean()).sqrt().item()
        out_rms, low_rms = rel_rms(out), rel_rms(low_out)
        assert out_rms <= rms_factor * low_rms, f"out rel-RMS {out_rms:.3e} > {rms_factor} x {low_rms:.3e}"

    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite), "lse is -inf exactly where nothing is visible"
    if finite.any():
        lse_err = (lse.double() - ref_lse)[finite].abs().max().item()
        lse_tol = 2 * (low_lse.double() - ref_lse)[finite].abs().max().item() + 1e-3
        assert lse_err <= lse_tol, f"lse error {lse_err:.3e} > tolerance {lse_tol:.3e}"

    again, lse_again = dsv4_attn.fmha(q, k, v, return_lse=True, **kwargs)
    assert torch.equal(out, again) and torch.equal(lse, lse_again), "two runs differ"


SEQS = [1, 17, 113, 128, 239, 1023, 4096]
HEADS = [(1, 1), (4, 1), (8, 2), (16, 16)]


def _cases():
    """A covering set: every (Sq, Sk) pair with Sq <= Sk and Sq > Sk, cycling through D, heads,
    batch, masks and sinks, plus the named combinations the kernel's branches depend on."""
    rng = random.Random(1234)
    cases = []
    for sq in SEQS:
        for sk in SEQS:
            if sq == 4096 and sk == 4096:
                continue  # covered below at a smaller head count
            d = rng.choice([64, 128, 256])
            hq, hkv = rng.choice(HEADS)
            b = rng.choice([1, 3])
            if sq * sk * hq * b > 2 ** 25:  # keep the float64 oracle small
                hq, hkv, b = 1, 1, 1
            causal = rng.random() < 0.5
            window = rng.choice([-1, -1, 0, 1, 127, 1000])
            sinks = rng.random() < 0.5
            cases.append((b, sq, sk, hq, hkv, d, causal, window, sinks))
    for d in (64, 128, 256):
        for causal in (False, True):
            cases.append((1, 4096, 4096, 2, 1, d, causal, -1, False))
            cases.append((3, 239, 1023, 8, 2, d, causal, 127, True))
        for window in (0, 1, 127, 1000):
            cases.append((1, 1023, 1023, 4, 1, d, True, window, window == 127))
        # More work tiles than SMs, so each persistent CTA reuses its Q buffer and ring across
        # tiles, with fully masked tiles (rows before the first key) interleaved.
        cases.append((3, 1023, 239, 16, 16, d, True, 1, False))
        cases.append((3, 1023, 239, 16, 4, d, True, -1, True))
    return cases


@needs_sm90
@pytest.mark.parametrize("b,sq,sk,hq,hkv,d,causal,window,sinks", _cases())
def test_fmha_sm90_matches_oracle(b, sq, sk, hq, hkv, d, causal, window, sinks):
    check_case(b, sq, sk, hq, hkv, d, causal, window, sinks,
               seed=stable_seed(b, sq, sk, hq, hkv, d, causal, window, sinks))


@needs_sm90
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_fmha_sm90_fp16(d, causal):
    check_case(3, 239, 1023, 8, 2, d, causal, -1, True, dtype=torch.float16, seed=d + causal)


@needs_sm90
@pytest.mark.parametrize("layout,hq,hkv", [("bhsd", 8, 2), ("packed_qkv", 4, 4),
                                           ("k_is_v", 16, 1), ("k_is_v", 4, 1)])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_fmha_sm90_stride_patterns(layout, hq, hkv, d):
    check_case(3, 239, 239, hq, hkv, d, True, -1, False, layout=layout, seed=d)
    sq, sk = (1023, 1023) if layout == "packed_qkv" else (113, 1023)
    check_case(1, sq, sk, hq, hkv, d, False, 127, True, layout=layout, seed=d + 1)


@needs_sm90
def test_fmha_strides_tma_cannot_express_take_reference_path():
    gen = torch.Generator(device="cuda").manual_seed(7)
    base = torch.randn(2, 100, 4, 64 + 4, device="cuda", generator=gen).bfloat16()
    q = base[..., :64]  # row stride of 68 elements = 136 bytes: not a multiple of 16
    k = torch.randn(2, 100, 4, 64, device="cuda", generator=gen).bfloat16()
    assert dsv4_attn.fmha_path(q, k, k) == "reference"
    out = dsv4_attn.fmha(q, k, k, causal=True)
    ref, _ = oracle(q, k, k, 1 / 8, True, -1, None)
    assert (out.double() - ref).abs().max().item() < 2e-2


@needs_sm90
def test_fmha_uncovered_head_dims_take_reference_path():
    q = torch.randn(1, 65, 4, 96, device="cuda").bfloat16()
    assert dsv4_attn.fmha_path(q, q, q) == "reference"
    q = torch.randn(1, 65, 4, 512, device="cuda").bfloat16()
    k, v = torch.randn_like(q), torch.randn_like(q)
    assert dsv4_attn.fmha_path(q, k, v) == "reference"  # head_dim 512 needs k is v


def test_fmha_reference_path_on_cuda(monkeypatch):
    """The portable path on a GPU, forced even where the kernel would cover the call."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    monkeypatch.setenv("DSV4_DISABLE_SM90", "1")
    check_case(3, 113, 239, 8, 2, 128, True, 127, True, expect_path="reference", seed=3)
    check_case(1, 17, 1023, 4, 1, 256, False, -1, False, layout="bhsd",
               expect_path="reference", seed=4)


@needs_sm90
@pytest.mark.parametrize("causal", [False, True])
def test_fmha_sm90_cuda_graph_replay(causal):
    """Capturable: no host sync or capture-illegal call on the sm90 path; replays see new data."""
    gen = torch.Generator(device="cuda").manual_seed(11)
    q, k, v = make_inputs(2, 300, 300, 8, 2, 128, torch.bfloat16, "bshd", gen)
    sinks = torch.randn(8, generator=gen, device="cuda")
    assert dsv4_attn.fmha_path(q, k, v, causal=causal, sinks=sinks) == "sm90"
    static = [t.clone() for t in (q, k, v)]
    dsv4_attn.fmha(*static, causal=causal, sinks=sinks)  # warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = dsv4_attn.fmha(*static, causal=causal, sinks=sinks, return_lse=True)
    for _ in range(2):
        fresh = make_inputs(2, 300, 300, 8, 2, 128, torch.bfloat16, "bshd", gen)
        for dst, src in zip(static, fresh):
            dst.copy_(src)
        graph.replay()
        want_out, want_lse = dsv4_attn.fmha(*fresh, causal=causal, sinks=sinks, return_lse=True)
        assert torch.equal(out, want_out) and torch.equal(lse, want_lse)


# (Sq, Sk, Hq, Hkv, window): decode and short queries, whose few work tiles the launcher splits
# over the key range (csrc/sm90/shared/split_kv.h) unless DSV4_SPLIT_KV pins the count.
DECODE_CASES = [(1, 8192, 32, 8, -1), (2, 1, 8, 1, -1), (4, 3000, 8, 8, -1),
                (8, 20000, 4, 1, -1), (1, 131072, 8, 1, -1), (2, 5000, 16, 2, 1000)]


@needs_sm90
@pytest.mark.parametrize("splits", ["plan", "1", "3"])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("sq,sk,hq,hkv,window", DECODE_CASES)
def test_fmha_sm90_decode_split_kv(monkeypatch, splits, d, sq, sk, hq, hkv, window):
    """Oracle parity, poisoned outputs and bitwise determinism with the planned split count,
    with no split, and with 3 splits (the sink folds in once, in the combine)."""
    if splits != "plan":
        monkeypatch.setenv("DSV4_SPLIT_KV", splits)
    check_case(1, sq, sk, hq, hkv, d, True, window, True,
               seed=stable_seed(sq, sk, hq, d, splits))


# (B, Sq, Sk, Hq, Hkv, causal, window, sinks) for packed GQA: the query heads of a KV head fill
# a work tile's rows, tokens x heads (group 8: 16 tokens per 128-row tile; 128 and 256: one
# token, all or half of the group's heads; group 6 packs only in the 192-row tiles of D = 64).
PACKED_GQA_CASES = [(2, 1, 5000, 32, 8, True, -1, True), (1, 4, 3000, 64, 8, True, -1, False),
                    (2, 65, 700, 16, 2, True, 127, True), (1, 37, 37, 32, 4, True, 0, False),
                    (1, 3, 2000, 128, 1, True, -1, True), (1, 2, 1000, 256, 1, False, 100, False),
                    (3, 113, 239, 12, 2, True, -1, True), (2, 1, 300, 8, 1, False, -1, True)]


@needs_sm90
@pytest.mark.parametrize("pack", ["0", "1"])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("b,sq,sk,hq,hkv,causal,window,sinks", PACKED_GQA_CASES)
def test_fmha_sm90_packed_gqa(monkeypatch, pack, d, b, sq, sk, hq, hkv, causal, window, sinks):
    """Oracle parity with GQA packing forced on (where the group fits the tile) and off:
    each row's token and head, its mask and sink, in the kernel and through the split combine."""
    monkeypatch.setenv("DSV4_FMHA_PACK_GQA", pack)
    check_case(b, sq, sk, hq, hkv, d, causal, window, sinks,
               seed=stable_seed(b, sq, sk, hq, d, pack))


# (B, Sq, Sk, Hq, Hkv, causal, window, sinks) at head_dim 128 with each key-tile width forced:
# the launcher takes 128 keys per tile under a causal mask or a window and 176 otherwise.
D128_BLOCK_N_CASES = [(2, 1023, 1023, 4, 1, True, -1, True), (1, 700, 1900, 8, 2, False, -1, False),
                      (3, 239, 1023, 8, 2, True, 127, True), (1, 1, 5000, 32, 8, True, -1, False),
                      (1, 2048, 2048, 2, 2, True, 300, False)]


@needs_sm90
@pytest.mark.parametrize("block_n", ["128", "176"])
@pytest.mark.parametrize("b,sq,sk,hq,hkv,causal,window,sinks", D128_BLOCK_N_CASES)
def test_fmha_sm90_d128_keys_per_tile(monkeypatch, block_n, b, sq, sk, hq, hkv, causal, window,
                                      sinks):
    """Oracle parity with 128 and with 176 keys per tile at head_dim 128, whichever the
    launcher would choose, masked and not, split-KV (the decode case) and not."""
    monkeypatch.setenv("DSV4_FMHA_D128_BLOCK_N", block_n)
    check_case(b, sq, sk, hq, hkv, 128, causal, window, sinks,
               seed=stable_seed(b, sq, sk, hq, causal, window, block_n))


@needs_sm90
def test_fmha_sm90_d128_keys_per_tile_bad_override(monkeypatch):
    monkeypatch.setenv("DSV4_FMHA_D128_BLOCK_N", "96")
    q = torch.randn(1, 64, 2, 128, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="DSV4_FMHA_D128_BLOCK_N must be 128 or 176, got '96'"):
        dsv4_attn.fmha(q, q, q)


# (B, Sq, Sk, Hq, Hkv, D, causal, window): work-tile counts below the SM count (and split),
# about at it (11 x 12 = 132), and far above it, with tiles that see no key (Sq > Sk, causal)
# and tiles of unequal cost, for each grid (sm90/shared/tile_scheduler.cuh).
GRID_CASES = [(1, 300, 300, 4, 1, 128, True, -1), (1, 1408, 1408, 12, 4, 128, True, -1),
              (4, 1023, 1023, 16, 16, 64, True, 1), (3, 1023, 239, 16, 4, 256, True, -1),
              (2, 2000, 3000, 16, 2, 128, False, -1), (2, 900, 100, 16, 16, 64, True, 50)]


@needs_sm90
@pytest.mark.parametrize("grid", ["per_tile", "persistent", "dynamic"])
@pytest.mark.parametrize("b,sq,sk,hq,hkv,d,causal,window", GRID_CASES)
def test_fmha_sm90_grids(monkeypatch, grid, b, sq, sk, hq, hkv, d, causal, window):
    """Oracle parity, poisoned outputs and bitwise repeatability with one CTA per work tile,
    a static persistent grid and the dynamic one (a per-call tile counter; only the kernels
    that publish their work tiles have it: head_dim 64, and 128 with 128 keys per tile)."""
    if grid == "dynamic" and d == 256:
        pytest.skip("the head_dim-256 kernel has no dynamic grid")
    if grid == "dynamic" and d == 128:
        monkeypatch.setenv("DSV4_FMHA_D128_BLOCK_N", "128")
    monkeypatch.setenv("DSV4_FMHA_GRID", grid)
    check_case(b, sq, sk, hq, hkv, d, causal, window, True,
               seed=stable_seed(b, sq, sk, hq, d, causal, grid))


@needs_sm90
def test_fmha_sm90_grid_bad_override(monkeypatch):
    monkeypatch.setenv("DSV4_FMHA_GRID", "static")
    q = torch.randn(1, 64, 2, 128, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="DSV4_FMHA_GRID must be per_tile, persistent or "
                                           "dynamic, got 'static'"):
        dsv4_attn.fmha(q, q, q)
    monkeypatch.setenv("DSV4_FMHA_GRID", "dynamic")
    q = torch.randn(1, 64, 2, 256, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="DSV4_FMHA_GRID=dynamic needs head_dim 64, or "
                                           "head_dim 128 with 128 keys per tile; this call "
                                           "has head_dim 256 and 80 keys per tile"):
        dsv4_attn.fmha(q, q, q)


@needs_sm90
def test_fmha_sm90_split_kv_decode_cuda_graph_replay():
    """A split-KV decode step (kernel, then combine) captured once and replayed on new data."""
    gen = torch.Generator(device="cuda").manual_seed(21)
    q, k, v = make_inputs(1, 1, 6000, 32, 8, 128, torch.bfloat16, "bshd", gen)
    sinks = torch.randn(32, generator=gen, device="cuda")
    dsv4_attn.fmha(q, k, v, causal=True, sinks=sinks)  # warm-up, uncaptured
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = dsv4_attn.fmha(q, k, v, causal=True, sinks=sinks, return_lse=True)
    for _ in range(2):
        for dst, src in zip((q, k, v), make_inputs(1, 1, 6000, 32, 8, 128, torch.bfloat16,
                                                   "bshd", gen)):
            dst.copy_(src)
        graph.replay()
        want_out, want_lse = dsv4_attn.fmha(q, k, v, causal=True, sinks=sinks, return_lse=True)
        assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    ref_out, _ = oracle(q, k, v, 1 / math.sqrt(128), True, -1, sinks)
    assert (out.double() - ref_out).abs().max().item() < 2e-2
