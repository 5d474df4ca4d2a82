"""Run Hugging Face transformers models through dsv4_attn's ops: ``enable(model)``.

- DeepSeek-V4 (``model_type == "deepseek_v4"``): every attention layer, sliding-only, CSA and
  HCA, in prefill and in cached decode, runs through ``torch.ops.dsv4.dsv4_attention``. The
  function is registered as the attention implementation ``"dsv4_attn"``. Each CSA layer's
  lightning indexer scores and picks its top-k through ``torch.ops.dsv4.dsv4_indexer_topk``
  (exact mode, fp32 as the model scores), and its forward returns the op's picks: the
  indexer's (B, S, Sc) scores and their top-k are never built (the compressors' block bias
  still is).
- Qwen3-Next (``model_type == "qwen3_next"``): every Gated DeltaNet layer runs through
  ``torch.ops.dsv4.chunk_gated_delta_rule`` (with ``use_qk_l2norm_in_kernel``) for the chunked
  prefill, and ``torch.ops.dsv4.gated_delta_rule_decode`` for the cached decode steps.

Where the structure comes from (DeepSeek-V4). The attention function receives q, one K = V
tensor (window rows then compressed rows) and an additive mask. Rather than decode the mask,
the structure is read off the modules, with forward hooks: the compressor's output gives the
number of compressed rows, the lightning indexer's output gives the top-k indices (CSA), and
the cache's ``cumulative_length`` gives the absolute position of the newest token. No mask
function is registered, so the model builds no dense mask for this implementation at all.

What a call costs on top of the op. The cache keeps only the last ``sliding_window - 1``
tokens, while the op places kv rows at positions 0 ... Skv - 1 (and derives which compressed
rows are closed from the query positions). When the window does not start at position 0, it
is copied into the tail of an uninitialised (B, position + 1, D) buffer, whose leading rows are
never read: one allocation and a copy of at most ``sliding_window + Sq`` rows per layer call,
no mask, no host sync. The top-k indices are cast to int32 (B x Sq x K elements).

Limits: batches must be unpadded (a 2-D attention_mask with zeros is refused, one host check
per forward); training (dropout) is not supported, the ops being forward-only.
"""
import functools
import inspect
import types
from typing import Dict

import torch

ATTN_IMPLEMENTATION = "dsv4_attn"

__all__ = ["enable", "op_calls", "ATTN_IMPLEMENTATION"]


def enable(model):
    """Route the model's attention (DeepSeek-V4) or Gated DeltaNet (Qwen3-Next) layers through
    dsv4_attn's ops. Returns the model. Calling it twice is harmless."""
    import dsv4_attn  # noqa: F401  (registers torch.ops.dsv4)

    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type == "deepseek_v4":
        _enable_deepseek_v4(model)
    elif model_type == "qwen3_next":
        _enable_qwen3_next(model)
    else:
        raise ValueError(f"dsv4_attn.integrations.transformers.enable: unsupported model type "
                         f"{model_type!r} (supported: 'deepseek_v4', 'qwen3_next')")
    return model


def op_calls(model) -> Dict[str, int]:
    """Per enabled layer (module name), how many times it called a dsv4 op."""
    return {name: m._dsv4_calls for name, m in model.named_modules() if hasattr(m, "_dsv4_calls")}


def _refuse_padding(module, args, kwargs):
    mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
    if isinstance(mask, torch.Tensor) and mask.dim() == 2 and not bool(mask.all()):
        raise NotImplementedError(
            "dsv4_attn.integrations.transformers: padded batches (an attention_mask with zeros) "
            "are not supported; run sequences unpadded, one per batch row of equal length")


def _guard_padding(model) -> None:
    if not getattr(model, "_dsv4_padding_guard", False):
        model._dsv4_padding_guard = True
        model.register_forward_pre_hook(_refuse_padding, with_kwargs=True)


def _mark(module) -> bool:
    """Marks a module as enabled; False if it already was."""
    if hasattr(module, "_dsv4_calls"):
        return False
    module._dsv4_calls = 0
    return True


# ----------------------------------------------------------------------------- DeepSeek-V4


def _enable_deepseek_v4(model):
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, _deepseek_v4_attention)
    model.set_attn_implementation(ATTN_IMPLEMENTATION)
    _guard_padding(model)
    for module in model.modules():
        if type(module).__name__ != "DeepseekV4Attention" or not _mark(module):
            continue
        module._dsv4_step = {}
        module.register_forward_pre_hook(_remember_call, with_kwargs=True)
        if module.compressor is not None:
            module.compressor.register_forward_hook(functools.partial(_remember_compressed, module))
            indexer = getattr(module.compressor, "indexer", None)
            if indexer is not None:
                indexer.register_forward_hook(functools.partial(_remember_topk, module))
                _route_indexer(indexer)


def _remember_call(attn, args, kwargs):
    attn._dsv4_step = {"cache": kwargs.get("past_key_values")}


def _remember_compressed(attn, compressor, args, output):
    attn._dsv4_step["compressed_rows"] = output[0].shape[2]  # (compressed_kv (B, 1, Sc, D), bias)


def _remember_topk(attn, indexer, args, output):
    attn._dsv4_step["topk"] = output  # (B, Sq, K) int64, -1 where nothing is selected


class _IndexerPicks(Exception):
    """The op's picks, carried out of the indexer's forward from inside its scorer."""

    def __init__(self, picks: torch.Tensor):
        super().__init__()
        self.picks = picks


def _route_indexer(indexer) -> None:
    """The indexer's scoring and top-k through dsv4_indexer_topk (exact mode). The indexer's
    forward runs as before (its compressor and cache updates all come before the scorer), and
    its scorer calls the op and raises the picks, which the indexer's forward returns: the
    model's own causal mask and topk over a (B, S, Sc) fp32 score tensor, the rest of that
    forward, never run. The op gives what they would: the visible rows best first, then -1."""
    if not _mark(indexer):
        return
    scorer = indexer.scorer
    scorer.forward = types.MethodType(functools.partial(_indexer_scores, indexer), scorer)
    indexer.forward = types.MethodType(_indexer_forward, indexer)


def _indexer_forward(indexer, hidden_states, q_residual, position_ids, *args, **kwargs):
    """DeepseekV4Indexer.forward, returning the picks its scorer raises."""
    indexer._dsv4_positions = position_ids
    try:
        return type(indexer).forward(indexer, hidden_states, q_residual, position_ids, *args,
                                     **kwargs)
    except _IndexerPicks as done:
        return done.picks


def _indexer_scores(indexer, scorer, q, compressed_kv, hidden_states):
    """DeepseekV4IndexerScorer.forward's arguments: q (B, S, H, d), compressed_kv (B, T, d),
    hidden_states (B, S, hidden). Raises the op's picks (B, S, min(topk, T)) int64 for the
    indexer's forward to return (see _route_indexer); with no compressed rows it returns the
    model's empty (B, S, 0) scores instead."""
    n_rows = compressed_kv.shape[1]
    top_k = min(indexer.index_topk, n_rows)
    if top_k == 0:
        return q.new_zeros((q.shape[0], q.shape[1], n_rows), dtype=torch.float32)
    weights = scorer.weights_proj(hidden_states).float() * scorer.weights_scaling
    picks = torch.ops.dsv4.dsv4_indexer_topk(
        q.float(), compressed_kv.float(), weights, indexer._dsv4_positions,
        topk=top_k, compress_ratio=indexer.compress_rate, scale=scorer.softmax_scale)
    indexer._dsv4_calls += 1
    raise _IndexerPicks(picks.long())  # the model's dtype for indices


def _deepseek_v4_attention(module, query, key, value, attention_mask, scaling, dropout=0.0,
                           sliding_window=None, s_aux=None, **kwargs):
    """transformers' attention interface: query (B, H, Sq, D); key is value, (B, 1, T, D) with
    the window rows first and the compressed rows after them. Returns (out (B, Sq, H, D), None)."""
    if dropout:
        raise NotImplementedError("dsv4_attn: the ops are forward-only (no attention dropout)")
    step = module._dsv4_step
    kv = key[:, 0]  # (B, T, D), a view
    batch, _, dim = kv.shape
    compressor = module.compressor
    n_compressed = step.get("compressed_rows", 0) if compressor is not None else 0
    n_window = kv.shape[1] - n_compressed
    window_kv = kv[:, :n_window]
    # Absolute positions: the newest window row is token cumulative_length - 1.
    cache = step.get("cache")
    seen = cache.layers[module.layer_idx].cumulative_length if cache is not None else n_window
    if seen > n_window:
        placed = window_kv.new_empty(batch, seen, dim)
        placed[:, seen - n_window:] = window_kv
        window_kv = placed
    topk = step.get("topk")
    out = torch.ops.dsv4.dsv4_attention(
        query.transpose(1, 2), window_kv,
        sinks=s_aux.float() if s_aux is not None else None,
        window=sliding_window if sliding_window is not None else module.sliding_window,
        compressed_kv=kv[:, n_window:] if compressor is not None else None,
        compress_ratio=compressor.compress_rate if compressor is not None else 0,
        topk_indices=topk.to(torch.int32) if topk is not None else None,
        scale=scaling,
    )[0]
    module._dsv4_calls += 1
    return out, None


# ----------------------------------------------------------------------------- Qwen3-Next

_QWEN3_NEXT_GDR_NAMES = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule")


def _enable_qwen3_next(model):
    _guard_padding(model)
    for module in model.modules():
        if type(module).__name__ != "Qwen3NextGatedDeltaNet" or not _mark(module):
            continue
        forward = inspect.unwrap(type(module).forward)
        missing = [n for n in _QWEN3_NEXT_GDR_NAMES if n not in forward.__code__.co_names]
        if missing:
            raise RuntimeError(
                f"dsv4_attn.integrations.transformers: Qwen3NextGatedDeltaNet.forward of this "
                f"transformers version does not call {missing}; see the pinned version in "
                "pyproject's test extra")
        adapter = functools.partial(_gated_delta_rule, module)
        # The layer's own forward, with its two gated-delta functions resolved to ours.
        scope = dict(forward.__globals__, **{n: adapter for n in _QWEN3_NEXT_GDR_NAMES})
        rebound = types.FunctionType(forward.__code__, scope, forward.__name__,
                                     forward.__defaults__, forward.__closure__)
        rebound.__kwdefaults__ = forward.__kwdefaults__
        module.forward = types.MethodType(rebound, module)


def _gated_delta_rule(module, query, key, value, g, beta, chunk_size=64, initial_state=None,
                      output_final_state=False, use_qk_l2norm_in_kernel=False, cu_seqlens=None,
                      **unused):
    """flash-linear-attention's call convention: q, k (B, T, H, K), v (B, T, HV, V), g and
    beta (B, T, HV); initial_state (N, HV, K, V). Returns (o, final_state or None). A cached
    step of a few tokens (T <= 4, with a state) runs the decode-step op on a copy of the
    state; longer calls the chunked op."""
    if initial_state is not None and cu_seqlens is None and query.shape[1] <= 4:
        state = initial_state.to(torch.float32, copy=True).contiguous()
        o = torch.ops.dsv4.gated_delta_rule_decode(
            query, key, value, g, beta, state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
        module._dsv4_calls += 1
        return o, state if output_final_state else None
    o, final_state = torch.ops.dsv4.chunk_gated_delta_rule(
        query, key, value, g, beta,
        initial_state=initial_state.float() if initial_state is not None else None,
        output_final_state=output_final_state, cu_seqlens=cu_seqlens,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
    module._dsv4_calls += 1
    return o, final_state
