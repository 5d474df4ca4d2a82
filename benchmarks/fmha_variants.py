"""Time fmha variants against cuDNN in one process: the sweep behind benchmarks/NOTES.md.

    python benchmarks/fmha_variants.py 64,128,256 LABEL
    DSV4_FMHA_GRID=per_tile python benchmarks/fmha_variants.py 128 per_tile

Each point is the median of 30 event-timed calls after 5 warm-ups; bf16, B*S = 16k tokens,
Hq = 2048 / D, S in {1k, 4k, 16k}, causal and not. Prints one line per point with the path
the op took. A benchmark for comparing builds and launch policies, not a test.
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import dsv4_attn


def median_ms(fn, reps=30, warmup=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def main():
    dims = [int(x) for x in sys.argv[1].split(",")] if len(sys.argv) > 1 else [64, 128, 256]
    label = sys.argv[2] if len(sys.argv) > 2 else ""
    for d in dims:
        for causal in (False, True):
            for s in (1024, 4096, 16384):
                b, h = 16384 // s, 2048 // d
                q, k, v = [torch.randn(b, s, h, d, device="cuda").bfloat16() for _ in range(3)]
                flops = 4 * b * h * s * s * d / (2 if causal else 1)
                path = dsv4_attn.fmha_path(q, k, v, causal=causal)
                ours = median_ms(lambda: dsv4_attn.fmha(q, k, v, causal=causal))
                qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    cudnn = median_ms(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal))
                print(f"{label} D={d} S={s} causal={causal} path={path}: dsv4 {flops / ours / 1e9:.0f}"
                      f"  cudnn {flops / cudnn / 1e9:.0f}  ratio {cudnn / ours:.2f}", flush=True)


if __name__ == "__main__":
    main()
