"""Small calls of the paged FP8 KV cache kernels for compute-sanitizer (scripts/gpu_check.sh):
inserts into pages of 64 and of 2 rows with -1 and out-of-range slots, int32 and int64 slots,
and gathers of the same slots as bf16 and fp16."""
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
