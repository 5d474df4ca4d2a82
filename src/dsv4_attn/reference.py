"""Float64 oracles for every dsv4 op, written from the contracts alone.

Nothing here shares code with csrc/: attention is computed by building the full score matrix
and masking it explicitly, the linear-attention recurrences token by token. Inputs of any
dtype/device are copied to CPU float64; results are float64 CPU tensors.

This module imports only torch, so it can be loaded without the compiled extension.
"""
import math
from typing import List, Optional, Tuple

import torch
from torch import Tensor

__all__ = ["attention", "dsv4_attention", "merge_attn_states", "gated_delta_rule", "simple_gla", "l2norm",
           "indexer_scores", "indexer_topk", "kv_cache_rows", "dsv4_attention_paged"]


def _f64(t: Optional[Tensor]) -> Optional[Tensor]:
    return None if t is None else t.detach().to(device="cpu", dtype=torch.float64)


def _seq_bounds(cu_seqlens: Tensor) -> List[Tuple[int, int]]:
    cu = [int(x) for x in cu_seqlens.detach().cpu().tolist()]
    return list(zip(cu[:-1], cu[1:]))


# ----------------------------------------------------------------------------- softmax attention


def _attention_dense(q, k, v, scale, causal, window_left, sinks):
    """q (B, Sq, Hq, D), k (B, Sk, Hkv, D), v (B, Sk, Hkv, Dv), all float64 CPU.

    Returns out (B, Sq, Hq, Dv) and lse (B, Hq, Sq).
    """
    b, sq, hq, _ = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    if hq % hkv != 0:
        raise ValueError(f"reference.attention: Hq ({hq}) must be a multiple of Hkv ({hkv})")
    group = hq // hkv
    # Query head h reads kv head h // group.
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)

    s = torch.einsum("bihd,bjhd->bhij", q, k) * scale  # (B, Hq, Sq, Sk)

    # Bottom-right aligned positions: query i sits at key position i + Sk - Sq.
    p = torch.arange(sq).view(sq, 1) + (sk - sq)
    j = torch.arange(sk).view(1, sk)
    visible = torch.ones(sq, sk, dtype=torch.bool)
    if causal:
        visible &= j <= p
    if window_left >= 0:
        visible &= j >= p - window_left
    s = s.masked_fill(~visible, -math.inf)

    row_max = torch.full((b, hq, sq, 1), -math.inf, dtype=torch.float64)
    if sk > 0:
        row_max = s.amax(dim=-1, keepdim=True)
    if sinks is not None:
        sink = sinks.view(1, hq, 1, 1).expand(b, hq, sq, 1)
        row_max = torch.maximum(row_max, sink)
    # Rows with nothing visible (and no sink) have row_max = -inf; shift by 0 there instead.
    shift = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    p_exp = torch.exp(s - shift)  # exp(-inf) = 0 for masked keys
    z = p_exp.sum(dim=-1, keepdim=True)
    if sinks is not None:
        z = z + torch.exp(sink - shift)

    safe_z = torch.where(z > 0, z, torch.ones_like(z))
    out = torch.einsum("bhij,bjhd->bihd", p_exp / safe_z, v)  # (B, Sq, Hq, Dv)
    lse = torch.where(z > 0, torch.log(safe_z) + shift, torch.full_like(z, -math.inf))
    return out, lse.squeeze(-1)


def attention(
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
) -> Tuple[Tensor, Tensor]:
    """Softmax attention by explicit masking; the oracle for dsv4.fmha.

    Dense: q (B, Sq, Hq, D), k (B, Sk, Hkv, D), v (B, Sk, Hkv, Dv) -> out (B, Sq, Hq, Dv),
    lse (B, Hq, Sq). Varlen (both cu_seqlens, (N+1,)): q (total_q, Hq, D),
    k/v (total_k, Hkv, D|Dv) -> out (total_q, Hq, Dv), lse (Hq, total_q).
    A row with no visible key and no sink gives out = 0, lse = -inf.
    """
    if (cu_seqlens_q is None) != (cu_seqlens_k is None):
        raise ValueError("reference.attention: give both cu_seqlens_q and cu_seqlens_k, or neither")
    q, k, v, sinks = _f64(q), _f64(k), _f64(v), _f64(sinks)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])

    if cu_seqlens_q is None:
        return _attention_dense(q, k, v, scale, causal, window_left, sinks)

    bounds_q, bounds_k = _seq_bounds(cu_seqlens_q), _seq_bounds(cu_seqlens_k)
    if len(bounds_q) != len(bounds_k):
        raise ValueError("reference.attention: cu_seqlens_q and cu_seqlens_k differ in length")
    total_q, hq = q.shape[0], q.shape[1]
    out = torch.zeros(total_q, hq, v.shape[-1], dtype=torch.float64)
    lse = torch.full((hq, total_q), -math.inf, dtype=torch.float64)
    for (q0, q1), (k0, k1) in zip(bounds_q, bounds_k):
        if q1 == q0:
            continue
        o_seq, lse_seq = _attention_dense(
            q[q0:q1].unsqueeze(0), k[k0:k1].unsqueeze(0), v[k0:k1].unsqueeze(0),
            scale, causal, window_left, sinks,
        )
        out[q0:q1] = o_seq[0]
        lse[:, q0:q1] = lse_seq[0]
    return out, lse


def merge_attn_states(out_a: Tensor, lse_a: Tensor, out_b: Tensor,
                      lse_b: Tensor) -> Tuple[Tensor, Tensor]:
    """Combine two partial attentions over disjoint key sets (dense or varlen layout).

    lse_* are (B, H, S) for out_* (B, S, H, Dv), or (H, total) for out_* (total, H, Dv).
    """
    out_a, lse_a, out_b, lse_b = _f64(out_a), _f64(lse_a), _f64(out_b), _f64(lse_b)
    lse = torch.logaddexp(lse_a, lse_b)
    finite = torch.isfinite(lse)
    safe = torch.where(finite, lse, torch.zeros_like(lse))
    w_a = torch.where(finite, torch.exp(lse_a - safe), torch.zeros_like(lse))
    w_b = torch.where(finite, torch.exp(lse_b - safe), torch.zeros_like(lse))
    # Move the weights into out's layout: (B, H, S) -> (B, S, H, 1); (H, T) -> (T, H, 1).
    if out_a.dim() == 4:
        w_a, w_b = w_a.transpose(1, 2).unsqueeze(-1), w_b.transpose(1, 2).unsqueeze(-1)
    else:
        w_a, w_b = w_a.transpose(0, 1).unsqueeze(-1), w_b.transpose(0, 1).unsqueeze(-1)
    return out_a * w_a + out_b * w_b, lse


# ----------------------------------------------------------------------------- DeepSeek-V4 attention


def _dsv4_sequence(q, kv, comp, topk, sinks, scale, window, ratio):
    """One sequence: q (Sq, H, D), kv (Skv, D), comp (Sc, D) or None, topk (Sq, K) or None.

    Returns out (Sq, H, D) and lse (H, Sq)."""
    sq, h, d = q.shape
    skv = kv.shape[0]
    out = torch.zeros(sq, h, d, dtype=torch.float64)
    lse = torch.full((h, sq), -math.inf, dtype=torch.float64)
    for i in range(sq):
        t = skv - sq + i  # bottom-right aligned position of query i
        parts = [kv[max(0, t - window + 1):max(0, t + 1)]]  # rows t - window < j <= t
        if comp is not None:
            closed = min(comp.shape[0], (t + 1) // ratio) if t + 1 > 0 else 0
            if topk is None:
                parts.append(comp[:closed])
            else:  # the listed rows in list order, repeats kept, those out of range skipped
                listed = topk[i]
                parts.append(comp[listed[(listed >= 0) & (listed < closed)]])
        keys = torch.cat(parts)  # (n, D)
        n = keys.shape[0]
        if n == 0 and sinks is None:
            continue  # nothing visible and no sink: out 0, lse -inf
        s = scale * (q[i] @ keys.T)  # (H, n)
        if sinks is not None:  # the sink joins the denominator and carries no value
            s = torch.cat([s, sinks[:, None]], dim=-1)
        m = s.amax(dim=-1, keepdim=True)
        e = torch.exp(s - m)
        z = e.sum(dim=-1, keepdim=True)
        if n:
            out[i] = (e[:, :n] / z) @ keys
        lse[:, i] = (torch.log(z) + m).squeeze(-1)
    return out, lse


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
) -> Tuple[Tensor, Tensor]:
    """DeepSeek-V4 attention by explicit per-query gathering; the oracle for dsv4.dsv4_attention.

    Query i of a sequence sits at t = Skv - Sq + i. Its keys (kv rows are keys and values):
    kv rows t - window < j <= t; with compressed_kv (ratio r), the closed rows
    w < min(Sc, floor((t + 1) / r)), all of them or, with topk_indices, those it lists (a listed
    index outside that range is skipped, a repeated one counts again). One softmax over them
    and the per-head sink. Dense: q (B, Sq, H, D), kv (B, Skv, D), compressed_kv (B, Sc, D),
    topk_indices (B, Sq, K) -> out (B, Sq, H, D), lse (B, H, Sq). Varlen: the same rows packed
    with cu_seqlens_q / _kv / _compressed -> out (total_q, H, D), lse (H, total_q).
    """
    q, kv, compressed_kv, sinks = map(_f64, (q, kv, compressed_kv, sinks))
    topk = None if topk_indices is None else topk_indices.detach().cpu().long()
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    run = lambda qs, kvs, cs, ts: _dsv4_sequence(  # noqa: E731
        qs, kvs, cs, ts, sinks, scale, window, compress_ratio)
    if cu_seqlens_q is None:
        outs, lses = zip(*[run(q[b], kv[b], None if compressed_kv is None else compressed_kv[b],
                               None if topk is None else topk[b]) for b in range(q.shape[0])]) \
            if q.shape[0] else ((), ())
        out = torch.stack(outs) if outs else torch.zeros(q.shape, dtype=torch.float64)
        lse = torch.stack(lses) if lses else torch.zeros(0, q.shape[2], q.shape[1],
                                                          dtype=torch.float64)
        return out, lse
    bq, bk = _seq_bounds(cu_seqlens_q), _seq_bounds(cu_seqlens_kv)
    bc = _seq_bounds(cu_seqlens_compressed) if compressed_kv is not None else [(0, 0)] * len(bq)
    out = torch.zeros(q.shape, dtype=torch.float64)
    lse = torch.full((q.shape[1], q.shape[0]), -math.inf, dtype=torch.float64)
    for (q0, q1), (k0, k1), (c0, c1) in zip(bq, bk, bc):
        if q1 == q0:
            continue
        o_seq, l_seq = run(q[q0:q1], kv[k0:k1],
                           None if compressed_kv is None else compressed_kv[c0:c1],
                           None if topk is None else topk[q0:q1])
        out[q0:q1] = o_seq
        lse[:, q0:q1] = l_seq
    return out, lse


# ----------------------------------------------------------------------------- paged FP8 KV cache


def kv_cache_rows(cache: Tensor, slots) -> Tensor:
    """The float64 rows (N, 512) that global slots name in a paged FP8 cache (README, "The
    paged FP8 KV cache"), decoded from the bytes: 448 float8_e4m3 values times their tile's
    2^(byte - 127), then 64 bf16 values. Every slot must be in range."""
    slots = [int(x) for x in slots]
    page = cache.shape[1]
    blocks = cache.detach().cpu()
    rows = torch.zeros(len(slots), 512, dtype=torch.float64)
    for i, slot in enumerate(slots):
        block = blocks[slot // page]
        flat = block.as_strided((block.shape[0] * 584,), (1,))  # the block's records, unpadded
        row = slot % page
        data = flat[row * 576:(row + 1) * 576]
        exps = flat[page * 576 + row * 8:page * 576 + row * 8 + 7].to(torch.float64) - 127
        fp8 = data[:448].view(torch.float8_e4m3fn).to(torch.float64).view(7, 64)
        rows[i, :448] = (fp8 * torch.exp2(exps).view(7, 1)).reshape(448)
        rows[i, 448:] = data[448:].clone().view(torch.bfloat16).to(torch.float64)
    return rows


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
) -> Tuple[Tensor, Tensor]:
    """The oracle of dsv4.dsv4_attention_paged, token by token in float64.

    Token t reads entry j of a list iff j < lengths[t] and 0 <= slot < num_blocks * P (repeats
    count again); one softmax over those rows (keys and values) and the per-head sink. Returns
    out (T, H, 512) and lse (H, T) without the sink (-inf where nothing is read)."""
    q, sinks = _f64(q), _f64(sinks)
    T, H, D = q.shape
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    lists = [(window_cache, window_slots, window_lengths)]
    if compressed_cache is not None:
        lists.append((compressed_cache, compressed_slots, compressed_lengths))
    rows = {}

    def decoded(cache, slot):
        if (id(cache), slot) not in rows:
            rows[(id(cache), slot)] = kv_cache_rows(cache, [slot])[0]
        return rows[(id(cache), slot)]

    out = torch.zeros(T, H, D, dtype=torch.float64)
    lse = torch.full((H, T), -math.inf, dtype=torch.float64)
    for t in range(T):
        read = []  # (cache, slot) of every entry token t reads, in list order
        for cache, slots, lengths in lists:
            capacity = cache.shape[0] * cache.shape[1]
            entries = slots[t].tolist()
            n = len(entries) if lengths is None else max(0, min(len(entries), int(lengths[t])))
            read += [(cache, s) for s in entries[:n] if 0 <= s < capacity]
        if not read:
            continue  # out 0, lse -inf
        keys = torch.stack([decoded(cache, s) for cache, s in read])  # (n, D)
        logits = scale * (q[t] @ keys.T)  # (H, n)
        lse[:, t] = torch.logsumexp(logits, dim=-1)
        if sinks is not None:  # the sink joins the denominator and carries no value
            logits = torch.cat([logits, sinks.view(H, 1)], dim=-1)
        p = torch.softmax(logits, dim=-1)
        if sinks is not None:  # a sink of +inf takes all the weight
            p = torch.where(torch.isposinf(sinks).view(H, 1), 0.0, p)
        out[t] = p[:, :len(read)] @ keys
    return out, lse


# ----------------------------------------------------------------------------- linear attention


def _recurrence(q, k, v, g, beta, scale, initial_state, cu_seqlens, op):
    """Shared driver for the token-by-token linear-attention oracles.

    q, k (B, T, H, K); v (B, T, HV, V); g (B, T, HV); beta (B, T, HV) or None (simple GLA).
    """
    q, k, v, g, beta, initial_state = map(_f64, (q, k, v, g, beta, initial_state))
    b, t_len, h, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    if hv % h != 0:
        raise ValueError(f"{op}: HV ({hv}) must be a multiple of H ({h})")
    if scale is None:
        scale = dk ** -0.5
    # v-head hv reads qk-head hv // (HV / H).
    q = q.repeat_interleave(hv // h, dim=2)
    k = k.repeat_interleave(hv // h, dim=2)

    if cu_seqlens is None:
        # One sequence per batch row; vectorize the recurrence over (B, HV).
        state = (initial_state.clone() if initial_state is not None
                 else torch.zeros(b, hv, dk, dv, dtype=torch.float64))
        o = torch.empty(b, t_len, hv, dv, dtype=torch.float64)
        for t in range(t_len):
            state, o[:, t] = _step(state, q[:, t], k[:, t], v[:, t], g[:, t],
                                   None if beta is None else beta[:, t], scale)
        return o, state

    if b != 1:
        raise ValueError(f"{op}: varlen needs B == 1 (got B = {b})")
    bounds = _seq_bounds(cu_seqlens)
    n_seq = len(bounds)
    final = (initial_state.clone() if initial_state is not None
             else torch.zeros(n_seq, hv, dk, dv, dtype=torch.float64))
    o = torch.zeros(1, t_len, hv, dv, dtype=torch.float64)
    for i, (t0, t1) in enumerate(bounds):
        state = final[i:i + 1]
        for t in range(t0, t1):
            state, o[:, t] = _step(state, q[:, t], k[:, t], v[:, t], g[:, t],
                                   None if beta is None else beta[:, t], scale)
        final[i] = state[0]
    return o, final


def _step(state, q_t, k_t, v_t, g_t, beta_t, scale):
    """One token. state (N, HV, K, V); q_t, k_t (N, HV, K); v_t (N, HV, V); g_t, beta_t (N, HV)."""
    state = state * torch.exp(g_t)[..., None, None]
    if beta_t is None:
        write = v_t  # simple GLA: S <- S + k v^T
    else:
        predicted = torch.einsum("nhk,nhkv->nhv", k_t, state)  # S^T k
        write = beta_t[..., None] * (v_t - predicted)  # delta rule: u = beta (v - S^T k)
    state = state + k_t[..., :, None] * write[..., None, :]
    o_t = scale * torch.einsum("nhk,nhkv->nhv", q_t, state)
    return state, o_t


def gated_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    *,
    scale: Optional[float] = None,
    initial_state: Optional[Tensor] = None,
    cu_seqlens: Optional[Tensor] = None,
    use_qk_l2norm_in_kernel: bool = False,
) -> Tuple[Tensor, Tensor]:
    """Gated delta rule, token by token; the oracle for dsv4.chunk_gated_delta_rule.

    Per token: S <- exp(g_t) S; u_t = beta_t (v_t - S^T k_t); S <- S + k_t u_t^T;
    o_t = scale S^T q_t. Returns o (B, T, HV, V) and final_state (N, HV, K, V), float64.
    use_qk_l2norm_in_kernel: q and k are replaced first by x / sqrt(sum x^2 + 1e-6) over K,
    rounded to their own dtype (flash-linear-attention's meaning).
    """
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    return _recurrence(q, k, v, g, beta, scale, initial_state, cu_seqlens,
                       "reference.gated_delta_rule")


def l2norm(x: Tensor, eps: float = 1e-6) -> Tensor:
    """x / sqrt(sum x^2 + eps) over the last dim, in float64, rounded back to x's dtype."""
    f = x.detach().to(device="cpu", dtype=torch.float64)
    return (f / torch.sqrt((f * f).sum(-1, keepdim=True) + eps)).to(x.dtype)


def simple_gla(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    *,
    scale: Optional[float] = None,
    initial_state: Optional[Tensor] = None,
    cu_seqlens: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    """Simple gated linear attention, token by token; the oracle for dsv4.chunk_simple_gla.

    Per token: S <- exp(g_t) S + k_t v_t^T; o_t = scale S^T q_t.
    Returns o (B, T, HV, V) and final_state (N, HV, K, V), float64.
    """
    return _recurrence(q, k, v, g, None, scale, initial_state, cu_seqlens,
                       "reference.simple_gla")


# ----------------------------------------------------------------------------- lightning indexer


def indexer_scores(q: Tensor, k: Tensor, weights: Tensor, positions: Tensor, compress_ratio: int,
                   scale: Optional[float] = None, k_scale: Optional[Tensor] = None) -> Tensor:
    """One sequence's indexer scores, float64 (Sq, Sc): sum_h weights[i, h] ReLU(scale
    q[i, h] . k[s]) (k rows times k_scale), and -inf where row s is not closed for query i
    (s >= min(Sc, (p_i + 1) // compress_ratio)). q (Sq, H, D), k (Sc, D), weights (Sq, H)."""
    qf, kf, wf = _f64(q), _f64(k), _f64(weights)
    if k_scale is not None:
        kf = kf * _f64(k_scale)[:, None]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    per_head = torch.relu(torch.einsum("ihd,sd->ihs", qf, kf) * scale)
    score = (per_head * wf[:, :, None]).sum(1)
    closed = torch.clamp((positions.detach().cpu().long() + 1) // compress_ratio, 0, kf.shape[0])
    visible = torch.arange(kf.shape[0])[None, :] < closed[:, None]
    return score.masked_fill(~visible, -math.inf)


def _topk_rows(score: Tensor, topk: int) -> Tensor:
    """Row indices by score, best first, ties to the lower row (-0 ties with +0), -1 past the
    visible rows (a NaN score is not visible)."""
    out = torch.full((score.shape[0], topk), -1, dtype=torch.int32)
    if score.shape[1] == 0:
        return out
    # + 0.0 turns -0 into +0; a stable descending sort keeps equal scores in row order.
    key = torch.where(torch.isnan(score), -math.inf, score + 0.0)
    order = torch.sort(key, dim=1, descending=True, stable=True).indices[:, :topk]
    visible = key.gather(1, order) > -math.inf
    out[:, :order.shape[1]] = torch.where(visible, order, -1).to(torch.int32)
    return out


def indexer_cache_rows(k_cache: Tensor, block_table_row: Tensor, n: int) -> Tensor:
    """Rows 0 .. n-1 of one request in vLLM's paged FP8 indexer cache, float64 (n, 128),
    decoded from the bytes: block b of the (num_blocks, P, 1, 132) uint8 view starts
    stride(0) bytes after block b - 1 and holds P rows of 128 float8_e4m3 values, then their P
    fp32 scales; row s lives in block block_table_row[s // P], row s % P."""
    blocks, rows = k_cache.shape[0], k_cache.shape[1]
    cache = k_cache.detach().cpu()  # a device copy drops the padding between blocks
    stride = cache.stride(0) if blocks > 1 else rows * 132
    raw = cache.as_strided((blocks, rows * 132), (stride, 1), cache.storage_offset())
    s = torch.arange(n)
    block = block_table_row.detach().cpu().long()[s // rows, None]
    r = (s % rows)[:, None]
    values = raw[block, 128 * r + torch.arange(128)].view(torch.float8_e4m3fn)
    scale = raw[block, 128 * rows + 4 * r + torch.arange(4)].view(torch.float32)
    return values.to(torch.float64) * scale.to(torch.float64)


def indexer_topk_paged(q: Tensor, k_cache: Tensor, weights: Tensor, positions: Tensor,
                       block_table: Tensor, context_lens: Tensor, *, topk: int,
                       compress_ratio: int, scale: Optional[float] = None) -> Tensor:
    """The oracle of dsv4_indexer_topk_paged, in float64: int32 (B, N, topk). Request b's rows
    are indexer_cache_rows(k_cache, block_table[b], context_lens[b]); a query at position p sees
    those below (p + 1) // compress_ratio."""
    out = torch.full((q.shape[0], q.shape[1], topk), -1, dtype=torch.int32)
    for b in range(q.shape[0]):
        keys = indexer_cache_rows(k_cache, block_table[b], int(context_lens[b]))
        out[b] = _topk_rows(indexer_scores(q[b], keys, weights[b], positions[b], compress_ratio,
                                           scale), topk)
    return out


def indexer_topk(q: Tensor, k: Tensor, weights: Tensor, positions: Tensor, *, topk: int,
                 compress_ratio: int, scale: Optional[float] = None,
                 k_scale: Optional[Tensor] = None, cu_seqlens_q: Optional[Tensor] = None,
                 cu_seqlens_k: Optional[Tensor] = None) -> Tensor:
    """The oracle of dsv4_indexer_topk, in float64: int32 (B, Sq, topk) dense or (T, topk)
    varlen (cu_seqlens over queries and over compressed rows)."""
    if cu_seqlens_q is None:
        return torch.stack([
            _topk_rows(indexer_scores(q[b], k[b], weights[b], positions[b], compress_ratio, scale,
                                      None if k_scale is None else k_scale[b]), topk)
            for b in range(q.shape[0])]) if q.shape[0] else torch.empty(0, q.shape[1], topk,
                                                                       dtype=torch.int32)
    out = torch.full((q.shape[0], topk), -1, dtype=torch.int32)
    for (q0, q1), (k0, k1) in zip(_seq_bounds(cu_seqlens_q), _seq_bounds(cu_seqlens_k)):
        if q1 > q0:
            out[q0:q1] = _topk_rows(indexer_scores(
                q[q0:q1], k[k0:k1], weights[q0:q1], positions[q0:q1], compress_ratio, scale,
                None if k_scale is None else k_scale[k0:k1]), topk)
    return out
