"""FlashMLA's public sparse interface for DeepSeek-V4, on dsv4_attn's ops.

An engine that calls FlashMLA's ``get_mla_metadata``, ``flash_mla_with_kvcache`` (sparse FP8
mode) and ``flash_mla_sparse_fwd`` can import them from here instead. Written from FlashMLA's
documented interface; the semantics kept:

- ``flash_mla_with_kvcache``: q (B, s_q, Hq, 512); k_cache (and extra_k_cache) a paged FP8 cache
  (num_blocks, P, 1, 584) (README, "The paged FP8 KV cache"; uint8, or the same bytes viewed as
  int8 / float8_e4m3fn); indices (B, s_q, topk) int32 global slots, -1 skipped;
  topk_length (B,) int32: only the first topk_length[b] entries of batch b's lists are read.
  Returns out (B, s_q, Hq, 512) and lse (B, Hq, s_q) fp32.
- ``flash_mla_sparse_fwd``: q (s_q, Hq, 512) bf16, kv (s_kv, 1, 512) bf16, indices
  (s_q, 1, topk) int32 (-1 or >= s_kv skipped), topk_length (s_q,). Returns (out, max_logits,
  lse), the last two (s_q, Hq) fp32.
- ``attn_sink`` (Hq,) fp32 scales the output by exp(lse) / (exp(lse) + exp(attn_sink)), and is
  not in lse; +inf gives out = 0. A query that reads no row gets out = 0 and lse = +inf.
- A repeated index counts twice.

Only head_dim 512 (DeepSeek-V4's 584-byte record) is served; V3.2's 656-byte record and the
dense modes raise NotImplementedError. The scheduler metadata is a placeholder: the ops plan on
the device, so it can be reused across any calls.
"""
import dataclasses
import math
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import ops

__all__ = ["FlashMLASchedMeta", "get_mla_metadata", "flash_mla_with_kvcache",
           "flash_mla_sparse_fwd"]

_D = 512
_RECORD = 584


@dataclasses.dataclass
class FlashMLASchedMeta:
    """FlashMLA's scheduler metadata, kept for its interface: dsv4_attn plans on the device
    at each call, so nothing here needs to match between calls."""
    have_initialized: bool = False
    tile_scheduler_metadata: Optional[Tensor] = None
    num_splits: Optional[Tensor] = None


def get_mla_metadata(*args, **kwargs) -> Tuple[FlashMLASchedMeta, None]:
    """An empty FlashMLASchedMeta and None, as FlashMLA returns them (its arguments are ignored)."""
    return FlashMLASchedMeta(), None


def _byte_cache(name: str, cache: Tensor) -> Tensor:
    """A cache as the uint8 view dsv4_attention_paged takes (the same bytes)."""
    if cache.dtype in (torch.int8, torch.float8_e4m3fn):
        cache = cache.view(torch.uint8)
    if cache.dim() == 4 and cache.size(-1) == 656:
        raise NotImplementedError(
            f"flash_mla_compat: {name} has 656-byte records (DeepSeek-V3.2's FP8 format); only "
            "DeepSeek-V4's 584-byte record is served")
    return cache


def _per_token_lengths(name: str, lengths: Optional[Tensor], b: int, s_q: int) -> Optional[Tensor]:
    if lengths is None:
        return None
    if lengths.dim() != 1 or lengths.size(0) != b:
        raise ValueError(f"flash_mla_with_kvcache: {name} must be (batch_size,) = ({b},) "
                         f"(got shape {tuple(lengths.shape)})")
    return lengths.view(b, 1).expand(b, s_q).reshape(b * s_q)


def _flash_mla_lse(lse: Tensor) -> Tensor:
    """FlashMLA's convention for a query that read no row: lse = +inf (ours is -inf)."""
    return torch.where(lse == -math.inf, math.inf, lse)


def flash_mla_with_kvcache(
    q: Tensor,
    k_cache: Tensor,
    block_table: Optional[Tensor],
    cache_seqlens: Optional[Tensor],
    head_dim_v: int,
    tile_scheduler_metadata: FlashMLASchedMeta,
    num_splits: None = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    is_fp8_kvcache: bool = False,
    indices: Optional[Tensor] = None,
    attn_sink: Optional[Tensor] = None,
    extra_k_cache: Optional[Tensor] = None,
    extra_indices_in_kvcache: Optional[Tensor] = None,
    topk_length: Optional[Tensor] = None,
    extra_topk_length: Optional[Tensor] = None,
    out: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    """FlashMLA's decode entry point, sparse FP8 mode (the module docstring gives the contract):
    one softmax over the rows `indices` names in k_cache and those `extra_indices_in_kvcache`
    names in extra_k_cache, with the sink. Runs dsv4_attention_paged."""
    if indices is None:
        raise NotImplementedError("flash_mla_compat: dense decode (indices=None) is not served; "
                                  "pass indices for the sparse FP8 mode")
    if not is_fp8_kvcache:
        raise NotImplementedError("flash_mla_compat: sparse decode reads the FP8 cache only; "
                                  "pass is_fp8_kvcache=True")
    if causal:
        raise ValueError("flash_mla_with_kvcache: causal must be False in sparse mode")
    if num_splits is not None:
        raise ValueError("flash_mla_with_kvcache: num_splits must be None")
    if not isinstance(tile_scheduler_metadata, FlashMLASchedMeta):
        raise TypeError("flash_mla_with_kvcache: tile_scheduler_metadata must come from "
                        f"get_mla_metadata() (got {type(tile_scheduler_metadata).__name__})")
    if head_dim_v != _D:
        raise ValueError(f"flash_mla_with_kvcache: head_dim_v must be {_D} (got {head_dim_v})")
    if q.dim() != 4:
        raise ValueError("flash_mla_with_kvcache: q must be (batch_size, seq_len_q, num_heads_q, "
                         f"head_dim) (got shape {tuple(q.shape)})")
    if (extra_k_cache is None) != (extra_indices_in_kvcache is None):
        raise ValueError("flash_mla_with_kvcache: extra_k_cache and extra_indices_in_kvcache "
                         "go together")
    b, s_q, h, d = q.shape
    if d != _D:
        raise NotImplementedError(f"flash_mla_compat: head_dim must be {_D} (got {d})")
    tile_scheduler_metadata.have_initialized = True
    t = b * s_q

    def flat_list(name, idx):
        if idx.dim() != 3 or tuple(idx.shape[:2]) != (b, s_q):
            raise ValueError(f"flash_mla_with_kvcache: {name} must be (batch_size, seq_len_q, "
                             f"topk) = ({b}, {s_q}, topk) (got shape {tuple(idx.shape)})")
        return idx.reshape(t, idx.size(-1))

    kw = dict(window_lengths=_per_token_lengths("topk_length", topk_length, b, s_q),
              sinks=attn_sink, scale=softmax_scale)
    if extra_k_cache is not None:
        kw.update(compressed_cache=_byte_cache("extra_k_cache", extra_k_cache),
                  compressed_slots=flat_list("extra_indices_in_kvcache", extra_indices_in_kvcache),
                  compressed_lengths=_per_token_lengths("extra_topk_length", extra_topk_length,
                                                        b, s_q))
    elif extra_topk_length is not None:
        raise ValueError("flash_mla_with_kvcache: extra_topk_length needs extra_k_cache")
    flat_out = None if out is None else out.view(t, h, d)
    res, lse = ops.dsv4_attention_paged(q.reshape(t, h, d), _byte_cache("k_cache", k_cache),
                                        flat_list("indices", indices), out=flat_out, **kw)
    out = res.view(b, s_q, h, d) if out is None else out
    return out, _flash_mla_lse(lse.view(h, b, s_q).permute(1, 0, 2)).contiguous()


def flash_mla_sparse_fwd(
    q: Tensor,
    kv: Tensor,
    indices: Tensor,
    sm_scale: float,
    d_v: int = 512,
    attn_sink: Optional[Tensor] = None,
    topk_length: Optional[Tensor] = None,
    out: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor, Tensor]:
    """FlashMLA's sparse prefill (the module docstring gives the contract): query i attends to
    the kv rows indices[i, 0, :topk_length[i]] names. Runs dsv4_attention (CSA rows of a
    window-free layer); the sink's factor and max_logits are extra torch passes here."""
    if d_v != _D or q.dim() != 3 or q.size(-1) != _D:
        raise NotImplementedError(f"flash_mla_compat: q must be (s_q, h_q, {_D}) with d_v = {_D} "
                                  f"(got q {tuple(q.shape)}, d_v {d_v})")
    if kv.dim() != 3 or kv.size(1) != 1 or kv.size(2) != _D:
        raise ValueError(f"flash_mla_sparse_fwd: kv must be (s_kv, 1, {_D}) (got shape "
                         f"{tuple(kv.shape)})")
    s_q, h, _ = q.shape
    s_kv = kv.size(0)
    if indices.dim() != 3 or indices.size(0) != s_q or indices.size(1) != 1:
        raise ValueError(f"flash_mla_sparse_fwd: indices must be (s_q, 1, topk) = ({s_q}, 1, topk) "
                         f"(got shape {tuple(indices.shape)})")
    idx = indices[:, 0]
    if topk_length is not None:
        if topk_length.shape != (s_q,):
            raise ValueError(f"flash_mla_sparse_fwd: topk_length must be (s_q,) = ({s_q},) "
                             f"(got shape {tuple(topk_length.shape)})")
        entry = torch.arange(idx.size(1), device=idx.device)
        idx = torch.where(entry.view(1, -1) < topk_length.view(-1, 1), idx, -1)
    # dsv4_attention's CSA rows with no window: query i sits at position s_kv - 1 + i, so every
    # row w < s_kv of kv is closed (ratio 1) and a listed w >= s_kv is skipped. Its kv argument
    # (the window's rows) is never read at window 0; it only gives the positions.
    positions = q.new_empty((1, max(0, s_kv + s_q - 1), _D))
    res, lse = ops.dsv4_attention(q[None], positions, window=0, compressed_kv=kv.view(1, s_kv, _D),
                                  compress_ratio=1, topk_indices=idx.to(torch.int32)[None],
                                  scale=sm_scale, return_lse=True)
    res, lse = res[0], lse[0].t()  # (s_q, h, 512), (s_q, h)
    if attn_sink is not None:
        keep = torch.sigmoid(lse - attn_sink.view(1, h))  # exp(lse) / (exp(lse) + exp(sink))
        res = (res.float() * keep.unsqueeze(-1)).to(res.dtype)
    max_logits = _max_logits(q, kv.view(s_kv, _D), idx, sm_scale)
    if out is not None:
        out.copy_(res)
        res = out
    return res, max_logits, _flash_mla_lse(lse).contiguous()


def _max_logits(q: Tensor, kv: Tensor, idx: Tensor, scale: float) -> Tensor:
    """max over the rows read of scale q·k, fp32 (s_q, h); -inf where none is read."""
    s_q, h, _ = q.shape
    k = idx.size(1)
    out = torch.empty(s_q, h, dtype=torch.float32, device=q.device)
    block = max(1, (1 << 26) // max(1, k * (_D + h)))
    for i0 in range(0, s_q, block):
        rows = idx[i0:i0 + block].long()
        valid = (rows >= 0) & (rows < kv.size(0))
        keys = kv.index_select(0, torch.where(valid, rows, 0).flatten()).view(*rows.shape, _D)
        s = torch.bmm(q[i0:i0 + block].float(), keys.float().transpose(1, 2)) * scale
        s.masked_fill_(~valid.unsqueeze(1), -math.inf)
        out[i0:i0 + block] = s.amax(-1) if k > 0 else -math.inf
    return out
