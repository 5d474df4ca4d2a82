"""Same-call A/B of dsv4_attention_paged's decode-step modes on one build: how two splits meet
(DSV4_MQA512_SPLIT_MERGE=combine|cluster) and who converts the FP8 blocks
(DSV4_MQA512_PAGED_CONVERT=producer|consumer), each step one of 20 in a CUDA graph
(bench_dsv4.py's inputs and timing), the modes in turn, `--passes` times; FlashMLA's sparse FP8
decode on the same pages beside them when DSV4_PEER_FLASHMLA names its library (heads padded
to 64, its plan reused). Each row also prints the largest out and lse differences between the
combine and the cluster, and the plan the default (no override) takes.

    # on the GPU machine, after the build (source .peers/mla/env.sh for FlashMLA):
    python3 benchmarks/ab/ab_paged_modes.py [--rows "CSA-512 64 64; HCA 8 64"] [--passes 2]

A row is "layer B Hq" with layer CSA-512, CSA-1024, HCA or sliding (bench_dsv4.py's
PAGED_DECODE rows). A tool for choosing between plans, not a test.
"""
import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import bench_dsv4 as bd  # noqa: E402
import dsv4_attn  # noqa: E402

DEFAULT_ROWS = ("CSA-512 64 64; CSA-1024 64 64; HCA 64 64; sliding 64 64; CSA-512 64 32; "
                "HCA 64 32; CSA-512 64 16; HCA 64 16; CSA-512 64 8; HCA 64 8; CSA-512 8 64; "
                "HCA 8 64")
MODES = {  # name: (DSV4_MQA512_SPLIT_MERGE, DSV4_MQA512_PAGED_CONVERT); None: planned
    "planned": (None, None),
    "combine": ("combine", "producer"),
    "cluster": ("cluster", "producer"),
    "cluster+consumers": ("cluster", "consumer"),
}


def set_mode(mode):
    for var, value in zip(("DSV4_MQA512_SPLIT_MERGE", "DSV4_MQA512_PAGED_CONVERT"), MODES[mode]):
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default=DEFAULT_ROWS)
    ap.add_argument("--passes", type=int, default=2)
    args = ap.parse_args()
    decode = None
    if bd.load_flashmla() is not None:
        decode = getattr(torch.ops._flashmla_C, "sparse_decode_fwd", None)
    print("graphed decode steps, us per step (one per pass); 32k context, with sinks")
    for spec in args.rows.split(";"):
        kind, b, hq = spec.split()
        b, hq = int(b), int(hq)
        q, window, ws, kw = bd.paged_decode_inputs(kind, b, hq, 32768, "cuda")
        out = torch.empty_like(q)
        times = {m: [] for m in MODES}
        results = {}
        for _ in range(args.passes):
            for mode in MODES:
                set_mode(mode)
                step = lambda: dsv4_attn.dsv4_attention_paged(q, window, ws, out=out, **kw)  # noqa: E731
                times[mode].append(bd.graph_step_ms(step) * 1000)
                results[mode] = dsv4_attn.dsv4_attention_paged(q, window, ws, **kw)
        set_mode("planned")
        plan = dsv4_attn.launch_plan("dsv4_attention_paged", q, window, ws, out=out, **kw)
        d_out = (results["combine"][0].float() - results["cluster"][0].float()).abs().max().item()
        d_lse = (results["combine"][1] - results["cluster"][1]).abs().max().item()
        peer = "n/a"
        if decode is not None:
            call, _ = bd.paged_decode_peer_call(decode, q, window, ws, kw, max(hq, 64))
            peer = f"{bd.graph_step_ms(call) * 1000:.1f}"
        cols = " | ".join(f"{m} " + " ".join(f"{t:.1f}" for t in times[m]) for m in MODES)
        print(f"{kind} B={b} Hq={hq} | {cols} | FlashMLA {peer} | combine vs cluster: out "
              f"{d_out:.1e} lse {d_lse:.1e} | planned: {plan}", flush=True)


if __name__ == "__main__":
    main()
