"""Timing, ceiling and reporting helpers shared by the benchmarks (bench_fmha.py, bench_dsv4.py,
bench_chunk.py and the tools under ab/ and profile/).

Everything here measures on the device of the current run: a kernel's TFLOP/s is only
meaningful beside the GEMM rate and copy bandwidth measured in the same process, because
clocks, power caps and MIG slices differ from machine to machine.
"""
import contextlib
import csv
import datetime
import os
import statistics
import subprocess
import sys
from typing import Callable, List, Optional, Sequence

import torch

from update_status import begin_marker, end_marker, valid_name  # benchmarks/update_status.py

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

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


def fp8_gemm_tflops(device, n: int = 8192) -> float:
    """Dense FP8 GEMM rate of this device in this run: median of n^3 torch._scaled_mm
    (float8_e4m3 operands, unit scales, bf16 out), in TFLOP/s."""
    a = randn((n, n), torch.bfloat16, device).to(torch.float8_e4m3fn)
    b = randn((n, n), torch.bfloat16, device).to(torch.float8_e4m3fn).t()  # column-major
    one = torch.ones((), dtype=torch.float32, device=device)
    ms = bench_ms(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one,
                                           out_dtype=torch.bfloat16),
                  warmup=5, rep=30, budget_ms=500.0)
    del a, b
    return 2.0 * n ** 3 / (ms * 1e-3) / 1e12


@contextlib.contextmanager
def env_override(name: str, value: str):
    """Sets an environment variable for the block (the DSV4_* overrides are read per op call)."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


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


def git_commit() -> str:
    """The commit of the tree being measured: $DSV4_COMMIT when set (scripts/gpu_check.sh sets it
    where git works; pass it with the command on the GPU machine, whose copy of the tree may
    carry a stale .git), else `git rev-parse --short HEAD` with " (dirty)" when tracked files
    differ from it, else "unknown"."""
    if os.environ.get("DSV4_COMMIT", "").strip():
        return os.environ["DSV4_COMMIT"].strip()

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True,
                              timeout=30, check=True).stdout.strip()
    try:
        # Only this tree's own repository: not one that a copy of the tree happens to sit in.
        if os.path.realpath(git("rev-parse", "--show-toplevel")) == os.path.realpath(REPO):
            commit = git("rev-parse", "--short", "HEAD")
            dirty = git("status", "--porcelain", "--untracked-files=no")
            return commit + (" (dirty)" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def status_block(name: str, body: str, *, gemm: float, copy_gbs: float, device=None,
                 dtype: torch.dtype = torch.bfloat16, note: str = "") -> str:
    """A status block for benchmarks/RESULTS.md (benchmarks/update_status.py puts it there):
    marker lines around one line naming the run (date, GPU, torch, CUDA, commit, this run's
    ceilings) and ``body``, the bench's summary table as markdown."""
    if not valid_name(name):
        raise ValueError(f"status block name {name!r}: letters, digits, '_', '.', '-' only")
    gpu = torch.cuda.get_device_name(device) if torch.cuda.is_available() else "cpu"
    gemm_name = "GEMM" if dtype == torch.bfloat16 else f"{dtype_name(dtype)} GEMM"
    line = (f"**{name}**{f' ({note})' if note else ''} — {today()}, {gpu}, "
            f"torch {torch.__version__}, CUDA {torch.version.cuda or 'none'}, "
            f"commit {git_commit()}, ceilings: {gemm_name} {gemm:.0f} TFLOP/s, "
            f"copy {copy_gbs:.0f} GB/s")
    return f"{begin_marker(name)}\n{line}\n\n{body.strip()}\n{end_marker(name)}\n"


def write_status(path: Optional[str], block: str) -> None:
    """Write a status block to path (--status-out); nothing when path is None."""
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(block)
    print(f"wrote {path}")


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
