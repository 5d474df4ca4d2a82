"""A small causal GQA fmha call on the sm90 path, for compute-sanitizer memcheck/racecheck.

160 work tiles (5 query tiles x 8 heads x 4 batches) exceed the SM count, so persistent CTAs
reuse their Q buffer and K/V ring across work tiles."""
import os

import torch

import dsv4_attn

torch.manual_seed(0)
q = torch.randn(4, 520, 8, 128, device="cuda", dtype=torch.bfloat16)
k = torch.randn(4, 600, 2, 128, device="cuda", dtype=torch.bfloat16)
v = torch.randn(4, 600, 2, 128, device="cuda", dtype=torch.bfloat16)
sinks = torch.randn(8, device="cuda")
path = dsv4_attn.fmha_path(q, k, v, causal=True, window_left=127, sinks=sinks)
assert path == "sm90", f"expected the sm90 path, got {path}"
out, lse = dsv4_attn.fmha(q, k, v, causal=True, window_left=127, sinks=sinks, return_lse=True)
torch.cuda.synchronize()
assert torch.isfinite(out).all() and torch.isfinite(lse).all()
print("sanitize_fmha: sm90 path ran, outputs finite")

# head_dim 512, k is v (csrc/sm90/mqa512): 4 tokens x 16 heads per tile with a window, and a
# two-token decode with 128 heads (two head blocks per token).
for b, sq, sk, hq, window in ((2, 70, 200, 16, 63), (1, 2, 300, 128, -1)):
    q = torch.randn(b, sq, hq, 512, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(b, sk, 1, 512, device="cuda", dtype=torch.bfloat16)
    sinks = torch.randn(hq, device="cuda")
    path = dsv4_attn.fmha_path(q, kv, kv, causal=True, window_left=window, sinks=sinks)
    assert path == "sm90", f"expected the sm90 path at head_dim 512, got {path}"
    out, lse = dsv4_attn.fmha(q, kv, kv, causal=True, window_left=window, sinks=sinks,
                              return_lse=True)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
print("sanitize_fmha: head_dim 512 sm90 path ran, outputs finite")

# dsv4_attention on the same kernel (persistent grid: 300 work tiles over 132 CTAs, so Q and
# the ring carry across work tiles): a window and the closed rows of an HCA compressed KV.
q = torch.randn(1, 300, 64, 512, device="cuda", dtype=torch.bfloat16)
kv = torch.randn(1, 400, 512, device="cuda", dtype=torch.bfloat16)
comp = torch.randn(1, 100, 512, device="cuda", dtype=torch.bfloat16)
kw = dict(sinks=torch.randn(64, device="cuda"), compressed_kv=comp, compress_ratio=4)
assert dsv4_attn.dsv4_attention_path(q, kv, **kw) == "sm90"
out, lse = dsv4_attn.dsv4_attention(q, kv, return_lse=True, **kw)
torch.cuda.synchronize()
assert torch.isfinite(out).all() and torch.isfinite(lse).all()
print("sanitize_fmha: dsv4_attention sm90 path ran, outputs finite")

# CSA: gathered rows (cp.async) with -1 padding, not-yet-closed and repeated indices.
topk = torch.randint(-1, 110, (1, 300, 96), device="cuda", dtype=torch.int32)
kw["topk_indices"] = topk
assert dsv4_attn.dsv4_attention_path(q, kv, **kw) == "sm90"
out, lse = dsv4_attn.dsv4_attention(q, kv, return_lse=True, **kw)
torch.cuda.synchronize()
assert torch.isfinite(out).all() and torch.isfinite(lse).all()
print("sanitize_fmha: dsv4_attention CSA sm90 path ran, outputs finite")

# CSA at 8 heads, a third of the lists padded with -1 as an indexer pads them, in both forms:
# the narrow one (one token's heads a work tile, the key tiles round a ring of three stages)
# and 64-row tiles (8 tokens a work tile, each token's list in turn).
q8 = torch.randn(1, 300, 8, 512, device="cuda", dtype=torch.bfloat16)
topk = torch.randint(0, 110, (1, 300, 96), device="cuda", dtype=torch.int32)
topk[:, ::3, 40:] = -1
kw["sinks"] = torch.randn(8, device="cuda")
kw["topk_indices"] = topk
for narrow in ("1", "0"):
    os.environ["DSV4_MQA512_NARROW"] = narrow
    plan = dsv4_attn.launch_plan("dsv4_attention", q8, kv, **kw)
    assert plan.endswith(" narrow=16") == (narrow == "1"), plan
    out, lse = dsv4_attn.dsv4_attention(q8, kv, return_lse=True, **kw)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    print(f"sanitize_fmha: dsv4_attention CSA at 8 heads ({plan}) ran, outputs finite")
del os.environ["DSV4_MQA512_NARROW"]

# Tensor-parallel head counts on 64-row tiles of several tokens, each token's rows in turn:
# CSA at 16 and 32 heads (4 and 2 tokens a tile), HCA at 8 and 32 heads (8 and 2). CSA at 32
# heads splits in two, merged in a cluster. racecheck flags a peer CTA's distributed-shared-
# memory stores into bytes a cp.async wrote under any barrier, even a whole-cluster one
# (benchmarks/profile/racecheck/cluster_handoff.cu, modes cp_async_*), so under racecheck that
# call takes the combine (DSV4_SANITIZER_TOOL, set by scripts/gpu_check.sh) and memcheck keeps
# the cluster merge.
RACECHECK = os.environ.get("DSV4_SANITIZER_TOOL") == "racecheck"
os.environ["DSV4_MQA512_NARROW"] = "0"
for hq, layer in ((16, "CSA"), (32, "CSA"), (8, "HCA"), (32, "HCA")):
    qh = torch.randn(1, 100, hq, 512, device="cuda", dtype=torch.bfloat16)
    kwh = dict(sinks=torch.randn(hq, device="cuda"), compressed_kv=comp, compress_ratio=4)
    if layer == "CSA":
        kwh["topk_indices"] = topk[:, :100]
    if RACECHECK and layer == "CSA":
        os.environ["DSV4_MQA512_SPLIT_MERGE"] = "combine"
    else:
        os.environ.pop("DSV4_MQA512_SPLIT_MERGE", None)
    plan = dsv4_attn.launch_plan("dsv4_attention", qh, kv, **kwh)
    assert f"tile={64 // hq}x{hq} " in plan, plan
    if (layer, hq) == ("CSA", 32):
        assert f"merge={'combine' if RACECHECK else 'cluster'}" in plan, plan
    out, lse = dsv4_attn.dsv4_attention(qh, kv, return_lse=True, **kwh)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    print(f"sanitize_fmha: dsv4_attention {layer} at {hq} heads ({plan}) ran, outputs finite")
del os.environ["DSV4_MQA512_NARROW"]
os.environ.pop("DSV4_MQA512_SPLIT_MERGE", None)

# Split-KV decode: 2 work tiles over 132 SMs, so each key range is cut and combined.
q = torch.randn(1, 1, 128, 512, device="cuda", dtype=torch.bfloat16)
kv = torch.randn(1, 1500, 1, 512, device="cuda", dtype=torch.bfloat16)
out, lse = dsv4_attn.fmha(q, kv, kv, causal=True, sinks=torch.randn(128, device="cuda"),
                          return_lse=True)
torch.cuda.synchronize()
assert torch.isfinite(out).all() and torch.isfinite(lse).all()
print("sanitize_fmha: head_dim 512 split-KV decode ran, outputs finite")

# Varlen: the device-built schedule, sequences of 0 to 300 tokens (boundary tiles load the next
# sequence's rows, and the last one's past the end), at D = 128 and at D = 512 (k is v).
lens = [0, 1, 65, 300, 7]
cu = torch.tensor([0] + lens, device="cuda").cumsum(0).to(torch.int32)
for d, hq, hkv in ((128, 8, 2), (512, 64, 1)):
    q = torch.randn(sum(lens), hq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(sum(lens), hkv, d, device="cuda", dtype=torch.bfloat16)
    v = k if d == 512 else torch.randn_like(k)
    kw = dict(causal=True, sinks=torch.randn(hq, device="cuda"), cu_seqlens_q=cu, cu_seqlens_k=cu)
    assert dsv4_attn.fmha_path(q, k, v, **kw) == "sm90", f"varlen D = {d}: not the sm90 path"
    out, lse = dsv4_attn.fmha(q, k, v, max_seqlen_q=300, max_seqlen_k=300, return_lse=True, **kw)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
print("sanitize_fmha: varlen sm90 paths ran, outputs finite")

# Varlen dsv4_attention: HCA (TMA rows at each sequence's compressed offset) and CSA (gathered
# rows, local indices with -1 padding and out-of-range values).
lens_q, lens_kv = [3, 0, 70, 1], [200, 5, 70, 900]
lens_c = [n // 4 for n in lens_kv]
cu = lambda lens: torch.tensor([0] + lens, device="cuda").cumsum(0).to(torch.int32)  # noqa: E731
q = torch.randn(sum(lens_q), 64, 512, device="cuda", dtype=torch.bfloat16)
kv = torch.randn(sum(lens_kv), 512, device="cuda", dtype=torch.bfloat16)
comp = torch.randn(sum(lens_c), 512, device="cuda", dtype=torch.bfloat16)
kw = dict(sinks=torch.randn(64, device="cuda"), compressed_kv=comp, compress_ratio=4,
          cu_seqlens_q=cu(lens_q), cu_seqlens_kv=cu(lens_kv), cu_seqlens_compressed=cu(lens_c),
          max_seqlen_q=70, max_seqlen_kv=900)
for topk in (None, torch.randint(-1, 240, (sum(lens_q), 80), device="cuda", dtype=torch.int32)):
    if topk is not None:
        kw["topk_indices"] = topk
    assert dsv4_attn.dsv4_attention_path(q, kv, **kw) == "sm90"
    out, lse = dsv4_attn.dsv4_attention(q, kv, return_lse=True, **kw)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
print("sanitize_fmha: varlen dsv4_attention (HCA, CSA) sm90 path ran, outputs finite")

# Split-KV at D <= 256: a GQA decode step of one sequence, packed (8 work tiles, each the 4
# query heads of one KV head, split over the SMs).
q = torch.randn(1, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
k = torch.randn(1, 3000, 8, 128, device="cuda", dtype=torch.bfloat16)
v = torch.randn_like(k)
out, lse = dsv4_attn.fmha(q, k, v, causal=True, sinks=torch.randn(32, device="cuda"),
                          return_lse=True)
torch.cuda.synchronize()
assert torch.isfinite(out).all() and torch.isfinite(lse).all()
print("sanitize_fmha: D = 128 split-KV decode ran, outputs finite")

# Packed GQA with several tokens per tile at D = 64 (24 tokens x 8 heads in 192 rows), causal
# with a window, rows past Sq in the last tile.
q = torch.randn(2, 37, 16, 64, device="cuda", dtype=torch.bfloat16)
k = torch.randn(2, 500, 2, 64, device="cuda", dtype=torch.bfloat16)
v = torch.randn_like(k)
out, lse = dsv4_attn.fmha(q, k, v, causal=True, window_left=100, return_lse=True)
torch.cuda.synchronize()
assert torch.isfinite(out).all() and torch.isfinite(lse).all()
print("sanitize_fmha: D = 64 packed GQA ran, outputs finite")

# The dynamic grid (causal) with work tiles that see no key: rows 0..799 precede the first
# key, so 4 of each head's 5 query tiles publish an index without a Q load.
q = torch.randn(2, 900, 16, 64, device="cuda", dtype=torch.bfloat16)
k = torch.randn(2, 100, 16, 64, device="cuda", dtype=torch.bfloat16)
v = torch.randn_like(k)
out, lse = dsv4_attn.fmha(q, k, v, causal=True, return_lse=True)
torch.cuda.synchronize()
assert torch.isfinite(out).all() and torch.isfinite(lse[:, :, 800:]).all()
assert (lse[:, :, :800] == -float("inf")).all()
print("sanitize_fmha: D = 64 dynamic grid with empty work tiles ran")

# The fused merge_attn_states: 16-byte chunks (dense bf16) and single elements (Dv = 12, fp32
# varlen layout), with -inf on one side.
for shape, lse_shape, dtype in (((2, 70, 8, 128), (2, 8, 70), torch.bfloat16),
                                ((90, 4, 12), (4, 90), torch.float32)):
    a, b = torch.randn(shape, device="cuda", dtype=dtype), torch.randn(shape, device="cuda", dtype=dtype)
    la, lb = torch.randn(lse_shape, device="cuda"), torch.randn(lse_shape, device="cuda")
    la[..., :5] = -float("inf")
    out, lse = dsv4_attn.merge_attn_states(a, la, b, lb)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
print("sanitize_fmha: fused merge_attn_states ran, outputs finite")
