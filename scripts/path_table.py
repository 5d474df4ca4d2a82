"""The README's path table, rendered from the ops' own launch plans.

    python3 scripts/path_table.py           # print the table
    python3 scripts/path_table.py --write   # replace it in README.md (between the path-table markers)

Each row is one representative call: the op, what the call is, and what `dsv4_attn.launch_plan`
answers for it on an sm_90 GPU of 132 SMs (an H100), planned with DSV4_PLAN_ASSUME_SM90 so that
no GPU is needed. tests/test_path_table.py checks that README.md holds exactly this table. The
tensors are uninitialised CPU tensors: planning reads shapes, strides and alignment only.
"""
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMS = 132
BEGIN, END = "<!-- path-table begin -->", "<!-- path-table end -->"
bf16, f16, f32 = torch.bfloat16, torch.float16, torch.float32


def t(*shape, dtype=bf16):
    return torch.empty(shape, dtype=dtype)


def cu(*lens):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)


def fmha(q, k, v, **kw):
    return "fmha", (q, k, v), kw


def dsv4(q, kv, **kw):
    return "dsv4_attention", (q, kv), kw


def cases():
    """(description, (op, args, kwargs)) for each row, in the table's order."""
    kv512 = t(1, 8192, 1, 512)
    yield "bf16, D = 128, B = 2, S = 4096, 16 heads, full rows", fmha(
        t(2, 4096, 16, 128), t(2, 4096, 16, 128), t(2, 4096, 16, 128))
    yield "bf16, D = 128, causal", fmha(
        t(2, 4096, 16, 128), t(2, 4096, 16, 128), t(2, 4096, 16, 128), causal=True)
    yield "fp16, D = 64, varlen, causal", fmha(
        t(6000, 8, 64, dtype=f16), t(6000, 8, 64, dtype=f16), t(6000, 8, 64, dtype=f16),
        causal=True, cu_seqlens_q=cu(1000, 5000), cu_seqlens_k=cu(1000, 5000))
    yield "bf16, D = 256, 127-key window", fmha(
        t(1, 4096, 8, 256), t(1, 4096, 8, 256), t(1, 4096, 8, 256), causal=True,
        window_left=127)
    yield "decode: D = 128, one token, 8k keys, 32 query heads over 8 KV heads", fmha(
        t(1, 1, 32, 128), t(1, 8192, 8, 128), t(1, 8192, 8, 128))
    yield "D = 512, k and v one tensor, 64 heads over one KV head, causal", fmha(
        t(1, 8192, 64, 512), kv512, kv512, causal=True)
    yield "D = 512, k and v two tensors", fmha(t(1, 8192, 64, 512), kv512, t(1, 8192, 1, 512))
    yield "D = 96", fmha(t(1, 128, 4, 96), t(1, 128, 4, 96), t(1, 128, 4, 96))
    yield "q's base not 16-byte aligned", fmha(
        t(1 * 128 * 4 * 128 + 1)[1:].view(1, 128, 4, 128), t(1, 128, 4, 128), t(1, 128, 4, 128))

    s, hq = 8192, 64
    q, kv = t(1, s, hq, 512), t(1, s, 512)
    comp4, comp128 = t(1, s // 4, 512), t(1, s // 128, 512)
    topk = torch.empty(1, s, 512, dtype=torch.int32)
    yield "sliding window only, 64 heads, S = 8192", dsv4(q, kv)
    yield "CSA: window + top-512 of a 4x compressed KV, 64 heads", dsv4(
        q, kv, compressed_kv=comp4, compress_ratio=4, topk_indices=topk)
    yield "HCA: window + every closed row of a 128x compressed KV, 128 heads", dsv4(
        t(1, s, 128, 512), kv, compressed_kv=comp128, compress_ratio=128)
    yield "HCA, 16 heads (tensor parallel)", dsv4(
        t(1, s, 16, 512), kv, compressed_kv=comp128, compress_ratio=128)
    yield "CSA, 16 heads (tensor parallel): the narrow form", dsv4(
        t(1, s, 16, 512), kv, compressed_kv=comp4, compress_ratio=4, topk_indices=topk)
    yield "CSA, 32 heads (tensor parallel)", dsv4(
        t(1, s, 32, 512), kv, compressed_kv=comp4, compress_ratio=4, topk_indices=topk)
    yield "CSA, one head, S = 8192", dsv4(
        t(1, s, 1, 512), kv, compressed_kv=comp4, compress_ratio=4, topk_indices=topk)
    yield "CSA, one head, decode: B = 4, one token, 32k context", dsv4(
        t(4, 1, 1, 512), t(4, 32768, 512), compressed_kv=t(4, 8192, 512), compress_ratio=4,
        topk_indices=torch.empty(4, 1, 512, dtype=torch.int32))
    yield "decode: B = 64, one token, 32k context, HCA, 64 heads", dsv4(
        t(64, 1, 64, 512), t(64, 32768, 512), compressed_kv=t(64, 256, 512), compress_ratio=128)
    yield "fp32", dsv4(t(1, 256, 64, 512, dtype=f32), t(1, 256, 512, dtype=f32))

    out, lse = t(2, 4096, 16, 128), torch.empty(2, 16, 4096)
    yield "bf16, D = 128", ("merge_attn_states", (out, lse, out, lse), {})
    odd = t(2 * 4096 * 16 * 128 + 1)[1:].view(2, 4096, 16, 128)
    yield "out_a's base not 16-byte aligned", ("merge_attn_states", (odd, lse, out, lse), {})

    yield "indexer: S = 8192, 64 heads x 128, top-512 of 2048 rows", (
        "dsv4_indexer_topk", (t(1, 8192, 64, 128), t(1, 2048, 128), torch.empty(1, 8192, 64),
                              torch.empty(1, 8192, dtype=torch.long)),
        {"topk": 512, "compress_ratio": 4})
    fp8 = torch.float8_e4m3fn
    yield "indexer: varlen FP8, 4 sequences of 2048 queries and 512 rows, max_seqlen given", (
        "dsv4_indexer_topk", (t(8192, 64, 128, dtype=fp8), t(2048, 128, dtype=fp8),
                              torch.empty(8192, 64), torch.empty(8192, dtype=torch.long)),
        {"topk": 512, "compress_ratio": 4, "k_scale": torch.ones(2048),
         "cu_seqlens_q": cu(2048, 2048, 2048, 2048), "cu_seqlens_k": cu(512, 512, 512, 512),
         "max_seqlen_q": 2048, "max_seqlen_k": 512})
    indexer_cache = torch.empty(1024 * 64 * 132, dtype=torch.uint8).view(1024, 64, 1, 132)
    yield "indexer: paged FP8 decode, B = 64, 64k context (256 blocks of 64 rows each)", (
        "dsv4_indexer_topk_paged", (t(64, 1, 64, 128, dtype=fp8), indexer_cache,
                                    torch.empty(64, 1, 64), torch.empty(64, 1, dtype=torch.long),
                                    torch.zeros(64, 256, dtype=torch.int32),
                                    torch.zeros(64, dtype=torch.int32)),
        {"topk": 512, "compress_ratio": 4})
    pool = torch.empty(1024, 32, 128, 128)
    yield "decode: B = 64, T = 1, (H, HV) = (16, 32), fp32 pool of 1024", (
        "gated_delta_rule_decode", (t(64, 1, 16, 128), t(64, 1, 16, 128), t(64, 1, 32, 128),
                                    torch.empty(64, 1, 32), torch.empty(64, 1, 32), pool),
        {"state_indices": torch.arange(64)})

    stride = (64 * 584 + 575) // 576 * 576
    cache = torch.empty(stride * 1024, dtype=torch.uint8).as_strided((1024, 64, 1, 584),
                                                                      (stride, 584, 584, 1))
    slots = torch.arange(65536)
    yield "64k bf16 rows into 1024 pages of 64", ("kv_cache_insert_fp8",
                                                  (t(65536, 512), cache, slots), {})
    yield "64k rows as bf16", ("kv_cache_gather_fp8", (cache, slots, torch.bfloat16), {})
    yield "64k rows as fp32", ("kv_cache_gather_fp8", (cache, slots, torch.float32), {})
    for heads in (16, 64, 128):
        yield f"decode: B = 64, {heads} heads, window 128 + top-512 from FP8 pages", (
            "dsv4_attention_paged",
            (t(64, heads, 512), cache, torch.empty(64, 128, dtype=torch.int32)),
            {"compressed_cache": cache, "compressed_slots": torch.empty(64, 512, dtype=torch.int32),
             "out": t(64, heads, 512)})

    def gdr(b, n, h, hv, **kw):
        return ("chunk_gated_delta_rule",
                (t(b, n, h, 128), t(b, n, h, 128), t(b, n, hv, 128), torch.empty(b, n, hv),
                 torch.empty(b, n, hv)), kw)
    yield "(B, T, H, HV) = (1, 32768, 16, 32)", gdr(1, 32768, 16, 32)
    yield "(8, 4096, 32, 32)", gdr(8, 4096, 32, 32)
    yield "varlen, 3 sequences", gdr(1, 5000, 16, 32, cu_seqlens=cu(100, 900, 4000))
    yield "(1, 65536, 2, 8)", ("chunk_simple_gla", (t(1, 65536, 2, 128), t(1, 65536, 2, 128),
                                                    t(1, 65536, 8, 128), torch.empty(1, 65536, 8)), {})
    yield "K = V = 64", ("chunk_gated_delta_rule",
                         (t(1, 256, 4, 64), t(1, 256, 4, 64), t(1, 256, 4, 64),
                          torch.empty(1, 256, 4), torch.empty(1, 256, 4)), {})


def render():
    import dsv4_attn

    os.environ["DSV4_PLAN_ASSUME_SM90"] = str(SMS)
    try:
        rows = [f"| op | call | what runs on an H100 ({SMS} SMs) |", "|---|---|---|"]
        for what, (op, args, kwargs) in cases():
            plan = dsv4_attn.launch_plan(op, *args, **kwargs)
            if plan.startswith("sm90 "):
                shown = f"**sm90** `{plan[5:]}`"
            else:
                shown = plan
            rows.append(f"| {op} | {what} | {shown} |")
    finally:
        del os.environ["DSV4_PLAN_ASSUME_SM90"]
    return "\n".join(rows) + "\n"


def readme_table(text):
    """The table between the markers of README.md's text."""
    a, b = text.index(BEGIN) + len(BEGIN) + 1, text.index(END)
    return text[a:b]


def main():
    table = render()
    if "--write" not in sys.argv:
        sys.stdout.write(table)
        return
    path = os.path.join(ROOT, "README.md")
    text = open(path).read()
    a, b = text.index(BEGIN) + len(BEGIN) + 1, text.index(END)
    open(path, "w").write(text[:a] + table + text[b:])
    print(f"path table written to {path}")


if __name__ == "__main__":
    main()
