"""Shared fixtures and comparison helpers for the dsv4_attn tests.

Every test gets a torch.Generator seeded from its own node id (`gen`), so each case draws
fresh, reproducible random inputs. Tests marked `gpu` are skipped when CUDA is absent; the
`device` fixture runs a test on CPU and, as a gpu-marked variant, on CUDA.

Comparisons are against the float64 oracles in dsv4_attn/reference.py: relative RMS error
‖ours - ref‖ / ‖ref‖ and max-abs error, with tolerances set by the output dtype.
"""
import math
import zlib

import pytest
import torch

# The kernels compute in fp32 and round the output once, so the error is about one rounding
# of the output dtype (bf16: 8 mantissa bits, fp16: 11): rel-RMS a few times 2^-9 / 2^-11.
REL_RMS_TOL = {torch.bfloat16: 1e-2, torch.float16: 2.5e-3, torch.float32: 1e-5}
# Max-abs error, as a fraction of the reference's largest magnitude.
MAX_ABS_TOL = {torch.bfloat16: 2e-2, torch.float16: 4e-3, torch.float32: 2e-5}

HALF_DTYPES = [torch.bfloat16, torch.float16]

# The test tensors are small: one intra-op thread is faster than a pool, and on a shared
# 2-core CI runner a spinning OpenMP pool made the suite ~6x slower (3 s -> 19 s).
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def stable_seed(*parts) -> int:
    """A seed from a case's parameters that is the same in every process (Python's hash() of a
    str changes with PYTHONHASHSEED, and so would the case's inputs)."""
    return zlib.crc32(repr(parts).encode()) % 2 ** 31


@pytest.fixture
def gen(request):
    """A CPU generator seeded from the test id: fresh inputs per case, reproducible per run."""
    g = torch.Generator()
    g.manual_seed(zlib.crc32(request.node.nodeid.encode()))
    return g


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request):
    return torch.device(request.param)


def randn(gen, *shape, dtype=torch.bfloat16, device="cpu"):
    """Standard-normal values drawn on CPU from `gen`, then cast and moved."""
    return torch.randn(*shape, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)


def rand(gen, *shape, dtype=torch.float32, device="cpu"):
    """Uniform [0, 1) values drawn on CPU from `gen`, then cast and moved."""
    return torch.rand(*shape, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)


def cu_seqlens(lengths, device="cpu"):
    """int32 (N+1,) prefix sums of `lengths`."""
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device=device)


def rel_rms(ours, want):
    """‖ours - want‖ / ‖want‖ in float64 (0 when both are empty or exactly zero)."""
    ours, want = ours.detach().double().cpu(), want.detach().double().cpu()
    num = (ours - want).norm().item()
    den = want.norm().item()
    if den == 0.0:
        return num
    return num / den


def assert_close_to_ref(ours, want, dtype, what="out", rel_rms_tol=None, max_abs_tol=None):
    """Output check: same shape, no NaN, rel-RMS and max-abs within the dtype's tolerance."""
    assert tuple(ours.shape) == tuple(want.shape), f"{what}: shape {tuple(ours.shape)} != {tuple(want.shape)}"
    ours, want = ours.detach().double().cpu(), want.detach().double().cpu()
    assert not ours.isnan().any(), f"{what}: {int(ours.isnan().sum())} NaN values"
    assert torch.isfinite(ours).all(), f"{what}: non-finite values"
    if want.numel() == 0:
        return
    rel_rms_tol = REL_RMS_TOL[dtype] if rel_rms_tol is None else rel_rms_tol
    max_abs_tol = MAX_ABS_TOL[dtype] if max_abs_tol is None else max_abs_tol
    err = rel_rms(ours, want)
    assert err <= rel_rms_tol, f"{what}: rel-RMS error {err:.3e} > {rel_rms_tol:.1e}"
    scale = max(want.abs().max().item(), 1e-30)
    max_abs = (ours - want).abs().max().item()
    assert max_abs <= max_abs_tol * scale, (
        f"{what}: max-abs error {max_abs:.3e} > {max_abs_tol:.1e} x max|ref| ({scale:.3e})")


def assert_lse_close(ours, want, atol=1e-3, what="lse"):
    """lse check: fp32, same shape, -inf exactly where the reference is -inf, no NaN."""
    assert ours.dtype == torch.float32, f"{what}: dtype {ours.dtype}, want float32"
    assert tuple(ours.shape) == tuple(want.shape), f"{what}: shape {tuple(ours.shape)} != {tuple(want.shape)}"
    ours, want = ours.detach().double().cpu(), want.detach().double().cpu()
    assert not ours.isnan().any(), f"{what}: {int(ours.isnan().sum())} NaN values"
    empty = want == -math.inf
    assert torch.equal(ours == -math.inf, empty), (
        f"{what}: -inf at {int((ours == -math.inf).sum())} rows, want {int(empty.sum())}")
    if (~empty).any():
        err = (ours[~empty] - want[~empty]).abs().max().item()
        assert err <= atol, f"{what}: max-abs error {err:.3e} > {atol:.1e}"


def poison_allocator(nbytes, device):
    """Leave NaN bit patterns (0xFF bytes) in the cached blocks the op will allocate from."""
    blocks = [torch.full((nbytes,), 0xFF, dtype=torch.uint8, device=device) for _ in range(2)]
    del blocks
