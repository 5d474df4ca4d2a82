"""Same-call A/B of the indexer top-k's two forms on dsv4_indexer_topk_paged decode steps
(each one of 20 in a CUDA graph, bench_dsv4's timing): the plan's choice, then
DSV4_INDEXER_TOPK=warp and =cta, then the plan again; the picks of every form must agree.

    PYTHONPATH=$PWD/src python3 benchmarks/ab/ab_indexer_topk_form.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench_dsv4  # noqa: E402
import dsv4_attn  # noqa: E402


def main():
    device = torch.device("cuda")
    kw = dict(topk=512, compress_ratio=4)
    for b, context in ((64, 8192), (8, 8192), (64, 4096), (256, 8192)):
        args = bench_dsv4.indexer_paged_inputs(b, context // 4, device)
        times, picks = [], set()
        for form in ("plan", "warp", "cta", "plan"):
            os.environ.pop("DSV4_INDEXER_TOPK", None)
            if form != "plan":
                os.environ["DSV4_INDEXER_TOPK"] = form
            chosen = dsv4_attn.launch_plan("dsv4_indexer_topk_paged", *args, **kw).split()[-1]
            ms = bench_dsv4.graph_step_ms(lambda: dsv4_attn.dsv4_indexer_topk_paged(*args, **kw))
            picks.add(dsv4_attn.dsv4_indexer_topk_paged(*args, **kw).cpu().numpy().tobytes())
            times.append(f"{form} {ms * 1000:.1f} us ({chosen})")
        os.environ.pop("DSV4_INDEXER_TOPK", None)
        print(f"paged decode B = {b}, {context // 1024}k context: " + ", ".join(times) +
              ("; the same picks" if len(picks) == 1 else "; PICKS DIFFER"))


if __name__ == "__main__":
    main()
