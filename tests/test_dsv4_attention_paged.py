"""dsv4.dsv4_attention_paged: DeepSeek-V4 attention over the paged FP8 caches, against the float64
oracle (reference.dsv4_attention_paged, which decodes the cache's bytes itself), and against
dsv4_attention on the dequantized rows; on a Hopper GPU, the head_dim-512 kernel's paged mode
against the oracle and the reference path, bitwise deterministic, on poisoned memory.

Cases: Hq 1/8/64/128, T = 1, 2, 4 and a prefill chunk, window only or with a compressed cache
(page sizes 64 and 2), lengths shorter than the lists, empty lists, -1 and out-of-range slots,
repeated slots, sinks (finite, -inf, +inf), fp16. Each runs on CPU and, gpu-marked, on CUDA.
"""
import math

import pytest
import torch

import dsv4_attn
from dsv4_attn import reference as ref

from conftest import assert_close_to_ref, assert_lse_close, poison_allocator, randn, stable_seed
from test_fmha_sm90 import _is_sm90, needs_sm90

D, RECORD, DATA = 512, 584, 576


def new_cache(num_blocks, p, device):
    """A (num_blocks, P, 1, 584) view over padded blocks, as an engine allocates it, holding
    random rows in every slot (inserted by kv_cache_insert_fp8)."""
    stride = (p * RECORD + DATA - 1) // DATA * DATA
    raw = torch.zeros(num_blocks * stride, dtype=torch.uint8, device=device)
    cache = raw.as_strided((num_blocks, p, 1, RECORD), (stride, RECORD, RECORD, 1))
    gen = torch.Generator().manual_seed(stable_seed(num_blocks, p))
    rows = torch.randn(num_blocks * p, D, generator=gen).bfloat16().to(device)
    dsv4_attn.kv_cache_insert_fp8(rows, cache, torch.arange(num_blocks * p, device=device))
    return cache


def slot_lists(gen, t, length, capacity, device, lengths=True):
    """int32 (T, L) slots drawn over [-1, capacity + 2): -1 and out-of-range entries, and a
    repeat of entry 0 in the last place; int32 (T,) lengths from 0 to L (or None)."""
    slots = torch.randint(-1, capacity + 3, (t, length), generator=gen, dtype=torch.int32)
    if length >= 2:
        slots[:, -1] = slots[:, 0]
    lens = torch.randint(0, length + 1, (t,), generator=gen, dtype=torch.int32) if lengths else None
    if lens is not None and t > 0:
        lens[0] = length  # one token reads its whole list
    return slots.to(device), None if lens is None else lens.to(device)


# (T, Hq, window blocks x P, W, compressed blocks x P or None, K, sinks)
CASES = [
    pytest.param(1, 64, (4, 64), 128, (8, 64), 512, "finite", id="decode-csa-h64"),
    pytest.param(2, 128, (2, 64), 128, (3, 2), 6, "finite", id="mtp-hca-p2-h128"),
    pytest.param(4, 8, (3, 64), 128, (5, 64), 100, None, id="t4-h8-no-sink"),
    pytest.param(33, 16, (4, 64), 64, None, 0, "finite", id="chunk-window-only"),
    pytest.param(3, 1, (1, 2), 5, (1, 64), 3, "inf", id="h1-tiny-sinks-inf"),
    pytest.param(2, 8, (2, 64), 0, (2, 64), 0, "finite", id="empty-lists-sink-only"),
    pytest.param(2, 8, (2, 64), 0, None, 0, None, id="empty-lists-no-sink"),
]


def _sinks(kind, h, gen, device):
    if kind is None:
        return None
    s = randn(gen, h, dtype=torch.float32, device=device)
    if kind == "inf" and h >= 1:
        s[0] = math.inf
    if kind == "inf" and h >= 2:
        s[1] = -math.inf
    return s


@pytest.mark.parametrize("t,h,wc,w,cc,k,sinks", CASES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_against_oracle(gen, device, t, h, wc, w, cc, k, sinks, dtype):
    q = randn(gen, t, h, D, dtype=dtype, device=device)
    window_cache = new_cache(*wc, device)
    ws, wl = slot_lists(gen, t, w, wc[0] * wc[1], device)
    kw = dict(window_lengths=wl, sinks=_sinks(sinks, h, gen, device))
    if cc is not None:
        cs, cl = slot_lists(gen, t, k, cc[0] * cc[1], device, lengths=k % 2 == 0)
        kw.update(compressed_cache=new_cache(*cc, device), compressed_slots=cs,
                  compressed_lengths=cl)
    path = dsv4_attn.dsv4_attention_paged_path(q, window_cache, ws, **kw)
    assert path == "reference" if device.type == "cpu" else path in ("sm90", "reference")
    out = torch.full_like(q, float("nan"))  # poisoned: every element must be written
    got, lse = dsv4_attn.dsv4_attention_paged(q, window_cache, ws, out=out, **kw)
    assert got is out and lse.shape == (h, t)
    want_out, want_lse = ref.dsv4_attention_paged(q, window_cache, ws, **kw)
    assert_close_to_ref(got, want_out, dtype)
    assert_lse_close(lse, want_lse, atol=2e-3)


def test_equals_dsv4_attention_on_dequantized_rows(gen, device):
    """A CSA decode step: the window's and the listed rows, written to the caches, give the
    output dsv4_attention gives on the rows the caches hold (the same fp32 softmax)."""
    h, window, sc, k = 16, 128, 40, 16
    q = randn(gen, 1, h, D, device=device)
    kv_cache, c_cache = new_cache(3, 64, device), new_cache(1, 64, device)
    # Token at position 200: window rows 73..200 at slots 0..127; compressed rows at slots 0..39.
    kv = torch.zeros(201, D, device=device, dtype=torch.bfloat16)
    kv[73:] = dsv4_attn.kv_cache_gather_fp8(kv_cache, torch.arange(128, device=device))
    comp = dsv4_attn.kv_cache_gather_fp8(c_cache, torch.arange(sc, device=device))
    topk = torch.randperm(sc, generator=gen)[:k].to(torch.int32).to(device)
    sinks = randn(gen, h, dtype=torch.float32, device=device)
    want, want_lse = dsv4_attn.dsv4_attention(q[None], kv[None], sinks=sinks, window=window,
                                              compressed_kv=comp[None], compress_ratio=4,
                                              topk_indices=topk.view(1, 1, k), return_lse=True)
    got, lse = dsv4_attn.dsv4_attention_paged(
        q, kv_cache, torch.arange(128, device=device, dtype=torch.int32).view(1, -1),
        compressed_cache=c_cache, compressed_slots=topk.view(1, k), sinks=sinks)
    assert_close_to_ref(got, want[0], torch.bfloat16)
    # dsv4_attention's lse includes the sink; the paged op's does not.
    assert_lse_close(torch.logaddexp(lse, sinks.view(h, 1)), want_lse[0], atol=1e-4)


def test_empty_call_and_plan():
    cache = new_cache(1, 64, "cpu")
    q = torch.zeros(0, 8, D, dtype=torch.bfloat16)
    out, lse = dsv4_attn.dsv4_attention_paged(q, cache, torch.zeros(0, 4, dtype=torch.int32))
    assert out.shape == (0, 8, D) and lse.shape == (8, 0)
    plan = dsv4_attn.launch_plan("dsv4_attention_paged", q, cache,
                                 torch.zeros(0, 4, dtype=torch.int32), out=out)
    assert plan.startswith("reference: "), plan


def test_bad_inputs_name_the_argument():
    cache = new_cache(2, 64, "cpu")
    q = torch.randn(3, 8, D).bfloat16()
    slots = torch.zeros(3, 4, dtype=torch.int32)
    lens = torch.full((3,), 4, dtype=torch.int32)
    call = dsv4_attn.dsv4_attention_paged
    raw = torch.zeros(4 * cache.stride(0), dtype=torch.uint8)

    def laid_out(block_stride, row_stride):  # (2, 64, 1, 584) over other strides
        return raw.as_strided(cache.shape, (block_stride, row_stride, row_stride, 1))

    bad = [
        (lambda: call(q.float(), cache, slots), "q must be bf16 or fp16"),
        (lambda: call(q[..., :256], cache, slots), "q.size(2)"),
        (lambda: call(q, cache, slots.long()), "window_slots must be Int"),
        (lambda: call(q, cache, slots[:2]), "window_slots.size(0)"),
        (lambda: call(q, cache, slots, window_lengths=lens[:2]), "window_lengths.size(0)"),
        (lambda: call(q, cache, slots, window_lengths=lens.long()), "window_lengths must be Int"),
        (lambda: call(q, cache[..., :576], slots), "window_cache.size(3)"),
        (lambda: call(q, cache, slots, compressed_cache=cache), "compressed_cache and compressed_slots"),
        (lambda: call(q, cache, slots, compressed_slots=slots), "compressed_cache and compressed_slots"),
        (lambda: call(q, cache, slots, compressed_lengths=lens), "compressed_lengths needs"),
        (lambda: call(q, cache, slots, compressed_cache=cache.view(torch.int8), compressed_slots=slots),
         "compressed_cache must be Byte"),
        (lambda: call(q, cache, slots, sinks=torch.zeros(4)), "sinks must be (Hq,)"),
        (lambda: call(q, cache, slots, sinks=torch.zeros(8, dtype=torch.float64)), "sinks must be Float"),
        (lambda: call(q, cache, slots, out=torch.empty(3, 8, D)), "out must have the same dtype"),
        (lambda: call(q, cache, slots, out=torch.empty(8, 3, D).bfloat16().transpose(0, 1)),
         "out must be a contiguous tensor"),
        (lambda: call(q, cache, slots, scale=math.inf), "scale must be finite"),
        (lambda: call(q, laid_out(cache.stride(0), 600), slots),
         "window_cache must be a view of whole blocks"),
        (lambda: call(q, laid_out(RECORD * 63, RECORD), slots),
         "window_cache.stride(0) (bytes per block) must be a multiple of 576"),
        (lambda: call(q, cache, slots, compressed_cache=laid_out(cache.stride(0) + 8, RECORD),
                      compressed_slots=slots),
         "compressed_cache.stride(0) (bytes per block) must be a multiple of 576"),
    ]
    for fn, text in bad:
        with pytest.raises(RuntimeError, match=text.replace("(", r"\(").replace(")", r"\)")):
            fn()


def test_fake_kernel_checks_like_the_op():
    """Under FakeTensorMode (what torch.compile traces with) the fake kernel rejects bad inputs
    with the op's own messages, and gives lse's shape."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    real = dict(q=torch.randn(3, 8, D).bfloat16(), cache=new_cache(2, 64, "cpu"),
                slots=torch.zeros(3, 4, dtype=torch.int32),
                lens=torch.full((3,), 4, dtype=torch.int32))
    with FakeTensorMode() as mode:
        f = {k: mode.from_tensor(v) for k, v in real.items()}
        call = torch.ops.dsv4.dsv4_attention_paged
        lse = call(f["q"], f["cache"], f["slots"], window_lengths=f["lens"],
                   out=torch.empty_like(f["q"]))
        assert lse.shape == (8, 3) and lse.dtype == torch.float32
        bad = [
            (lambda: call(f["q"], f["cache"], f["slots"].long(), out=torch.empty_like(f["q"])),
             "window_slots must be Int"),
            (lambda: call(f["q"], f["cache"], f["slots"][:2], out=torch.empty_like(f["q"])),
             "window_slots.size(0)"),
            (lambda: call(f["q"], f["cache"], f["slots"], compressed_lengths=f["lens"],
                          out=torch.empty_like(f["q"])), "compressed_lengths needs"),
            (lambda: call(f["q"], f["cache"][..., :576], f["slots"], out=torch.empty_like(f["q"])),
             "window_cache.size(3)"),
            (lambda: call(f["q"], f["cache"], f["slots"], out=torch.empty_like(f["q"]).float()),
             "out must have the same dtype"),
        ]
        for fn, text in bad:
            with pytest.raises(RuntimeError, match=text.replace("(", r"\(").replace(")", r"\)")):
                fn()


def test_opcheck_and_compile_fullgraph():
    """The op as a custom op: opcheck (the schema's mutation of out, the fake kernel), and a
    decode step under torch.compile(fullgraph=True) equal to eager."""
    gen = torch.Generator().manual_seed(5)
    cache, c_cache = new_cache(2, 64, "cpu"), new_cache(3, 2, "cpu")
    q = torch.randn(2, 8, D, generator=gen).bfloat16()
    ws, wl = slot_lists(gen, 2, 16, 128, "cpu")
    cs, cl = slot_lists(gen, 2, 4, 6, "cpu")
    sinks = torch.randn(8, generator=gen)
    kw = dict(window_lengths=wl, compressed_cache=c_cache, compressed_slots=cs,
              compressed_lengths=cl, sinks=sinks)
    # As for the cache ops, not the AOT-dispatch tests: they clone the caches contiguously,
    # which drops the padded block stride the format requires.
    utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    torch.library.opcheck(torch.ops.dsv4.dsv4_attention_paged.default, (q, cache, ws),
                          dict(kw, out=torch.empty_like(q)), test_utils=utils)
    want = dsv4_attn.dsv4_attention_paged(q, cache, ws, **kw)
    for backend in ("aot_eager", "inductor"):
        torch._dynamo.reset()
        got = torch.compile(lambda q: dsv4_attn.dsv4_attention_paged(q, cache, ws, **kw),
                            fullgraph=True, backend=backend)(q)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), backend


@pytest.mark.gpu
def test_decode_step_in_a_cuda_graph():
    """A decode step captured once and replayed with new slots and lengths: no host sync, and
    each replay equals an eager call."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    gen = torch.Generator().manual_seed(9)
    cache, c_cache = new_cache(4, 64, "cuda"), new_cache(8, 64, "cuda")
    q = torch.randn(4, 64, D, generator=gen).bfloat16().cuda()
    ws, wl = slot_lists(gen, 4, 128, 256, "cuda")
    cs, cl = slot_lists(gen, 4, 512, 512, "cuda")
    sinks = torch.randn(64, generator=gen).cuda()
    kw = dict(window_lengths=wl, compressed_cache=c_cache, compressed_slots=cs,
              compressed_lengths=cl, sinks=sinks)
    out = torch.empty_like(q)
    if _is_sm90():  # the kernel is what an engine captures on Hopper
        assert dsv4_attn.dsv4_attention_paged_path(q, cache, ws, **kw) == "sm90"
    dsv4_attn.dsv4_attention_paged(q, cache, ws, out=out, **kw)  # warm up the allocator
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, lse = dsv4_attn.dsv4_attention_paged(q, cache, ws, out=out, **kw)
    for _ in range(2):
        new_ws, new_wl = slot_lists(gen, 4, 128, 256, "cuda")
        new_cs, new_cl = slot_lists(gen, 4, 512, 512, "cuda")
        for dst, src in ((ws, new_ws), (wl, new_wl), (cs, new_cs), (cl, new_cl)):
            dst.copy_(src)
        graph.replay()
        want_out, want_lse = dsv4_attn.dsv4_attention_paged(q, cache, ws, **kw)
        assert torch.equal(out, want_out) and torch.equal(lse, want_lse)


# --------------------------------------------------------------------------------- sm90 kernel

# (T, Hq, window blocks x P, W, compressed blocks x P or None, K, sinks): decode (split-KV),
# multi-token prediction, TP head counts (several tokens per work tile), 128 heads (two head
# blocks), a prefill chunk (no split), pages of 2, empty window lists.
KERNEL_CASES = [
    pytest.param(1, 64, (4, 64), 128, (16, 64), 512, "finite", id="decode-csa512-h64"),
    pytest.param(2, 128, (4, 64), 128, (16, 64), 1024, "finite", id="mtp-csa1024-h128"),
    pytest.param(4, 8, (4, 64), 128, (8, 64), 300, "finite", id="t4-h8"),
    pytest.param(5, 16, (4, 64), 100, (100, 2), 70, None, id="t5-h16-hca-p2"),
    pytest.param(3, 32, (2, 64), 128, None, 0, "inf", id="t3-h32-window-only-sinks-inf"),
    pytest.param(300, 64, (8, 64), 128, (16, 64), 512, "finite", id="chunk300-h64"),
    pytest.param(70, 2, (8, 64), 64, (16, 64), 96, "finite", id="chunk70-h2"),
    pytest.param(6, 64, (2, 64), 0, (8, 64), 200, "finite", id="no-window-entries"),
    pytest.param(200, 16, (8, 64), 128, (16, 64), 256, "finite", id="chunk200-h16-packed"),
]


def _low_precision(q, window_cache, window_slots, kw):
    """FlashAttention's low-precision reference, token by token: the read rows dequantized to
    q's dtype (exactly: an fp8 value times a power of two), fp32 scores, an fp32 softmax with
    the sink, P rounded to q's dtype, the output rounded once."""
    lists = [(window_cache, window_slots, kw.get("window_lengths"))]
    if kw.get("compressed_cache") is not None:
        lists.append((kw["compressed_cache"], kw["compressed_slots"], kw.get("compressed_lengths")))
    sinks = kw.get("sinks")
    outs = []
    for i in range(q.shape[0]):
        rows = []
        for cache, slots, lengths in lists:
            listed = slots[i, :slots.shape[1] if lengths is None else int(lengths[i])]
            listed = listed[(listed >= 0) & (listed < cache.shape[0] * cache.shape[1])]
            rows.append(dsv4_attn.kv_cache_gather_fp8(cache, listed, q.dtype).float())
        kv = torch.cat(rows)
        s = q[i].float() @ kv.T / math.sqrt(q.shape[-1])  # (H, rows)
        lse = torch.logsumexp(s, -1)
        if sinks is not None:
            lse = torch.logaddexp(lse, sinks.float())
        p = torch.exp(s - torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)[:, None])
        p = torch.where(torch.isposinf(lse)[:, None], 0.0, p)  # a sink of +inf takes it all
        outs.append((p.to(q.dtype).float() @ kv).to(q.dtype))
    return torch.stack(outs)


def _kernel_case(gen, t, h, wc, w, cc, k, sinks, dtype):
    q = randn(gen, t, h, D, dtype=dtype, device="cuda")
    window_cache = new_cache(*wc, "cuda")
    ws, wl = slot_lists(gen, t, w, wc[0] * wc[1], "cuda")
    kw = dict(window_lengths=wl, sinks=_sinks(sinks, h, gen, "cuda"))
    if cc is not None:
        cs, cl = slot_lists(gen, t, k, cc[0] * cc[1], "cuda", lengths=k % 2 == 0)
        kw.update(compressed_cache=new_cache(*cc, "cuda"), compressed_slots=cs,
                  compressed_lengths=cl)
    return q, window_cache, ws, kw


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("t,h,wc,w,cc,k,sinks", KERNEL_CASES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kernel_against_oracle_and_reference(gen, monkeypatch, t, h, wc, w, cc, k, sinks, dtype):
    q, window_cache, ws, kw = _kernel_case(gen, t, h, wc, w, cc, k, sinks, dtype)
    assert dsv4_attn.dsv4_attention_paged_path(q, window_cache, ws, **kw) == "sm90"
    poison_allocator(64 << 20, "cuda")
    out, lse = dsv4_attn.dsv4_attention_paged(q, window_cache, ws, **kw)
    again, lse_again = dsv4_attn.dsv4_attention_paged(q, window_cache, ws, **kw)
    assert torch.equal(out, again) and torch.equal(lse, lse_again), "not bitwise deterministic"
    # The oracle on at most 8 tokens (it decodes every row in Python).
    m = min(t, 8)
    part = {key: (v[:m] if key in ("window_lengths", "compressed_slots", "compressed_lengths")
                  and v is not None else v) for key, v in kw.items()}
    want_out, want_lse = ref.dsv4_attention_paged(q[:m], window_cache, ws[:m], **part)
    assert_close_to_ref(out[:m], want_out, dtype)
    # FlashAttention's rule: at most twice the low-precision reference's error.
    want = want_out.double().cpu()
    err = (out[:m].double().cpu() - want).abs().max().item()
    low_err = (_low_precision(q[:m], window_cache, ws[:m], part).double().cpu() - want).abs().max()
    assert err <= 2 * low_err.item() + 1e-3, f"out error {err:.3e}, low precision {low_err:.3e}"
    assert_lse_close(lse[:, :m], want_lse, atol=2e-3)
    monkeypatch.setenv("DSV4_DISABLE_SM90", "1")
    ref_out, ref_lse = dsv4_attn.dsv4_attention_paged(q, window_cache, ws, **kw)
    assert_close_to_ref(out, ref_out.float(), dtype, what="out vs the reference path")
    assert_lse_close(lse, ref_lse, atol=2e-3, what="lse vs the reference path")


@pytest.mark.gpu
@needs_sm90
def test_kernel_out_argument_and_plan():
    gen = torch.Generator().manual_seed(3)
    q, window_cache, ws, kw = _kernel_case(gen, 2, 64, (4, 64), 128, (16, 64), 512, "finite",
                                           torch.bfloat16)
    out = torch.full_like(q, float("nan"))
    got, _ = dsv4_attn.dsv4_attention_paged(q, window_cache, ws, out=out, **kw)
    assert got is out and torch.isfinite(out).all()
    plan = dsv4_attn.launch_plan("dsv4_attention_paged", q, window_cache, ws, out=out, **kw)
    assert plan.startswith("sm90 mqa512 tile=1x64"), plan
    odd = new_cache(3, 48, "cuda")  # a page size that is not a power of two
    assert dsv4_attn.dsv4_attention_paged_path(q, odd, ws) == "reference"


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("t,h,wc,w,cc,k,sinks",
                         [KERNEL_CASES[i] for i in (0, 1, 3, 5)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kernel_converters_agree(gen, monkeypatch, t, h, wc, w, cc, k, sinks, dtype):
    """The FP8 blocks converted by the producer or by the consumers (the plan picks by work
    tiles per CTA; DSV4_MQA512_PAGED_CONVERT pins it): the same bytes, bitwise."""
    q, window_cache, ws, kw = _kernel_case(gen, t, h, wc, w, cc, k, sinks, dtype)
    got = {}
    for who in ("producer", "consumer"):
        monkeypatch.setenv("DSV4_MQA512_PAGED_CONVERT", who)
        plan = dsv4_attn.launch_plan("dsv4_attention_paged", q, window_cache, ws,
                                     out=torch.empty_like(q), **kw)
        assert plan.startswith("sm90 ") and plan.endswith(" convert=" + who), plan
        poison_allocator(64 << 20, "cuda")
        got[who] = dsv4_attn.dsv4_attention_paged(q, window_cache, ws, **kw)
    for a, b in zip(got["producer"], got["consumer"]):
        assert torch.equal(a, b), "the two converters differ"
    monkeypatch.setenv("DSV4_MQA512_PAGED_CONVERT", "both")
    with pytest.raises(RuntimeError, match="DSV4_MQA512_PAGED_CONVERT"):
        dsv4_attn.dsv4_attention_paged(q, window_cache, ws, **kw)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("t,h,w,k,sinks", [(3, 64, 128, 512, "finite"), (6, 32, 128, 300, "inf"),
                                           (2, 128, 128, 512, None), (140, 16, 64, 0, "finite"),
                                           (4, 64, 0, 128, "finite")])
def test_kernel_split_merge(gen, monkeypatch, t, h, w, k, sinks):
    """Two splits joined inside a cluster of two CTAs (the plan's choice wherever it fits) or by
    the combine kernel (DSV4_MQA512_SPLIT_MERGE): each against the float64 oracle (on at most 8
    tokens), and the two close to each other; the cluster's result bitwise deterministic.
    Lengths below the lists may leave a split with no key (the last case: two list tiles a
    token, one a split); at 140 tokens of 16 heads a tile packs four tokens, split between
    them."""
    q, window_cache, ws, kw = _kernel_case(gen, t, h, (4, 64), w, (16, 64) if k else None, k,
                                           sinks, torch.bfloat16)
    splits = "2"
    monkeypatch.setenv("DSV4_SPLIT_KV", splits)
    m = min(t, 8)
    part = {key: (v[:m] if key in ("window_lengths", "compressed_slots", "compressed_lengths")
                  and v is not None else v) for key, v in kw.items()}
    want_out, want_lse = ref.dsv4_attention_paged(q[:m], window_cache, ws[:m], **part)
    got = {}
    for merge in ("combine", "cluster"):
        monkeypatch.setenv("DSV4_MQA512_SPLIT_MERGE", merge)
        plan = dsv4_attn.launch_plan("dsv4_attention_paged", q, window_cache, ws,
                                     out=torch.empty_like(q), **kw)
        assert f" splits={splits} merge={merge} " in plan, plan
        poison_allocator(64 << 20, "cuda")
        got[merge] = dsv4_attn.dsv4_attention_paged(q, window_cache, ws, **kw)
        assert_close_to_ref(got[merge][0][:m], want_out, torch.bfloat16, what=f"out ({merge})")
        assert_lse_close(got[merge][1][:, :m], want_lse, atol=2e-3, what=f"lse ({merge})")
    again = dsv4_attn.dsv4_attention_paged(q, window_cache, ws, **kw)
    assert all(torch.equal(a, b) for a, b in zip(got["cluster"], again)), "not deterministic"
    torch.testing.assert_close(got["cluster"][0], got["combine"][0], atol=2e-2, rtol=0)
    torch.testing.assert_close(got["cluster"][1], got["combine"][1], atol=1e-3, rtol=0)
    monkeypatch.setenv("DSV4_MQA512_SPLIT_MERGE", "both")
    with pytest.raises(RuntimeError, match="DSV4_MQA512_SPLIT_MERGE"):
        dsv4_attn.dsv4_attention_paged(q, window_cache, ws, **kw)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("t", [64, 8])
def test_kernel_chained_steps_read_the_previous_output(gen, t):
    """The kernel is queued by programmatic dependent launch behind the kernel before it, and
    triggers its own dependents at its start: a call whose q is the previous call's out must
    still read that out whole. Three chained calls (t = 64: split in two, merged in clusters;
    t = 8: split with the combine kernel) into NaN-poisoned outputs give the same bits as the
    same calls with a device synchronize after each."""
    q, window_cache, ws, kw = _kernel_case(gen, t, 64, (8, 64), 128, (16, 64), 512, "finite",
                                           torch.bfloat16)
    assert dsv4_attn.dsv4_attention_paged_path(q, window_cache, ws, **kw) == "sm90"

    def chain(sync):
        # Every out allocated first, so that each call's kernel follows the previous call's
        # directly on the stream (no fill kernel between).
        outs = [torch.full_like(q, float("nan")) for _ in range(3)]
        torch.cuda.synchronize()
        x = q
        for out in outs:
            dsv4_attn.dsv4_attention_paged(x, window_cache, ws, out=out, **kw)
            if sync:
                torch.cuda.synchronize()
            x = out
        torch.cuda.synchronize()
        return outs

    apart, chained = chain(True), chain(False)
    assert all(torch.isfinite(o).all() for o in apart)
    assert all(torch.equal(a, b) for a, b in zip(apart, chained)), "a call read a stale q"


@pytest.mark.gpu
@needs_sm90
def test_kernel_planned_tiles():
    """Below 64 heads a decode step takes one token a tile (the rows past its heads padding)
    where those tiles fill the SMs at most once; longer calls pack 64 / Hq tokens a tile."""
    gen = torch.Generator().manual_seed(6)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for t, h in ((64, 32), (64, 8), (sms, 16), (sms + 1, 16), (300, 2)):
        q, window_cache, ws, kw = _kernel_case(gen, t, h, (8, 64), 128, (16, 64), 512, "finite",
                                               torch.bfloat16)
        plan = dsv4_attn.launch_plan("dsv4_attention_paged", q, window_cache, ws,
                                     out=torch.empty_like(q), **kw)
        tile = f"1x{h}" if t <= sms else f"{64 // h}x{h}"
        assert f" tile={tile} " in plan, plan


@pytest.mark.gpu
@needs_sm90
def test_kernel_planned_converter():
    """The consumers convert in calls of at most two work tiles an SM (a decode step at 128
    heads; at 64, split in two and merged in clusters; two tokens split with the combine), the
    producer in long prefill chunks."""
    gen = torch.Generator().manual_seed(5)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for t, h in ((64, 128), (64, 64), (2, 64), (600, 64)):
        q, window_cache, ws, kw = _kernel_case(gen, t, h, (8, 64), 128, (16, 64), 512, "finite",
                                               torch.bfloat16)
        plan = dsv4_attn.launch_plan("dsv4_attention_paged", q, window_cache, ws,
                                     out=torch.empty_like(q), **kw)
        splits = int(plan.split(" splits=")[1].split()[0])
        work = t * (h // 64) * splits
        who = "consumer" if work <= 2 * sms else "producer"
        assert plan.endswith(" convert=" + who), plan
        if (t, h) != (600, 64):
            assert who == "consumer", plan  # the decode steps: at most one work tile an SM
        else:
            assert who == "producer", plan
