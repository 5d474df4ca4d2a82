"""Small calls of the paged FP8 KV cache kernels for compute-sanitizer (scripts/gpu_check.sh):
inserts into pages of 64 and of 2 rows with -1 and out-of-range slots, int32 and int64 slots,
and gathers of the same slots as bf16 and fp16; then dsv4_attention_paged reading them."""
import torch

import dsv4_attn

for p, slot_dtype, dtype in ((64, torch.int64, torch.bfloat16), (2, torch.int32, torch.float16)):
    stride = (p * 584 + 575) // 576 * 576
    blocks = 300 // p + 2
    cache = torch.zeros(blocks * stride, dtype=torch.uint8, device="cuda").as_strided(
        (blocks, p, 1, 584), (stride, 584, 584, 1))
    kv = torch.randn(300, 512, device="cuda").to(dtype)
    slots = torch.randperm(blocks * p, device="cuda")[:300]
    slots[::7] = -1
    slots[5] = blocks * p + 3
    slots = slots.to(slot_dtype)
    assert dsv4_attn.kv_cache_insert_fp8_path(kv, cache, slots) == "sm90"
    dsv4_attn.kv_cache_insert_fp8(kv, cache, slots)
    rows = dsv4_attn.kv_cache_gather_fp8(cache, slots, dtype)
    torch.cuda.synchronize()
    assert torch.isfinite(rows).all()
print("sanitize_kv_cache: insert and gather ran, rows finite")

# dsv4_attention_paged on the head_dim-512 kernel's paged mode: a decode step of 3 tokens at
# 16 heads (4 tokens per work tile, split-KV) and a chunk of 40 tokens at 128 heads, each over a
# window list on pages of 64 and a compressed list on pages of 2, with -1, out-of-range and
# past-the-length entries.
def cache_of(blocks, p):
    stride = (p * 584 + 575) // 576 * 576
    c = torch.zeros(blocks * stride, dtype=torch.uint8, device="cuda").as_strided(
        (blocks, p, 1, 584), (stride, 584, 584, 1))
    dsv4_attn.kv_cache_insert_fp8(torch.randn(blocks * p, 512, device="cuda").bfloat16(), c,
                                  torch.arange(blocks * p, device="cuda"))
    return c


window, comp = cache_of(4, 64), cache_of(100, 2)
for t, h in ((3, 16), (40, 128)):
    q = torch.randn(t, h, 512, device="cuda", dtype=torch.bfloat16)
    ws = torch.randint(-1, 260, (t, 128), device="cuda", dtype=torch.int32)
    cs = torch.randint(-1, 203, (t, 200), device="cuda", dtype=torch.int32)
    kw = dict(window_lengths=torch.randint(0, 129, (t,), device="cuda", dtype=torch.int32),
              compressed_cache=comp, compressed_slots=cs,
              compressed_lengths=torch.randint(0, 201, (t,), device="cuda", dtype=torch.int32),
              sinks=torch.randn(h, device="cuda"))
    assert dsv4_attn.dsv4_attention_paged_path(q, window, ws, **kw) == "sm90"
    out, lse = dsv4_attn.dsv4_attention_paged(q, window, ws, **kw)
    torch.cuda.synchronize()
    assert not out.isnan().any() and not lse.isnan().any()
print("sanitize_kv_cache: dsv4_attention_paged sm90 path ran, outputs free of NaN")
