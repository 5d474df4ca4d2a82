"""Timing and ceiling helpers shared by the benchmarks (bench_fmha.py, and later GLA).

Everything here measures on the device of the current run: a kernel's TFLOP/s is only
meaningful beside the GEMM rate and copy bandwidth measured in the same process, because
clocks, power caps and MIG slices differ from machine to machine.
"""
import csv
import datetime
import os
import statistics
import sys
from typing import Callable, List, Optional, Sequence

import torch

# ----------------------------------------------------------------------------- setup


def require_cuda(prog: str) -> torch.device:
    """The current CUDA device, or exit with a one-line reason (benchmarks need a GPU)."""
    if not torch.cuda.is_available():
        cuda = torch.version.cuda or "none (CPU-only build)"
        sys.exit(f"{prog}: needs a CUDA device, and torch.cuda.is_available() is False "
                 f"(torch {torch.__version__}, CUDA {cuda}). Run it on a GPU machine.")
    return torch.device("cuda", torch.cuda.current_device())


def parse_dtype(name: str) -> torch.dtype:
    names = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
             "fp16": torch.float16, "float16": torch.float16, "half": torch.float16}
    if name not in names:
        raise ValueError(f"unknown dtype {name!r}; choose one of {sorted(names)}")
    return names[name]


def dtype_name(dtype: torch.dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}.get(
        dtype, str(dtype).replace("torch.", ""))


def randn(shape: Sequence[int], dtype: torch.dtype, device, scale: float = 1.0) -> torch.Tensor:
    """Random normal inputs (never zeros: a kernel that skips work must not look right)."""
    t = torch.randn(*shape, dtype=torch.float32, device=device)
    if scale != 1.0:
        t.mul_(scale)
    return t.to(dtype)


# ----------------------------------------------------------------------------- timing


def bench_ms(fn: Callable[[], object], *, warmup: int = 3, rep: int = 20,
             budget_ms: Optional[float] = 200.0, cuda_graph: bool = False) -> float:
    """Median wall time of one ``fn()`` call on the current stream, in milliseconds.

    Runs ``warmup`` calls, estimates one call's time, then times each of up to ``rep`` calls
    between its own pair of CUDA events (at least 3 calls; fewer than ``rep`` when
    ``rep`` calls would exceed ``budget_ms``, so one slow fallback cannot stall a sweep).
    With ``cuda_graph`` the call is captured once into a CUDA graph and the replays are
    timed, which removes host launch overhead for small kernels; ``fn`` must then be
    capturable (no host syncs, no allocations that depend on data).
    """
    for _ in range(max(1, warmup)):
        fn()
    torch.cuda.synchronize()

    call = fn
    if cuda_graph:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        graph.replay()
        torch.cuda.synchronize()
        call = graph.replay

    # One timed call to size the loop.
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    call()
    end.record()
    end.synchronize()
    estimate = max(start.elapsed_time(end), 1e-3)
    n = rep
    if budget_ms is not None:
        n = min(rep, int(budget_ms / estimate))
    n = max(3, n)

    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for s, e in zip(starts, ends):
        s.record()
        call()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


# ----------------------------------------------------------------------------- ceilings


def gemm_tflops(device, dtype: torch.dtype = torch.bfloat16, n: int = 8192) -> float:
    """Dense GEMM rate of this device in this run: median of n^3 torch.matmul, in TFLOP/s."""
    a = randn((n, n), dtype, device)
    b = randn((n, n), dtype, device)
    c = torch.empty((n, n), dtype=dtype, device=device)
    ms = bench_ms(lambda: torch.matmul(a, b, out=c), warmup=5, rep=30, budget_ms=500.0)
    del a, b, c
    return 2.0 * n ** 3 / (ms * 1e-3) / 1e12


def copy_bandwidth(device, nbytes: int = 2 << 30) -> float:
    """Device-to-device copy rate in GB/s (1e9 B/s), counting bytes read plus bytes written.

    Uses ``nbytes`` per buffer (2 GiB by default), halved until two buffers fit in free memory.
    """
    free, _ = torch.cuda.mem_get_info(device)
    while nbytes > (64 << 20) and 2 * nbytes > 0.8 * free:
        nbytes //= 2
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    src.random_()  # not zeros, so no path can shortcut the copy
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src), warmup=3, rep=20, budget_ms=500.0)
    del src, dst
    return 2.0 * nbytes / (ms * 1e-3) / 1e9


# ----------------------------------------------------------------------------- reporting


def today() -> str:
    return datetime.date.today().isoformat()


def device_name(device=None) -> str:
    if not torch.cuda.is_available():
        return "cpu"
    props = torch.cuda.get_device_properties(device)
    return f"{props.name} (sm_{props.major}{props.minor}, {props.multi_processor_count} SMs)"


def env_header(device=None) -> str:
    """One line naming the device, torch and CUDA versions and today's date (YYYY-MM-DD)."""
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return (f"device: {device_name(device)} | torch {torch.__version__} | "
            f"CUDA {torch.version.cuda or 'none'} | cuDNN {cudnn or 'none'} | date {today()}")


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]],
                 markdown: bool = False) -> str:
    """Left-aligned text table, or a GitHub markdown table with ``markdown``."""
    cells: List[List[str]] = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for i, r in enumerate(cells):
        padded = [c.ljust(w) for c, w in zip(r, widths)]
        if markdown:
            lines.append("| " + " | ".join(padded) + " |")
            if i == 0:
                lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
        else:
            lines.append("  ".join(padded).rstrip())
            if i == 0:
                lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def append_results(md_path: str, title: str, table_text: str) -> None:
    """Append a dated section ``## YYYY-MM-DD: title`` holding ``table_text`` to md_path."""
    new = not os.path.exists(md_path)
    with open(md_path, "a", encoding="utf-8") as f:
        if new:
            f.write("# Benchmark results\n\nAppended by the scripts in this folder; "
                    "every section records its own device and ceilings.\n")
        f.write(f"\n## {today()}: {title}\n\n{table_text.rstrip()}\n")


def profile_calls(calls: dict, note: str = "") -> None:
    """For ncu --profile-from-start off: each call warmed up three times unprofiled, then one
    call between profiler start and stop."""
    for name, fn in calls.items():
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        fn()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        print(f"profiled {name}{note}")


def print_ncu_side_by_side(path: str, owner: Callable[[str], str]) -> None:
    """An Nsight Compute details CSV (`ncu --import R --page details --csv`) with the profiled
    kernels as columns, one row per (section, metric). owner(kernel name) labels each column."""
    kernels, table = [], {}
    with open(path) as f:
        for r in csv.DictReader(f):
            kernel = f"{r['ID']} {owner(r['Kernel Name'])}"
            if kernel not in kernels:
                kernels.append(kernel)
            key = (r["Section Name"], r["Metric Name"], r["Metric Unit"])
            table.setdefault(key, {})[kernel] = r["Metric Value"]
    print(f"{'section / metric':70s} " + " ".join(f"{k:>16s}" for k in kernels))
    for (section, metric, unit), vals in table.items():
        name = f"{section[:22]} / {metric} ({unit})"[:70]
        print(f"{name:70s} " + " ".join(f"{vals.get(k, ''):>16s}" for k in kernels))
