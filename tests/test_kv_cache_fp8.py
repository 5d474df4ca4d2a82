"""kv_cache_insert_fp8 / kv_cache_gather_fp8: DeepSeek-V4's paged FP8 KV cache record (README,
"The paged FP8 KV cache"), byte for byte against an independent quantizer written here (its own
exponent search and its own float8_e4m3 rounding in float64), on the reference path everywhere
and on the sm90 kernels on a Hopper GPU. The cache starts filled with a marker byte, so every
byte an insert must not touch is checked too.
"""
import math

import numpy as np
import pytest
import torch

import dsv4_attn

from conftest import poison_allocator, stable_seed
from test_fmha_sm90 import needs_sm90

D, QUANT, TILE, DATA, RECORD = 512, 448, 64, 576, 584
MARK = 0xA5


def block_bytes(p):
    return (p * RECORD + DATA - 1) // DATA * DATA


def new_cache(num_blocks, p, device, fill=MARK):
    """A (num_blocks, P, 1, 584) view over padded blocks, as an engine allocates it."""
    stride = block_bytes(p)
    raw = torch.full((num_blocks * stride,), fill, dtype=torch.uint8, device=device)
    return raw.as_strided((num_blocks, p, 1, RECORD), (stride, RECORD, RECORD, 1)), raw


def e4m3_bytes(y):
    """float8_e4m3fn bytes of float64 values |y| <= 448, rounded to nearest even."""
    sign = np.signbit(y).astype(np.uint8) << 7  # -0.0 keeps its sign
    a = np.abs(y)
    exp = np.floor(np.log2(np.where(a > 0, a, 1.0)))
    exp = np.maximum(exp, -6)                       # subnormals share the exponent -6
    quantum = np.exp2(exp - 3)
    q = np.round(a / quantum) * quantum             # np.round: half to even
    # Re-encode the rounded value (it may have stepped up to the next power of two).
    qexp = np.floor(np.log2(np.where(q > 0, q, 1.0)))
    normal = q >= 2.0 ** -6
    field = np.where(normal, qexp + 7, 0)
    mant = np.where(normal, q / np.exp2(qexp) * 8 - 8, q / 2.0 ** -9)
    out = sign | (field.astype(np.uint8) << 3) | mant.astype(np.uint8)
    return np.where(a > 0, out, sign).astype(np.uint8)


def scale_exponent(amax):
    """The smallest e with 2^e >= fl32(max(amax, 1e-4) / 448)."""
    v = float(np.float32(max(np.float32(amax), np.float32(1e-4))) / np.float32(448))
    e = math.ceil(math.log2(v))
    while 2.0 ** e < v:
        e += 1
    while 2.0 ** (e - 1) >= v:
        e -= 1
    return e


def expected_record(row):
    """One row (512 values of bf16 or fp16, as a torch tensor) -> (576 data, 8 scale) bytes."""
    x = row.float().cpu().numpy().astype(np.float64)
    data, scales = [], []
    for t in range(QUANT // TILE):
        tile = x[t * TILE:(t + 1) * TILE]
        e = scale_exponent(np.abs(tile).max())
        data.append(e4m3_bytes(tile * 2.0 ** -e))
        scales.append(e + 127)
    rope = row[QUANT:].to(torch.bfloat16).cpu().contiguous().view(torch.uint8).numpy()
    return np.concatenate(data + [rope]), np.array(scales + [0], dtype=np.uint8)


def expected_cache(raw, p, rows, slots):
    """The bytes `raw` must hold after inserting rows at slots (-1 and slots past the cache
    skipped)."""
    want = raw.cpu().numpy().copy()
    stride, capacity = block_bytes(p), raw.numel() // block_bytes(p) * p
    for row, slot in zip(rows, slots.tolist()):
        if slot < 0 or slot >= capacity:
            continue
        b, r = divmod(slot, p)
        data, scales = expected_record(row)
        want[b * stride + r * DATA: b * stride + (r + 1) * DATA] = data
        want[b * stride + p * DATA + r * 8: b * stride + p * DATA + (r + 1) * 8] = scales
    return want


def rows_with_ranges(n, dtype, gen, device):
    """Rows whose tiles span many magnitudes, with an all-zero tile and a tiny one."""
    x = torch.randn(n, D, generator=gen, device=device)
    mag = torch.exp2(torch.randint(-20, 12, (n, 8), generator=gen, device=device).float())
    x = x * mag.repeat_interleave(TILE, dim=1)
    x[0, 64:128] = 0.0
    if n > 1:
        x[1, :64] = 1e-6
    return x.to(dtype)


def slot_list(n, capacity, gen, device, dtype=torch.int64):
    """n distinct slots in the cache, some -1 and one past the cache."""
    slots = torch.randperm(capacity, generator=gen, device=device)[:n].clone()
    slots[1::5] = -1
    if n > 3:
        slots[3] = capacity + 7
    return slots.to(dtype)


CASES = [  # (N, num_blocks, P, kv dtype, slot dtype)
    (40, 3, 64, torch.bfloat16, torch.int64),
    (9, 7, 2, torch.float16, torch.int32),
    (1, 1, 2, torch.bfloat16, torch.int32),
    (130, 5, 64, torch.float16, torch.int64),
]


def _insert_case(n, blocks, p, dtype, slot_dtype, device, seed):
    gen = torch.Generator(device=device).manual_seed(seed)
    cache, raw = new_cache(blocks, p, device)
    kv = rows_with_ranges(n, dtype, gen, device)
    slots = slot_list(n, min(n + 5, blocks * p), gen, device, slot_dtype)
    return cache, raw, kv, slots


@pytest.mark.parametrize("n,blocks,p,dtype,slot_dtype", CASES)
def test_insert_is_byte_exact_on_cpu(n, blocks, p, dtype, slot_dtype):
    cache, raw, kv, slots = _insert_case(n, blocks, p, dtype, slot_dtype, "cpu",
                                         stable_seed("insert", n, p))
    want = expected_cache(raw, p, kv, slots)
    assert dsv4_attn.kv_cache_insert_fp8_path(kv, cache, slots) == "reference"
    dsv4_attn.kv_cache_insert_fp8(kv, cache, slots)
    np.testing.assert_array_equal(raw.numpy(), want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_gather_dequantizes_and_zero_fills(dtype):
    gen = torch.Generator().manual_seed(5)
    cache, raw = new_cache(4, 64, "cpu")
    kv = rows_with_ranges(50, torch.bfloat16, gen, "cpu")
    slots = torch.randperm(256, generator=gen)[:50]
    dsv4_attn.kv_cache_insert_fp8(kv, cache, slots)
    query = torch.cat([slots[:20], torch.tensor([-1, 256, 10_000])])
    got = dsv4_attn.kv_cache_gather_fp8(cache, query, dtype)
    assert got.shape == (23, D) and got.dtype == dtype
    assert torch.equal(got[20:], torch.zeros(3, D, dtype=dtype))
    for i in range(20):  # the record decoded by hand: fp8 value x 2^e, the bf16 tail as is
        data, scales = expected_record(kv[i])
        fp8 = torch.from_numpy(data[:QUANT].copy()).view(torch.float8_e4m3fn).double()
        e = torch.from_numpy(scales[:7].astype(np.int64) - 127).repeat_interleave(TILE)
        tail = torch.from_numpy(data[QUANT:].copy()).view(torch.bfloat16).double()
        want = torch.cat([fp8 * torch.exp2(e.double()), tail]).to(dtype)
        assert torch.equal(got[i], want), f"row {i}"
    # Within a tile's quantization step of the original rows.
    err = (got[:20].double() - kv[:20].double()).abs()
    step = got[:20].double().abs().reshape(20, 8, TILE).amax(-1, keepdim=True) / 8 + 1e-30
    assert (err.reshape(20, 8, TILE) <= step).all()


def test_insert_leaves_other_records_and_padding_alone():
    cache, raw = new_cache(2, 2, "cpu")
    kv = torch.randn(1, D).bfloat16()
    dsv4_attn.kv_cache_insert_fp8(kv, cache, torch.tensor([3]))  # block 1, row 1
    stride = block_bytes(2)
    touched = np.zeros(raw.numel(), dtype=bool)
    touched[stride + DATA:stride + 2 * DATA] = True
    touched[stride + 2 * DATA + 8:stride + 2 * DATA + 16] = True
    assert (raw.numpy()[~touched] == MARK).all()
    assert not (raw.numpy()[touched] == MARK).all()


def test_empty_calls():
    cache, raw = new_cache(1, 64, "cpu")
    dsv4_attn.kv_cache_insert_fp8(torch.empty(0, D).bfloat16(), cache, torch.empty(0).long())
    assert (raw == MARK).all()
    assert dsv4_attn.kv_cache_gather_fp8(cache, torch.empty(0).long()).shape == (0, D)


def test_bad_inputs_name_the_argument():
    cache, _ = new_cache(2, 64, "cpu")
    kv, slots = torch.randn(4, D).bfloat16(), torch.arange(4)
    bad = [
        (lambda: dsv4_attn.kv_cache_insert_fp8(kv.float(), cache, slots), "kv must be bf16 or fp16"),
        (lambda: dsv4_attn.kv_cache_insert_fp8(kv[:, :256], cache, slots), "kv.size(1)"),
        (lambda: dsv4_attn.kv_cache_insert_fp8(kv, cache, slots[:3]), "slots.size(0)"),
        (lambda: dsv4_attn.kv_cache_insert_fp8(kv, cache, slots.float()), "slots must be int32 or int64"),
        (lambda: dsv4_attn.kv_cache_insert_fp8(kv, cache.view(torch.int8), slots), "cache must be"),
        (lambda: dsv4_attn.kv_cache_insert_fp8(kv, cache[..., :576], slots), "cache.size(3)"),
        (lambda: dsv4_attn.kv_cache_insert_fp8(
            kv, torch.zeros(2 * 64 * RECORD, dtype=torch.uint8).view(2, 64, 1, RECORD), slots),
         "multiple of 576"),
        (lambda: dsv4_attn.kv_cache_gather_fp8(cache, slots, torch.int8), "dtype must be"),
        (lambda: dsv4_attn.kv_cache_gather_fp8(cache, slots[None]), "slots must be 1-D"),
    ]
    # Layouts that are not whole blocks of 584-byte records: rows 600 bytes apart, a byte
    # stride of 2, blocks 584 bytes short of padded (each through both ops).
    raw = torch.zeros(4 * block_bytes(64), dtype=torch.uint8)
    gapped = raw.as_strided((2, 64, 1, RECORD), (block_bytes(64) + DATA, 600, 600, 1))
    spread = raw.as_strided((2, 64, 1, RECORD), (2 * block_bytes(64), 2 * RECORD, 2 * RECORD, 2))
    short = raw.as_strided((2, 64, 1, RECORD), (64 * RECORD - RECORD, RECORD, RECORD, 1))
    for bad_cache, text in ((gapped, "cache must be a view of whole blocks, strides"),
                            (spread, "cache must be a view of whole blocks, strides"),
                            (short, "cache.stride(0) (bytes per block) must be a multiple of 576")):
        bad.append((lambda c=bad_cache: dsv4_attn.kv_cache_insert_fp8(kv, c, slots), text))
        bad.append((lambda c=bad_cache: dsv4_attn.kv_cache_gather_fp8(c, slots), text))
    for call, text in bad:
        with pytest.raises(RuntimeError, match=text.replace("(", r"\(").replace(")", r"\)")):
            call()


def test_fake_kernels_check_like_the_ops():
    cache = torch.empty_strided((2, 64, 1, RECORD), (block_bytes(64), RECORD, RECORD, 1),
                                dtype=torch.uint8, device="meta")
    out = torch.ops.dsv4.kv_cache_gather_fp8(cache, torch.empty(5, dtype=torch.long, device="meta"),
                                             torch.float16)
    assert out.shape == (5, D) and out.dtype == torch.float16
    with pytest.raises(RuntimeError, match="cache.size"):
        torch.ops.dsv4.kv_cache_gather_fp8(cache[..., :8], torch.empty(5, dtype=torch.long,
                                                                        device="meta"), torch.float16)


# --------------------------------------------------------------------------------- sm90 kernels


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("n,blocks,p,dtype,slot_dtype", CASES)
def test_insert_kernel_is_byte_exact(monkeypatch, n, blocks, p, dtype, slot_dtype):
    cache, raw, kv, slots = _insert_case(n, blocks, p, dtype, slot_dtype, "cuda",
                                         stable_seed("insert-gpu", n, p))
    want = expected_cache(raw, p, kv, slots)
    assert dsv4_attn.kv_cache_insert_fp8_path(kv, cache, slots) == "sm90"
    dsv4_attn.kv_cache_insert_fp8(kv, cache, slots)
    np.testing.assert_array_equal(raw.cpu().numpy(), want)
    # The reference path on the same GPU writes the same bytes.
    ref_cache, ref_raw = new_cache(blocks, p, "cuda")
    monkeypatch.setenv("DSV4_DISABLE_SM90", "1")
    assert dsv4_attn.kv_cache_insert_fp8_path(kv, ref_cache, slots) == "reference"
    dsv4_attn.kv_cache_insert_fp8(kv, ref_cache, slots)
    assert torch.equal(ref_raw, raw)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gather_kernel_matches_reference(monkeypatch, dtype):
    gen = torch.Generator(device="cuda").manual_seed(11)
    cache, raw = new_cache(6, 64, "cuda")
    kv = rows_with_ranges(300, torch.bfloat16, gen, "cuda")
    slots = torch.randperm(384, generator=gen, device="cuda")[:300]
    dsv4_attn.kv_cache_insert_fp8(kv, cache, slots)
    query = torch.cat([slots.flip(0), torch.tensor([-1, 384, 5], device="cuda")]).int()
    assert dsv4_attn.kv_cache_gather_fp8_path(cache, query, dtype) == "sm90"
    poison_allocator(303 * D * 2 + (1 << 20), "cuda")
    got = dsv4_attn.kv_cache_gather_fp8(cache, query, dtype)
    monkeypatch.setenv("DSV4_DISABLE_SM90", "1")
    want = dsv4_attn.kv_cache_gather_fp8(cache, query, dtype)
    assert torch.equal(got, want)
    assert torch.equal(got[300:302], torch.zeros(2, D, dtype=dtype, device="cuda"))


@pytest.mark.gpu
@needs_sm90
def test_insert_kernel_in_a_cuda_graph():
    """A decode step's insert, captured once and replayed with new rows and slots."""
    cache, raw = new_cache(4, 64, "cuda")
    kv = torch.randn(8, D, device="cuda").bfloat16()
    slots = torch.arange(8, device="cuda")
    dsv4_attn.kv_cache_insert_fp8(kv, cache, slots)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dsv4_attn.kv_cache_insert_fp8(kv, cache, slots)
    for step in range(1, 3):
        kv.copy_(torch.randn(8, D, device="cuda"))
        slots.copy_(torch.arange(8, device="cuda") * 3 + step)
        graph.replay()
        got = dsv4_attn.kv_cache_gather_fp8(cache, slots)
        fresh, fresh_raw = new_cache(4, 64, "cuda")
        dsv4_attn.kv_cache_insert_fp8(kv, fresh, slots)
        assert torch.equal(got, dsv4_attn.kv_cache_gather_fp8(fresh, slots))


def test_opcheck_and_compile_fullgraph():
    """The cache ops as custom ops: opcheck (schema with insert's mutation, fake kernels), and a
    decode step's insert then gather under torch.compile(fullgraph=True) equal to eager."""
    gen = torch.Generator().manual_seed(21)
    kv = torch.randn(6, D, generator=gen).bfloat16()
    slots = torch.tensor([3, -1, 64, 7, 200, 1])
    cache, _ = new_cache(3, 64, "cpu")
    # Not opcheck's AOT-dispatch tests: they hand the ops contiguous clones of the cache, whose
    # block stride (P * 584) is not the padded one the format requires. Under torch.compile the
    # cache keeps its strides (below, aot_eager and inductor).
    utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    torch.library.opcheck(torch.ops.dsv4.kv_cache_insert_fp8.default, (kv, cache, slots),
                          test_utils=utils)
    torch.library.opcheck(torch.ops.dsv4.kv_cache_gather_fp8.default,
                          (cache, slots, torch.float16), test_utils=utils)

    def step(kv, cache, slots):
        dsv4_attn.kv_cache_insert_fp8(kv, cache, slots)
        return dsv4_attn.kv_cache_gather_fp8(cache, slots, torch.float32)

    eager_cache, eager_raw = new_cache(3, 64, "cpu")
    compiled_cache, compiled_raw = new_cache(3, 64, "cpu")
    want = step(kv, eager_cache, slots)
    for backend in ("aot_eager", "inductor"):
        torch._dynamo.reset()
        compiled_raw.fill_(MARK)
        got = torch.compile(step, fullgraph=True, backend=backend)(kv, compiled_cache, slots)
        assert torch.equal(got, want) and torch.equal(compiled_raw, eager_raw), backend
