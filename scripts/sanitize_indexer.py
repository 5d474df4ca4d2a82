"""Small calls of the lightning indexer's kernels for compute-sanitizer (scripts/gpu_check.sh):
64 heads over two key splits with a full radix select, 8 heads (64 queries per block, a
partial last block), 128 heads (one query per consumer), row scales and a negative scale,
float8_e4m3 q and k with row scales (the serving mode), int32 positions in any order, two
queries of up to 9000 rows (the CTA top-k, where a row is longer than 2048; also with every
score tied); the warp top-k (DSV4_INDEXER_TOPK=warp: calls this small plan a CTA a query) on
rows of up to 2048 and of a few hundred; then the paged form over a shuffled 64-row-block FP8
cache (two tokens a request, one request empty).
(The chunked calls are too large for racecheck; tests cover them.)"""
import os

import torch

import dsv4_attn

torch.manual_seed(0)
calls = [  # (B, Sq, Sc, H, topk, dtype, extra)
    (1, 40, 2100, 64, 512, torch.bfloat16, {}),
    (1, 40, 2048, 64, 512, torch.bfloat16, {"form": "warp"}),  # the warp top-k's longest rows
    (1, 70, 300, 8, 64, torch.float16, {"scale": -0.5, "form": "warp"}),
    (1, 70, 300, 8, 64, torch.float16, {"scale": -0.5}),
    (2, 5, 90, 128, 16, torch.bfloat16, {"k_scale": True}),
    (1, 40, 2100, 64, 512, torch.float8_e4m3fn, {"k_scale": True}),
    (1, 2, 9000, 64, 512, torch.bfloat16, {}),
    (1, 2, 9000, 64, 512, torch.bfloat16, {"zero_w": True}),  # every score ties
]
for b, sq, sc, h, topk, dtype, extra in calls:
    q = torch.randn(b, sq, h, 128, device="cuda").to(dtype)  # fp8: rounded, in range
    k = torch.randn(b, sc, 128, device="cuda").to(dtype)
    w = torch.randn(b, sq, h, device="cuda") * (0 if extra.get("zero_w") else 1)
    pos = (torch.randperm(4 * sc, device="cuda")[:sq].int())[None].repeat(b, 1)
    kw = dict(topk=topk, compress_ratio=4)
    if extra.get("k_scale"):
        kw["k_scale"] = torch.rand(b, sc, device="cuda")
    if "scale" in extra:
        kw["scale"] = extra["scale"]
    os.environ.pop("DSV4_INDEXER_TOPK", None)
    if "form" in extra:
        os.environ["DSV4_INDEXER_TOPK"] = extra["form"]
        plan = dsv4_attn.launch_plan("dsv4_indexer_topk", q, k, w, pos, **kw)
        assert plan.endswith(" topk=" + extra["form"]), plan
    assert dsv4_attn.dsv4_indexer_topk_path(q, k, w, pos, **kw) == "sm90"
    out = dsv4_attn.dsv4_indexer_topk(q, k, w, pos, **kw)
    torch.cuda.synchronize()
    closed = torch.clamp((pos.long() + 1) // 4, max=sc)
    want_listed = torch.clamp(closed, max=topk)
    assert torch.equal((out >= 0).sum(-1), want_listed), "listed rows != min(topk, closed rows)"
os.environ.pop("DSV4_INDEXER_TOPK", None)
lens = torch.tensor([700, 0, 130], dtype=torch.int32, device="cuda")
pages = 12
cache = torch.randint(0, 120, (3 * pages, 64 * 132), dtype=torch.uint8, device="cuda")
cache[:, 64 * 128:] = torch.rand(3 * pages, 64, device="cuda").view(torch.uint8).view(-1, 256)
cache = cache.view(3 * pages, 64, 1, 132)
table = torch.randperm(3 * pages, device="cuda").int().view(3, pages)
q = torch.randn(3, 2, 64, 128, device="cuda").to(torch.float8_e4m3fn)
w = torch.randn(3, 2, 64, device="cuda")
pos = 4 * lens[:, None].long() - torch.tensor([[1, 9]], device="cuda")
kw = dict(topk=256, compress_ratio=4)
assert dsv4_attn.dsv4_indexer_topk_paged_path(q, cache, w, pos, table, lens, **kw) == "sm90"
out = dsv4_attn.dsv4_indexer_topk_paged(q, cache, w, pos, table, lens, **kw)
torch.cuda.synchronize()
closed = torch.minimum(torch.clamp((pos + 1) // 4, min=0), lens[:, None].long())
assert torch.equal((out >= 0).sum(-1), torch.clamp(closed, max=256)), "paged: listed rows"
print("sanitize_indexer: score (dense and paged) and top-k kernels ran, every query lists "
      "min(topk, closed) rows")
