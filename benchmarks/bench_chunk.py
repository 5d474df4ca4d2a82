"""Chunked linear attention forward and the Gated DeltaNet decode step: dsv4's sm90 kernels
against FlashQLA, FlashInfer and flash-linear-attention (fla), and against the floor of this GPU,
all measured in one process.

    python benchmarks/bench_chunk.py            # the issue's rows, both ops
    python benchmarks/bench_chunk.py --quick    # two shapes (smoke run)

Peers are optional imports (see ../shared/peers/fetch.sh): FlashQLA (Qwen's TileLang kernels,
chunk_gated_delta_rule only) and fla's Triton path (FLA_FLASH_QLA=0) from
`source .peers/gla/env.sh`; FlashInfer's CuTe DSL prefill and decode step (the Gated DeltaNet
default of vLLM and SGLang on Hopper) from .peers/fi1 then .peers/fi2's env.sh, compiled on
first call of each shape.
A row says "n/a" for a peer that is missing or refuses the shape. FlashQLA compiles its kernels on
first use, for each shape (60-90 s a row on a fresh machine), so before timing, one process per
row calls the peers once, all rows at the same time, and fills TileLang's and Triton's on-disk
caches (their saves are atomic). Those processes share the GPU, so fla's autotuning results are
not saved from them (FLA_CACHE_RESULTS=0): the timed process autotunes again, on compiled
kernels. --no-warm skips this. Every implementation still runs once
before it is timed, and every call of a varlen row reuses one cu_seqlens tensor (FlashQLA caches
its plan by tensor).

Floor = max(FLOPs / bf16 GEMM rate, bytes / copy bandwidth), both ceilings measured in this run.
  FLOPs: 183k per (head, token) for chunk_gated_delta_rule, 98k for chunk_simple_gla (64-token
         chunks, K = V = 128: QK^T, KK^T, the WY products, Q S, K S, the state update).
  bytes: q, k, v, o, g (and beta) read or written once, plus the initial and final states.
Every row also reports which path ran and the rel-RMS difference between each implementation
and dsv4's fp32 reference path, so a fast wrong kernel shows up next to its speed. Prints one
table (last); --status-out PATH writes it as RESULTS.md's bench_chunk status block
(benchmarks/update_status.py puts it there).
"""
import argparse
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402

PEER_IMPORT_ERRORS = {}  # peer -> why its import failed (printed: a peer that is here but broken)
try:
    import flash_qla  # noqa: E402
except Exception as e:  # noqa: BLE001 - an optional peer: any import failure means "not here"
    flash_qla, PEER_IMPORT_ERRORS["FlashQLA"] = None, f"{type(e).__name__}: {e}"
try:  # FlashInfer's Gated DeltaNet (source .peers/fi1/env.sh, then .peers/fi2/env.sh)
    import flashinfer  # noqa: E402
    from flashinfer.gdn_decode import (  # noqa: E402
        gated_delta_rule_decode_pretranspose as fi_decode)
    from flashinfer.gdn_prefill import chunk_gated_delta_rule as fi_delta  # noqa: E402
except Exception as e:  # noqa: BLE001
    flashinfer = fi_delta = fi_decode = None
    PEER_IMPORT_ERRORS["FlashInfer"] = f"{type(e).__name__}: {e}"
try:
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_delta  # noqa: E402
    from fla.ops.simple_gla import chunk_simple_gla as fla_gla  # noqa: E402
except Exception as e:  # noqa: BLE001
    fla_delta = fla_gla = None
    PEER_IMPORT_ERRORS["fla"] = f"{type(e).__name__}: {e}"

FLOPS_PER_HEAD_TOKEN = {"gated_delta_rule": 183e3, "simple_gla": 98e3}
# The delta rule on every row (issue 47): >= 1.10x FlashInfer's speed and >= 1.5x FlashQLA's;
# <= 1.25x the floor on the rows of several sequences, where every SM has a chain, else <= 1.6x
# (issue 11). Simple GLA: <= 1.3x the floor (issue 11).
FLOOR_TARGET = {"gated_delta_rule": 1.6, "simple_gla": 1.3}
FULL_GRID_FLOOR_TARGET = 1.25
PEER_TARGETS = {"FlashInfer": 1.10, "FlashQLA": 1.5}
SHAPES = [  # (B, T, H, HV); B = 0 marks the varlen row
    (1, 32768, 16, 32),
    (4, 8192, 16, 32),
    (1, 8192, 16, 64),
    (8, 4096, 32, 32),
    (1, 65536, 2, 8),
    (1, 131072, 2, 8),
    (1, 4096, 16, 32),
    (0, 0, 16, 32),
]
QUICK_SHAPES = [(1, 8192, 16, 32), (1, 16384, 2, 8)]
VARLEN_SEQS, VARLEN_MIN, VARLEN_MAX = 64, 64, 4096
D = 128


def varlen_lengths(seed=0):
    """64 lengths from 64 to 4096 (log-uniform), fixed by the seed."""
    gen = torch.Generator().manual_seed(seed)
    lo, hi = torch.log(torch.tensor(float(VARLEN_MIN))), torch.log(torch.tensor(float(VARLEN_MAX)))
    lens = torch.exp(lo + (hi - lo) * torch.rand(VARLEN_SEQS, generator=gen)).long()
    lens[0], lens[-1] = VARLEN_MIN, VARLEN_MAX
    return lens.tolist()


def make_inputs(b, t, h, hv, n_states, dtype, device):
    q = F.normalize(torch.randn(b, t, h, D, device=device), dim=-1).to(dtype)
    k = F.normalize(torch.randn(b, t, h, D, device=device), dim=-1).to(dtype)
    v = torch.randn(b, t, hv, D, device=device).to(dtype)
    g = -0.5 * torch.rand(b, t, hv, device=device)
    beta = torch.rand(b, t, hv, device=device).clamp_min(1e-3)
    s0 = torch.randn(n_states, hv, D, D, device=device)
    return q, k, v, g, beta, s0


def count_bytes(op, tokens, h, hv, n_states, elem):
    qk = 2 * tokens * h * D * elem
    vo = 2 * tokens * hv * D * elem
    gates = (2 if op == "gated_delta_rule" else 1) * tokens * hv * 4
    states = 2 * n_states * hv * D * D * 4
    return qk + vo + gates + states


def rel_rms(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def flashinfer_call(q, k, v, g, beta, s0, cu):
    """FlashInfer's chunk_gated_delta_rule on our inputs. It takes packed (T, H, 128) rows with
    cu_seqlens, the decay itself (exp(g)) and fp32 beta as (T, HV), and states as (N, HV, V, K):
    converted here, once, outside the timed call; its outputs viewed back to ours."""
    b, t, h, d = q.shape
    hv, n = v.shape[2], b * t
    cu_fi = cu if cu is not None else torch.arange(b + 1, device=q.device, dtype=torch.int64) * t
    qf, kf, vf = q.reshape(n, h, d), k.reshape(n, h, d), v.reshape(n, hv, d)
    alpha = g.float().exp().reshape(n, hv).contiguous()
    beta_f = beta.float().reshape(n, hv).contiguous()
    s0_vk = s0.transpose(-1, -2).contiguous()

    def call():
        o, final = fi_delta(qf, kf, vf, g=alpha, beta=beta_f, initial_state=s0_vk,
                            output_final_state=True, cu_seqlens=cu_fi)
        return o.view(b, t, hv, d), final.transpose(-1, -2)
    return call


def peer_calls(op, q, k, v, g, beta, s0, cu):
    """name -> zero-argument call returning (o, final_state), for the peers that are here."""
    calls = {}
    if op == "gated_delta_rule":
        if flash_qla is not None:
            calls["FlashQLA"] = lambda: flash_qla.chunk_gated_delta_rule(
                q, k, v, g, beta, initial_state=s0, output_final_state=True, cu_seqlens=cu)
        if fi_delta is not None:
            calls["FlashInfer"] = flashinfer_call(q, k, v, g, beta, s0, cu)
        if fla_delta is not None:
            calls["fla"] = lambda: fla_delta(q, k, v, g, beta, initial_state=s0,
                                             output_final_state=True, cu_seqlens=cu)
    elif fla_gla is not None:
        # fla's simple GLA has one head count: q and k repeated to the v-heads (outside timing).
        group = v.shape[2] // q.shape[2]
        qr, kr = q.repeat_interleave(group, dim=2), k.repeat_interleave(group, dim=2)
        calls["fla"] = lambda: fla_gla(qr, kr, v, g, initial_state=s0, output_final_state=True,
                                       cu_seqlens=cu)
    return calls


def row_inputs(shape, dtype, device):
    """(q, k, v, g, beta, s0, cu, t, b, n_states, label) for one entry of SHAPES."""
    b, t, h, hv = shape
    cu = None
    if b == 0:  # varlen
        lens = varlen_lengths()
        t, n_states, b = sum(lens), len(lens), 1
        cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int64,
                          device=device)
        label = f"varlen {VARLEN_SEQS} seqs {VARLEN_MIN}-{VARLEN_MAX}, T={t}, {h}/{hv}"
    else:
        n_states = b
        label = f"({b}, {t}, {h}, {hv})"
    return (*make_inputs(b, t, h, hv, n_states, dtype, device), cu, t, b, n_states, label)


def warm_row(shape, dtype) -> int:
    """Call every peer once on one row (the --warm-row process): compiles into the disk caches."""
    q, k, v, g, beta, s0, cu, *_ = row_inputs(shape, dtype, torch.device("cuda"))
    for op in ("gated_delta_rule", "simple_gla"):
        for name, fn in peer_calls(op, q, k, v, g, beta, s0, cu).items():
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - the timed pass reports a refusal as n/a
                print(f"warm {name} {op} {shape}: {type(e).__name__}: {e}"[:200])
    torch.cuda.synchronize()
    return 0


def warm_peer_caches(shapes, dtype_name) -> None:
    """One --warm-row process per row, all at once: the peers' compiles run in parallel."""
    t0 = time.time()
    env = dict(os.environ, FLA_CACHE_RESULTS="0")  # autotune timings on a shared GPU: not kept
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--dtype", dtype_name,
                               "--warm-row", ",".join(str(x) for x in shape)], env=env)
             for shape in shapes]
    failed = 0
    for proc in procs:
        try:
            failed += proc.wait(timeout=max(1.0, 600 - (time.time() - t0))) != 0
        except subprocess.TimeoutExpired:
            proc.kill()
            failed += 1
    print(f"peer caches warmed for {len(shapes)} rows in {time.time() - t0:.0f} s"
          + (f" ({failed} warm processes failed; their rows compile when timed)" if failed else ""),
          flush=True)


DECODE_ROWS = [(b, hv, t) for b in (1, 64, 256) for hv in (32, 64) for t in (1, 2)]


def flashinfer_decode_call(q, k, v, g, beta, pool, idx):
    """FlashInfer's decode step on our inputs, or None without the peer. It takes a K-last pool
    (pool, HV, V, K) and Qwen's raw gates, g = -exp(A_log) softplus(a + dt_bias) and beta =
    sigmoid(b): A_log = dt_bias = 0, a = softplus^-1(-g), b = logit(beta), made here once. Returns
    (call, its pool, its output): the call writes the output and updates its pool in place, as
    ours does (T = 2 runs FlashInfer's fp32 multi-token kernel)."""
    if fi_decode is None:
        return None
    hv = v.shape[2]
    pool_vk = pool.transpose(-1, -2).contiguous()
    zeros = torch.zeros(hv, device=q.device)
    a = torch.log(torch.expm1(-g.float()))
    b = torch.log(beta.float() / (1 - beta.float()))
    out = torch.empty(v.shape, device=q.device, dtype=torch.bfloat16)

    def call():
        fi_decode(q, k, v, None, zeros, a, zeros, b, output=out, use_qk_l2norm=False,
                  initial_state=pool_vk, initial_state_indices=idx, backend="flashinfer")
    return call, pool_vk, out


def graph_step_ms(step, steps=20):
    """One step's time from a CUDA graph of `steps` steps back to back, as an engine's decode
    graph runs its layers (a lone replay of a few-microsecond kernel measures the launch and the
    idle clocks)."""
    def many():
        for _ in range(steps):
            step()
    return common.bench_ms(many, warmup=2, rep=10, cuda_graph=True) / steps


def decode_rows(dsv4, dtype, copy_gbs, device, peers=True):
    """gated_delta_rule_decode: B sequences, HV v-heads (H = HV / 2), T tokens, K = V = 128,
    fp32 states in a pool of 1024 slots picked in shuffled order; the state bytes read and
    written over the call's time, against the same-run copy rate. Each row is first checked
    against the reference path, and so is FlashInfer's step where it is here."""
    rows = []
    for b, hv, t in DECODE_ROWS:
        h, d = hv // 2, 128
        q, k = (torch.randn(b, t, h, d, device=device, dtype=dtype) for _ in range(2))
        k = torch.nn.functional.normalize(k.float(), dim=-1).to(dtype)
        v = torch.randn(b, t, hv, d, device=device, dtype=dtype)
        # exp(g) and beta strictly inside (0, 1): FlashInfer's raw gates are their inverses.
        g = -(torch.rand(b, t, hv, device=device) * 0.99 + 0.01)
        beta = torch.rand(b, t, hv, device=device) * 0.98 + 0.01
        pool = torch.randn(1024, hv, d, d, device=device) * 0.05
        idx = torch.randperm(1024, device=device)[:b].int()
        path = dsv4.gated_delta_rule_decode_path(q, k, v, g, beta, pool, state_indices=idx)
        check = pool.clone()
        o = dsv4.gated_delta_rule_decode(q, k, v, g, beta, check, state_indices=idx)
        with common.env_override("DSV4_DISABLE_SM90", "1"):
            want = pool.clone()
            o_ref = dsv4.gated_delta_rule_decode(q, k, v, g, beta, want, state_indices=idx)
        err = max(rel_rms(o, o_ref), rel_rms(check, want))
        # FlashInfer's pool is copied from this one before our timed steps change it.
        fi = flashinfer_decode_call(q, k, v, g, beta, pool, idx) if peers else None
        ms = graph_step_ms(lambda: dsv4.gated_delta_rule_decode(q, k, v, g, beta, pool,
                                                                 state_indices=idx))
        fi_ms = fi_err = None
        if fi is not None:
            fi_call, fi_pool, fi_out = fi
            try:
                fi_call()
                sel = idx.long()
                fi_err = max(rel_rms(fi_out, o_ref),
                             rel_rms(fi_pool[sel].transpose(-1, -2), want[sel]))
                fi_ms = graph_step_ms(fi_call)
            except Exception as e:  # noqa: BLE001 - a peer that refuses the shape is "n/a"
                print(f"  FlashInfer decode ({b}, {t}, {h}, {hv}): n/a "
                      f"({type(e).__name__}: {e})"[:300])
        nbytes = 2 * b * hv * d * d * 4
        rate = nbytes / ms / 1e6
        rows.append([f"({b}, {t}, {h}, {hv})", path, f"{ms * 1000:.1f}", f"{rate:.0f}",
                     f"{rate / copy_gbs * 100:.0f}%",
                     f"{fi_ms * 1000:.1f}" if fi_ms else "n/a",
                     f"{fi_ms / ms:.2f}x" if fi_ms else "n/a",
                     f"{err:.1e} / " + (f"{fi_err:.1e}" if fi_err is not None else "n/a")])
        print("  ".join(rows[-1]), flush=True)
        del q, k, v, g, beta, pool, check, want, fi
        torch.cuda.empty_cache()
    return rows


DECODE_HEADERS = ["decode (B, T, H, HV), fp32 states", "path", "us per step (graph of 20)",
                  "state GB/s", "of copy", "FlashInfer us", "speed vs FlashInfer",
                  "rel-RMS vs reference path (dsv4 / FlashInfer)"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="two shapes only (smoke run)")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    p.add_argument("--no-peers", action="store_true", help="time dsv4 only (variant runs)")
    p.add_argument("--rows", default=None,
                   help="comma-separated row indices into the full list (FlashQLA's first-use "
                        "compiles make the whole list long for one device call)")
    p.add_argument("--no-warm", action="store_true",
                   help="no parallel warm-up processes: each peer compiles when its row comes")
    p.add_argument("--status-out", default=None, metavar="PATH",
                   help="write the table as a status block for benchmarks/update_status.py")
    p.add_argument("--only-decode", action="store_true",
                   help="only the decode-step rows (no status block)")
    p.add_argument("--warm-row", default=None, help=argparse.SUPPRESS)  # B,T,H,HV: internal
    args = p.parse_args(argv)

    dtype = common.parse_dtype(args.dtype)
    if args.warm_row:
        return warm_row(tuple(int(x) for x in args.warm_row.split(",")), dtype)
    device = common.require_cuda("bench_chunk")
    import dsv4_attn as dsv4  # after the CUDA check

    torch.manual_seed(0)
    header = common.env_header(device)
    print(header)
    peers = (f"peers: FlashQLA {getattr(flash_qla, '__version__', 'n/a')} | FlashInfer "
             f"{getattr(flashinfer, '__version__', 'n/a')} | fla "
             f"{'yes' if fla_delta is not None else 'n/a'}")
    print(peers)
    for name, why in PEER_IMPORT_ERRORS.items():
        print(f"  {name} not imported: {why}"[:300])
    gemm = common.gemm_tflops(device, dtype)
    copy_gbs = common.copy_bandwidth(device)
    ceilings = (f"ceilings this run: {common.dtype_name(dtype)} GEMM 8192^3 {gemm:.0f} TFLOP/s | "
                f"D2D copy {copy_gbs:.0f} GB/s (read + write)")
    print(ceilings)

    rows = []
    shapes = QUICK_SHAPES if args.quick else SHAPES
    if args.only_decode:
        shapes, args.status_out = [], None
    if args.rows:
        shapes = [shapes[int(i)] for i in args.rows.split(",")]
    if not args.no_peers and not args.no_warm and (flash_qla or fla_delta) and len(shapes) > 1:
        warm_peer_caches(shapes, args.dtype)
    for shape in shapes:
        q, k, v, g, beta, s0, cu, t, b, n_states, label = row_inputs(shape, dtype, device)
        h, hv = shape[2], shape[3]
        path = dsv4.chunk_gated_delta_rule_path(q, k, v, g, beta, cu_seqlens=cu)
        for op in ("gated_delta_rule", "simple_gla"):
            if op == "gated_delta_rule":
                ours = lambda: dsv4.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=s0,
                                                           output_final_state=True, cu_seqlens=cu)
            else:
                ours = lambda: dsv4.chunk_simple_gla(q, k, v, g, initial_state=s0,
                                                     output_final_state=True, cu_seqlens=cu)
            os.environ["DSV4_DISABLE_SM90"] = "1"
            try:
                o_ref, final_ref = ours()
            finally:
                del os.environ["DSV4_DISABLE_SM90"]
            impls = {"dsv4": ours}
            if not args.no_peers:
                impls.update(peer_calls(op, q, k, v, g, beta, s0, cu))
            ms, err = {}, {}
            for name, fn in impls.items():
                try:
                    o, final = fn()  # also FlashQLA's compile
                    err[name] = max(rel_rms(o, o_ref), rel_rms(final, final_ref))
                    del o, final
                    ms[name] = common.bench_ms(fn, warmup=2, rep=10, budget_ms=300.0)
                except Exception as e:  # noqa: BLE001 - a peer that refuses the shape is "n/a"
                    if name == "dsv4":
                        raise
                    print(f"  {name} {op} {label}: n/a ({type(e).__name__}: {e})"[:300])
            del o_ref, final_ref
            flops = FLOPS_PER_HEAD_TOKEN[op] * t * b * hv
            nbytes = count_bytes(op, t * b, h, hv, n_states, q.element_size())
            compute_ms = flops / (gemm * 1e12) * 1e3
            memory_ms = nbytes / (copy_gbs * 1e9) * 1e3
            floor_ms = max(compute_ms, memory_ms)
            ratio = ms["dsv4"] / floor_ms
            floor_target = FLOOR_TARGET[op]
            if op == "gated_delta_rule" and shape[0] != 1:  # several sequences (or varlen)
                floor_target = FULL_GRID_FLOOR_TARGET
            met = ratio <= floor_target
            target = f"<= {floor_target} floor"
            if op == "gated_delta_rule":  # a missing peer leaves its target unmet
                for peer, want in PEER_TARGETS.items():
                    target += f", >= {want}x {peer}"
                    met = met and peer in ms and ms[peer] / ms["dsv4"] >= want
            verdict = "report" if args.quick else ("met" if met else "MISSED")
            fmt = lambda name: f"{ms[name]:.3f}" if name in ms else "n/a"
            speed = lambda name: f"{ms[name] / ms['dsv4']:.2f}x" if name in ms else "n/a"
            rows.append([op, label, path, fmt("dsv4"), fmt("FlashQLA"), fmt("FlashInfer"),
                         fmt("fla"), speed("FlashQLA"), speed("FlashInfer"), speed("fla"),
                         f"{floor_ms:.3f} ({'mem' if memory_ms >= compute_ms else 'mma'})",
                         f"{ratio:.2f}", f"{verdict} ({target})",
                         " / ".join(f"{err[n]:.1e}" if n in err else "n/a"
                                    for n in ("dsv4", "FlashQLA", "FlashInfer", "fla"))])
            print("  ".join(rows[-1]), flush=True)
        del q, k, v, g, beta, s0
        torch.cuda.empty_cache()

    headers = ["op", "(B, T, H, HV)", "path", "dsv4 ms", "FlashQLA ms", "FlashInfer ms", "fla ms",
               "speed vs FlashQLA", "speed vs FlashInfer", "speed vs fla", "floor ms (bound)",
               "dsv4 / floor", "target", "rel-RMS vs ref (dsv4 / FlashQLA / FlashInfer / fla)"]
    units = ("ms: median per call with initial and final state; speed vs X: X's ms / dsv4's ms; "
             "floor: max(FLOPs / GEMM rate, bytes / copy bandwidth); rel-RMS vs ref: max over o "
             "and final_state of ||impl - dsv4 reference path|| / ||reference path||")
    dec_rows = decode_rows(dsv4, dtype, copy_gbs, device, peers=not args.no_peers)
    table_md = (common.format_table(headers, rows, markdown=True) + "\n\n" +
                common.format_table(DECODE_HEADERS, dec_rows, markdown=True))
    md = "\n".join([header, "", peers, "", ceilings, "", units, "", table_md])
    note = ", ".join(n for n in ("quick" if args.quick else "",
                                 f"rows {args.rows}" if args.rows else "",
                                 "no peers" if args.no_peers else "") if n)
    common.write_status(args.status_out, common.status_block(
        "bench_chunk", "\n".join([peers, "", units, "", table_md]), gemm=gemm,
        copy_gbs=copy_gbs, device=device, dtype=dtype, note=note))
    print()
    print(md)
    print()
    print(common.format_table(headers, rows))
    print()
    print(common.format_table(DECODE_HEADERS, dec_rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
