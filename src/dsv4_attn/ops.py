"""Typed wrappers over torch.ops.dsv4 and their fake kernels for torch.compile.

The C++ launchers (csrc/) validate every input; these wrappers only shape the call.
The contracts are written out in README.md.
"""
from typing import Optional, Tuple, Union

import torch
from torch import Tensor
from torch.fx.experimental import symbolic_shapes as _symbolic_shapes
from torch.utils._python_dispatch import _disable_current_modes

_ops = torch.ops.dsv4


def _schema_defaults(op) -> dict:
    """The defaults of an op's arguments, from its registered schema."""
    return {a.name: a.default_value for a in op.default._schema.arguments
            if a.has_default_value()}


def _given(defaults: dict, options: dict) -> dict:
    """The options that may differ from the schema's defaults. torch.ops parses every keyword it
    is passed, at a cost a launch-bound decode step sees (fmha: 21 -> 17 us of host time per
    call with none passed), so defaults stay out. The test is identity: None, bools and small
    ints are singletons; anything else is passed on."""
    return {name: value for name, value in options.items() if value is not defaults[name]}


_FMHA_DEFAULTS = _schema_defaults(_ops.fmha)
_DSV4_ATTENTION_DEFAULTS = _schema_defaults(_ops.dsv4_attention)
_DSV4_PAGED_DEFAULTS = _schema_defaults(_ops.dsv4_attention_paged)


def fmha(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    scale: Optional[float] = None,
    causal: bool = False,
    window_left: int = -1,
    sinks: Optional[Tensor] = None,
    cu_seqlens_q: Optional[Tensor] = None,
    cu_seqlens_k: Optional[Tensor] = None,
    max_seqlen_q: int = -1,
    max_seqlen_k: int = -1,
    return_lse: bool = False,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Softmax attention with GQA/MQA, bottom-right causal masking, a left window and sinks.

    Dense: q (B, Sq, Hq, D), k (B, Sk, Hkv, D), v (B, Sk, Hkv, Dv).
    Varlen (both cu_seqlens given): q (total_q, Hq, D), k/v (total_k, Hkv, D|Dv),
    cu_seqlens int32 or int64 (N+1,). Query i of a sequence sits at position i + Sk - Sq;
    key j is visible iff (not causal or j <= p) and (window_left < 0 or j >= p - window_left).
    sinks: fp32 (Hq,), one extra logit per head in the softmax denominator.

    Returns out (q's dtype, shape of q with Dv last) and, with return_lse, lse in fp32,
    natural log, (B, Hq, Sq) dense or (Hq, total_q) varlen. A row with nothing visible and
    no sink gives out = 0, lse = -inf. max_seqlen_* (>= the longest sequence) avoid a host
    sync on the varlen path; left at -1 they are read from cu_seqlens.
    """
    out, lse = _ops.fmha(q, k, v, **_given(_FMHA_DEFAULTS, dict(
        scale=scale, causal=causal, window_left=window_left, sinks=sinks,
        cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
        max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
    )))
    return (out, lse) if return_lse else out


def fmha_path(q: Tensor, k: Tensor, v: Tensor, **kwargs) -> str:
    """Name of the implementation fmha would run for these arguments, "sm90" or "reference" (it
    validates them the same way); takes fmha's keyword arguments, return_lse aside."""
    return _ops.fmha_path(q, k, v, **kwargs)


def dsv4_attention(
    q: Tensor,
    kv: Tensor,
    *,
    sinks: Optional[Tensor] = None,
    window: int = 128,
    compressed_kv: Optional[Tensor] = None,
    compress_ratio: int = 0,
    topk_indices: Optional[Tensor] = None,
    scale: Optional[float] = None,
    cu_seqlens_q: Optional[Tensor] = None,
    cu_seqlens_kv: Optional[Tensor] = None,
    cu_seqlens_compressed: Optional[Tensor] = None,
    max_seqlen_q: int = -1,
    max_seqlen_kv: int = -1,
    return_lse: bool = False,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """One DeepSeek-V4 attention layer: one softmax over three key sets of one shared KV head.

    kv is one head used as both key and value. Query i of a sequence sits at position
    t = Skv - Sq + i (Sq <= Skv) and sees:
      - the window: kv rows j with t - window < j <= t (window >= 0; 0: none);
      - with compressed_kv (compress_ratio r >= 1): its closed rows w < min(Sc, floor((t+1)/r)),
        every one of them (HCA), or with topk_indices only those listed for this query (CSA).
        A listed index that is negative, >= Sc or not yet closed is skipped and never read; a
        repeated index counts each time it is listed.
    out = sum exp(s) key / Z, Z = sum exp(s) + exp(sinks[h]), s = scale q.key (scale defaults to
    1/sqrt(D)), lse = log Z. A query with nothing visible and no sink gets out = 0, lse = -inf.

    Dense: q (B, Sq, Hq, D), kv (B, Skv, D), compressed_kv (B, Sc, D), topk_indices int32
    (B, Sq, K). Varlen (cu_seqlens_q and cu_seqlens_kv, plus cu_seqlens_compressed with
    compressed_kv; int32 or int64 (N+1,)): q (total_q, Hq, D), kv (total_kv, D),
    compressed_kv (total_c, D), topk_indices (total_q, K) relative to each sequence's
    compressed rows. sinks fp32 (Hq,). q, kv, compressed_kv bf16 or fp16 alike; only the last
    dim must be contiguous. max_seqlen_* (>= the longest sequence) avoid a host sync on a GPU.

    Returns out (q's shape and dtype) and, with return_lse, lse fp32 (B, Hq, Sq) or
    (Hq, total_q).
    """
    out, lse = _ops.dsv4_attention(q, kv, **_given(_DSV4_ATTENTION_DEFAULTS, dict(
        sinks=sinks, window=window, compressed_kv=compressed_kv,
        compress_ratio=compress_ratio, topk_indices=topk_indices, scale=scale,
        cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv,
        cu_seqlens_compressed=cu_seqlens_compressed, max_seqlen_q=max_seqlen_q,
        max_seqlen_kv=max_seqlen_kv,
    )))
    return (out, lse) if return_lse else out


def dsv4_attention_path(q: Tensor, kv: Tensor, **kwargs) -> str:
    """Name of the implementation dsv4_attention would run for these arguments (it validates
    them the same way); takes dsv4_attention's keyword arguments, return_lse aside."""
    return _ops.dsv4_attention_path(q, kv, **kwargs)


def merge_attn_states(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor) -> Tuple[Tensor, Tensor]:
    """Exact attention over the union of two disjoint key sets from each set's (out, lse).

    lse = logaddexp(lse_a, lse_b); out = out_a*exp(lse_a - lse) + out_b*exp(lse_b - lse).
    Accepts fmha's dense and varlen layouts; a side at -inf contributes nothing.
    out_a/out_b are bf16, fp16 or fp32 (the same dtype, kept for out); lse is fp32.
    """
    return _ops.merge_attn_states(out_a, lse_a, out_b, lse_b)


def merge_attn_states_path(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor) -> str:
    """Name of the implementation merge_attn_states would run for these arguments."""
    return _ops.merge_attn_states_path(out_a, lse_a, out_b, lse_b)


def chunk_gated_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    *,
    scale: Optional[float] = None,
    initial_state: Optional[Tensor] = None,
    output_final_state: bool = False,
    cu_seqlens: Optional[Tensor] = None,
    use_qk_l2norm_in_kernel: bool = False,
) -> Tuple[Tensor, Optional[Tensor]]:
    """Gated DeltaNet forward (Qwen3-Next), computed in 64-token chunks.

    q, k (B, T, H, K); v (B, T, HV, V); g (log decay) and beta (B, T, HV) in fp32, bf16 or
    fp16 (used in fp32); HV % H == 0. Per (sequence, v-head) with fp32 state S (K, V):
    S <- exp(g_t) S; u_t = beta_t (v_t - S^T k_t); S <- S + k_t u_t^T; o_t = scale S^T q_t.
    Varlen: B == 1 and cu_seqlens int32 or int64 (N+1,). initial_state / final_state fp32
    (N, HV, K, V). use_qk_l2norm_in_kernel: q and k are first l2-normalized over K
    (x / sqrt(sum x^2 + 1e-6), in q's dtype), as flash-linear-attention does.
    Returns (o in v's dtype (B, T, HV, V), final_state or None).
    """
    return _ops.chunk_gated_delta_rule(
        q, k, v, g, beta, scale=scale, initial_state=initial_state,
        output_final_state=output_final_state, cu_seqlens=cu_seqlens,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
    )


def chunk_simple_gla(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    *,
    scale: Optional[float] = None,
    initial_state: Optional[Tensor] = None,
    output_final_state: bool = False,
    cu_seqlens: Optional[Tensor] = None,
) -> Tuple[Tensor, Optional[Tensor]]:
    """Simple gated linear attention: S <- exp(g_t) S + k_t v_t^T; o_t = scale S^T q_t.

    Same shapes and conventions as chunk_gated_delta_rule, without beta.
    """
    return _ops.chunk_simple_gla(
        q, k, v, g, scale=scale, initial_state=initial_state,
        output_final_state=output_final_state, cu_seqlens=cu_seqlens,
    )


def chunk_gated_delta_rule_path(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
                                **kwargs) -> str:
    """Name of the implementation chunk_gated_delta_rule would run for these arguments."""
    return _ops.chunk_gated_delta_rule_path(q, k, v, g, beta, **kwargs)


def chunk_simple_gla_path(q: Tensor, k: Tensor, v: Tensor, g: Tensor, **kwargs) -> str:
    """Name of the implementation chunk_simple_gla would run for these arguments."""
    return _ops.chunk_simple_gla_path(q, k, v, g, **kwargs)


def kv_cache_insert_fp8(kv: Tensor, cache: Tensor, slots: Tensor) -> None:
    """Quantize rows into a paged FP8 KV cache, in place (the record: README, "The paged FP8 KV
    cache").

    kv (N, 512) bf16/fp16; cache a (num_blocks, P, 1, 584) uint8 view whose stride(0) is the
    block's bytes (P * 584 rounded up to a multiple of 576); slots (N,) int32/int64, row i goes
    to global slot slots[i] = block * P + row. A slot of -1, or past the cache, is skipped.
    Slots must be distinct.
    """
    _ops.kv_cache_insert_fp8(kv, cache, slots)


def kv_cache_insert_fp8_path(kv: Tensor, cache: Tensor, slots: Tensor) -> str:
    """Name of the implementation kv_cache_insert_fp8 would run for these arguments."""
    return _ops.kv_cache_insert_fp8_path(kv, cache, slots)


def kv_cache_gather_fp8(cache: Tensor, slots: Tensor, dtype: torch.dtype = torch.bfloat16) -> Tensor:
    """The rows at the given global slots of a paged FP8 KV cache, dequantized: (N, 512) of
    dtype (bf16, fp16 or fp32). A slot of -1, or past the cache, gives a row of zeros."""
    return _ops.kv_cache_gather_fp8(cache, slots, dtype)


def kv_cache_gather_fp8_path(cache: Tensor, slots: Tensor, dtype: torch.dtype = torch.bfloat16) -> str:
    """Name of the implementation kv_cache_gather_fp8 would run for these arguments."""
    return _ops.kv_cache_gather_fp8_path(cache, slots, dtype)


def dsv4_attention_paged(
    q: Tensor,
    window_cache: Tensor,
    window_slots: Tensor,
    *,
    window_lengths: Optional[Tensor] = None,
    compressed_cache: Optional[Tensor] = None,
    compressed_slots: Optional[Tensor] = None,
    compressed_lengths: Optional[Tensor] = None,
    sinks: Optional[Tensor] = None,
    scale: Optional[float] = None,
    out: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    """One DeepSeek-V4 attention layer over the paged FP8 KV caches (README, "The paged FP8 KV
    cache"): query token t attends to the rows its slot lists name, in one softmax with the sink.

    q (T, Hq, 512) bf16/fp16; window_cache (and compressed_cache) a (num_blocks, P, 1, 584)
    uint8 view; *_slots (T, L) int32 global slots; *_lengths (T,) int32. Entry j of token t's
    list is read iff j < lengths[t] (no lengths: every entry) and 0 <= slot < num_blocks * P;
    a repeated slot counts twice. sinks (Hq,) fp32. out, if given, is written (contiguous, q's
    shape and dtype). Returns (out, lse): lse fp32 (Hq, T) is log Σ exp(scale q·k) over the
    rows read, without the sink; -inf where none is read (out is then 0).
    """
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = _ops.dsv4_attention_paged(q, window_cache, window_slots, out=out, **_given(
        _DSV4_PAGED_DEFAULTS, dict(window_lengths=window_lengths,
                                   compressed_cache=compressed_cache,
                                   compressed_slots=compressed_slots,
                                   compressed_lengths=compressed_lengths, sinks=sinks,
                                   scale=scale)))
    return out, lse


def dsv4_attention_paged_path(q: Tensor, window_cache: Tensor, window_slots: Tensor,
                              **kwargs) -> str:
    """Name of the implementation dsv4_attention_paged would run for these arguments (out is
    optional here)."""
    if kwargs.get("out") is None:
        kwargs["out"] = torch.empty_like(q, memory_format=torch.contiguous_format)
    return _ops.dsv4_attention_paged_path(q, window_cache, window_slots, **kwargs)


def dsv4_indexer_topk(
    q: Tensor,
    k: Tensor,
    weights: Tensor,
    positions: Tensor,
    *,
    topk: int,
    compress_ratio: int,
    scale: Optional[float] = None,
    k_scale: Optional[Tensor] = None,
    cu_seqlens_q: Optional[Tensor] = None,
    cu_seqlens_k: Optional[Tensor] = None,
    max_seqlen_q: int = -1,
    max_seqlen_k: int = -1,
) -> Tensor:
    """DeepSeek-V4's lightning indexer: each query's top-k closed compressed rows.

    Dense: q (B, Sq, H, D), k (B, Sc, D), weights (B, Sq, H), positions (B, Sq) int32/int64.
    Varlen (both cu_seqlens): q (T, H, D), k (total_c, D), weights (T, H), positions (T,).
    score(i, s) = sum_h weights[i, h] ReLU(scale q[i, h] . k[s]) over the closed rows
    s < min(Sc, (p + 1) // compress_ratio); fp8 q and k take k_scale (one fp32 per row of k).
    Returns int32 (..., topk): the best rows first, ties to the lower row, then -1. This is
    dsv4_attention's topk_indices.
    """
    return _ops.dsv4_indexer_topk(q, k, weights, positions, topk=topk,
                                  compress_ratio=compress_ratio, scale=scale, k_scale=k_scale,
                                  cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                                  max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)


def dsv4_indexer_topk_path(q: Tensor, k: Tensor, weights: Tensor, positions: Tensor,
                           **kwargs) -> str:
    """Name of the implementation dsv4_indexer_topk would run for these arguments."""
    return _ops.dsv4_indexer_topk_path(q, k, weights, positions, **kwargs)


def dsv4_indexer_topk_paged(
    q: Tensor,
    k_cache: Tensor,
    weights: Tensor,
    positions: Tensor,
    block_table: Tensor,
    context_lens: Tensor,
    *,
    topk: int,
    compress_ratio: int,
    scale: Optional[float] = None,
) -> Tensor:
    """dsv4_indexer_topk for N query tokens per request (decode, multi-token prediction) over
    vLLM's paged FP8 indexer cache.

    q (B, N, H, 128), weights (B, N, H), positions (B, N) int32/int64. k_cache
    (num_blocks, P, 1, 132) uint8: each block holds P rows of 128 float8_e4m3 values, then their
    P fp32 scales; request b's row s lives in block block_table[b, s // P], row s % P, and the
    request has context_lens[b] rows. A query at position p sees rows
    s < min(context_lens[b], (p + 1) // compress_ratio). Returns int32 (B, N, topk): request
    rows (not slots), best first, ties to the lower row, then -1.
    """
    return _ops.dsv4_indexer_topk_paged(q, k_cache, weights, positions, block_table,
                                        context_lens, topk=topk, compress_ratio=compress_ratio,
                                        scale=scale)


def dsv4_indexer_topk_paged_path(q: Tensor, k_cache: Tensor, weights: Tensor, positions: Tensor,
                                 block_table: Tensor, context_lens: Tensor, **kwargs) -> str:
    """Name of the implementation dsv4_indexer_topk_paged would run for these arguments."""
    return _ops.dsv4_indexer_topk_paged_path(q, k_cache, weights, positions, block_table,
                                             context_lens, **kwargs)


def gated_delta_rule_decode(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    state: Tensor,
    *,
    state_indices: Optional[Tensor] = None,
    scale: Optional[float] = None,
    use_qk_l2norm_in_kernel: bool = False,
) -> Tensor:
    """One decode step of the gated delta rule (chunk_gated_delta_rule's recurrence) for T tokens
    per sequence, its state updated in place.

    q, k (B, T, H, K); v (B, T, HV, V); g, beta (B, T, HV); state (N, HV, K, V) fp32 or bf16:
    one per sequence (N = B), or a pool that state_indices (B,) int32/int64 picks from, where
    -1 (or a slot past the pool) skips the sequence: its o is 0 and no state changes. The
    picked slots must be distinct. Returns o (B, T, HV, V) in v's dtype.
    """
    return _ops.gated_delta_rule_decode(q, k, v, g, beta, state, state_indices=state_indices,
                                        scale=scale,
                                        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)


def gated_delta_rule_decode_path(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
                                 state: Tensor, **kwargs) -> str:
    """Name of the implementation gated_delta_rule_decode would run for these arguments."""
    return _ops.gated_delta_rule_decode_path(q, k, v, g, beta, state, **kwargs)


def launch_plan(op: str, *args, **kwargs) -> str:
    """The decisions an op would launch with for these arguments: "sm90 <family> <decisions>"
    (the kernel family, tile shape, splits, grid, ...) or "reference: <why not sm90>". op is
    the op's name ("fmha", "dsv4_attention", "merge_attn_states", "chunk_gated_delta_rule",
    "chunk_simple_gla", "dsv4_indexer_topk", "dsv4_indexer_topk_paged",
    "gated_delta_rule_decode", "kv_cache_insert_fp8", "kv_cache_gather_fp8",
    "dsv4_attention_paged"); the arguments are the op's. With
    DSV4_PLAN_ASSUME_SM90=N set, it plans for an sm_90 GPU of N SMs whatever the tensors'
    device (for tests without a GPU)."""
    return getattr(_ops, f"_{op}_plan")(*args, **kwargs)


# ----------------------------------------------------------------------------- fake kernels
# The kernels torch.compile and meta tensors use. Each first checks that every tensor is on q's
# device (meta included), then runs the op's own C++ validation (the private `_<op>_check` op)
# on meta stand-ins of the traced sizes, dtypes and strides, so tracing rejects exactly what
# the op rejects; the values of cu_seqlens are unknown here and checked when the op runs.


def _check_same_device(op: str, ref_name: str, ref: Tensor, **tensors) -> None:
    for name, t in tensors.items():
        if t is not None and t.device != ref.device:
            raise RuntimeError(f"{op}: {name} must be on the same device as {ref_name} "
                               f"({ref_name}: {ref.device}, {name}: {t.device})")


# A traced size's example value, without adding a guard; torch renamed this helper over time.
_size_hint = next(getattr(_symbolic_shapes, name) for name in
                  ("optimization_hint", "size_hint", "hint_int") if hasattr(_symbolic_shapes, name))


def _meta_standin(x):
    if not isinstance(x, Tensor):
        return x
    return torch.empty_strided([_size_hint(n) for n in x.shape], [_size_hint(n) for n in x.stride()],
                               dtype=x.dtype, device="meta")


def _run_check(check_op, *args, **kwargs) -> None:
    args = [_meta_standin(a) for a in args]
    kwargs = {k: _meta_standin(v) for k, v in kwargs.items()}
    with _disable_current_modes():  # plain meta dispatch, outside fake and tracing modes
        check_op(*args, **kwargs)


@torch.library.register_fake("dsv4::fmha")
def _fmha_fake(q, k, v, *, scale=None, causal=False, window_left=-1, sinks=None,
               cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=-1, max_seqlen_k=-1):
    _check_same_device("fmha", "q", q, k=k, v=v, sinks=sinks, cu_seqlens_q=cu_seqlens_q,
                       cu_seqlens_k=cu_seqlens_k)
    _run_check(_ops._fmha_check, q, k, v, scale=scale, causal=causal, window_left=window_left,
               sinks=sinks, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
               max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))
    if cu_seqlens_q is not None:
        total_q, hq = q.shape[0], q.shape[1]
        lse = q.new_empty((hq, total_q), dtype=torch.float32)
    else:
        b, sq, hq = q.shape[0], q.shape[1], q.shape[2]
        lse = q.new_empty((b, hq, sq), dtype=torch.float32)
    return out, lse


@torch.library.register_fake("dsv4::dsv4_attention")
def _dsv4_attention_fake(q, kv, *, sinks=None, window=128, compressed_kv=None, compress_ratio=0,
                         topk_indices=None, scale=None, cu_seqlens_q=None, cu_seqlens_kv=None,
                         cu_seqlens_compressed=None, max_seqlen_q=-1, max_seqlen_kv=-1):
    _check_same_device("dsv4_attention", "q", q, kv=kv, sinks=sinks, compressed_kv=compressed_kv,
                       topk_indices=topk_indices, cu_seqlens_q=cu_seqlens_q,
                       cu_seqlens_kv=cu_seqlens_kv, cu_seqlens_compressed=cu_seqlens_compressed)
    _run_check(_ops._dsv4_attention_check, q, kv, sinks=sinks, window=window,
               compressed_kv=compressed_kv, compress_ratio=compress_ratio,
               topk_indices=topk_indices, scale=scale, cu_seqlens_q=cu_seqlens_q,
               cu_seqlens_kv=cu_seqlens_kv, cu_seqlens_compressed=cu_seqlens_compressed,
               max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv)
    out = q.new_empty(q.shape)
    if cu_seqlens_q is not None:
        return out, q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
    return out, q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)


@torch.library.register_fake("dsv4::merge_attn_states")
def _merge_fake(out_a, lse_a, out_b, lse_b):
    _check_same_device("merge_attn_states", "out_a", out_a, lse_a=lse_a, out_b=out_b, lse_b=lse_b)
    _run_check(_ops._merge_attn_states_check, out_a, lse_a, out_b, lse_b)
    return torch.empty_like(out_a, memory_format=torch.contiguous_format), \
        torch.empty_like(lse_a, dtype=torch.float32, memory_format=torch.contiguous_format)


def _chunk_outputs(q, v, output_final_state, cu_seqlens):
    o = v.new_empty(v.shape)
    if not output_final_state:
        return o, None
    n = cu_seqlens.shape[0] - 1 if cu_seqlens is not None else q.shape[0]
    hv, dk, dv = v.shape[2], q.shape[3], v.shape[3]
    return o, q.new_empty((n, hv, dk, dv), dtype=torch.float32)


@torch.library.register_fake("dsv4::chunk_gated_delta_rule")
def _gdr_fake(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False,
              cu_seqlens=None, use_qk_l2norm_in_kernel=False):
    _check_same_device("chunk_gated_delta_rule", "q", q, k=k, v=v, g=g, beta=beta,
                       initial_state=initial_state, cu_seqlens=cu_seqlens)
    _run_check(_ops._chunk_gated_delta_rule_check, q, k, v, g, beta, scale=scale,
               initial_state=initial_state, output_final_state=output_final_state,
               cu_seqlens=cu_seqlens, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
    return _chunk_outputs(q, v, output_final_state, cu_seqlens)


@torch.library.register_fake("dsv4::chunk_simple_gla")
def _gla_fake(q, k, v, g, *, scale=None, initial_state=None, output_final_state=False,
              cu_seqlens=None):
    _check_same_device("chunk_simple_gla", "q", q, k=k, v=v, g=g, initial_state=initial_state,
                       cu_seqlens=cu_seqlens)
    _run_check(_ops._chunk_simple_gla_check, q, k, v, g, scale=scale,
               initial_state=initial_state, output_final_state=output_final_state,
               cu_seqlens=cu_seqlens)
    return _chunk_outputs(q, v, output_final_state, cu_seqlens)


@torch.library.register_fake("dsv4::kv_cache_insert_fp8")
def _kv_cache_insert_fp8_fake(kv, cache, slots):
    _check_same_device("kv_cache_insert_fp8", "kv", kv, cache=cache, slots=slots)
    _run_check(_ops._kv_cache_insert_fp8_check, kv, cache, slots)


@torch.library.register_fake("dsv4::kv_cache_gather_fp8")
def _kv_cache_gather_fp8_fake(cache, slots, dtype):
    _check_same_device("kv_cache_gather_fp8", "cache", cache, slots=slots)
    _run_check(_ops._kv_cache_gather_fp8_check, cache, slots, dtype)
    return cache.new_empty((slots.shape[0], 512), dtype=dtype)


@torch.library.register_fake("dsv4::gated_delta_rule_decode")
def _gated_delta_rule_decode_fake(q, k, v, g, beta, state, *, state_indices=None, scale=None,
                                  use_qk_l2norm_in_kernel=False):
    _check_same_device("gated_delta_rule_decode", "q", q, k=k, v=v, g=g, beta=beta, state=state,
                       state_indices=state_indices)
    _run_check(_ops._gated_delta_rule_decode_check, q, k, v, g, beta, state,
               state_indices=state_indices, scale=scale,
               use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
    return v.new_empty(v.shape)


@torch.library.register_fake("dsv4::dsv4_attention_paged")
def _dsv4_attention_paged_fake(q, window_cache, window_slots, *, window_lengths=None,
                               compressed_cache=None, compressed_slots=None,
                               compressed_lengths=None, sinks=None, scale=None, out):
    _check_same_device("dsv4_attention_paged", "q", q, window_cache=window_cache,
                       window_slots=window_slots, window_lengths=window_lengths,
                       compressed_cache=compressed_cache, compressed_slots=compressed_slots,
                       compressed_lengths=compressed_lengths, sinks=sinks, out=out)
    _run_check(_ops._dsv4_attention_paged_check, q, window_cache, window_slots,
               window_lengths=window_lengths, compressed_cache=compressed_cache,
               compressed_slots=compressed_slots, compressed_lengths=compressed_lengths,
               sinks=sinks, scale=scale, out=out)
    return q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


@torch.library.register_fake("dsv4::dsv4_indexer_topk")
def _dsv4_indexer_topk_fake(q, k, weights, positions, *, topk, compress_ratio, scale=None,
                            k_scale=None, cu_seqlens_q=None, cu_seqlens_k=None,
                            max_seqlen_q=-1, max_seqlen_k=-1):
    _check_same_device("dsv4_indexer_topk", "q", q, k=k, weights=weights, positions=positions,
                       k_scale=k_scale, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    _run_check(_ops._dsv4_indexer_topk_check, q, k, weights, positions, topk=topk,
               compress_ratio=compress_ratio, scale=scale, k_scale=k_scale,
               cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
               max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)
    return q.new_empty((*q.shape[:-2], topk), dtype=torch.int32)


@torch.library.register_fake("dsv4::dsv4_indexer_topk_paged")
def _dsv4_indexer_topk_paged_fake(q, k_cache, weights, positions, block_table, context_lens, *,
                                  topk, compress_ratio, scale=None):
    _check_same_device("dsv4_indexer_topk_paged", "q", q, k_cache=k_cache, weights=weights,
                       positions=positions, block_table=block_table, context_lens=context_lens)
    _run_check(_ops._dsv4_indexer_topk_paged_check, q, k_cache, weights, positions, block_table,
               context_lens, topk=topk, compress_ratio=compress_ratio, scale=scale)
    return q.new_empty((*q.shape[:2], topk), dtype=torch.int32)
