"""dsv4_attn.integrations.transformers.enable(model) against the models' own attention code.

Tiny random-init models of transformers (pinned in the test extra; a missing transformers
fails here, it is never skipped):
- DeepSeek-V4 with a sliding-only, a CSA and an HCA layer (random sinks and position biases,
  which the model initialises to zero): prefill of a few hundred tokens, then decode steps
  through generate() with the model's own cache; logits against the eager implementation. The
  CSA layer's indexer picks its top 16 of up to 75 compressed rows through dsv4_indexer_topk.
  It has 8 index heads: with 2, a fifth of the rows score exactly 0 (ReLU of every head), and
  torch.topk's order among such ties is arbitrary where the op's takes the lower row.
- Qwen3-Next with Gated DeltaNet and full-attention layers: the same, against its torch path.

In fp32 (DeepSeek-V4) the logits must match closely. In bf16 FlashAttention's rule applies:
against the fp32 model (same bf16-rounded weights, same tokens), our error may be at most
twice the model's own bf16 error plus a small term. Every enabled layer must have called a
dsv4 op on every forward.
"""
import collections
import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
import transformers  # noqa: F401  (a hard requirement of the test extra)
from transformers import (DeepseekV4Config, DeepseekV4ForCausalLM, Qwen3NextConfig,
                          Qwen3NextForCausalLM)

from dsv4_attn.integrations.transformers import enable, op_calls

PROMPT, NEW_TOKENS = 300, 5


def _rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def _tiny_deepseek_v4():
    torch.manual_seed(0)
    cfg = DeepseekV4Config(
        vocab_size=128, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=3,
        num_attention_heads=8, head_dim=64, q_lora_rank=32, n_routed_experts=4,
        num_experts_per_tok=2, o_groups=2, o_lora_rank=16, index_n_heads=8, index_head_dim=32,
        index_topk=16, sliding_window=32, num_nextn_predict_layers=0,
        layer_types=["sliding_attention", "compressed_sparse_attention",
                     "heavily_compressed_attention"])
    model = DeepseekV4ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("sinks") or name.endswith("position_bias"):
                p.normal_()  # zero at init: random values make them matter
            p.copy_(p.bfloat16().float())  # exactly representable in bf16 too
    return model


def _tiny_qwen3_next():
    torch.manual_seed(0)
    cfg = Qwen3NextConfig(
        vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        layer_types=["linear_attention", "linear_attention", "full_attention",
                     "linear_attention"])
    model = Qwen3NextForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.bfloat16().float())
    return model


def _stepwise_logits(model, ids, new_tokens):
    """Prefill ids with a cache, then feed new_tokens one by one: [prefill last, step 1, ...]."""
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
        logits, cache = [out.logits[0, -1]], out.past_key_values
        for tok in new_tokens[:-1]:
            out = model(input_ids=tok.view(1, 1), past_key_values=cache, use_cache=True)
            logits.append(out.logits[0, -1])
            cache = out.past_key_values
    return torch.stack(logits), out


def _generate(model, ids):
    with torch.no_grad():
        g = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, output_logits=True,
                           return_dict_in_generate=True)
    return g.sequences[0, ids.shape[1]:], torch.stack(g.logits)[:, 0]


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request):
    return torch.device(request.param)


def test_deepseek_v4_fp32_matches_eager(device):
    eager = _tiny_deepseek_v4().to(device)
    ours = enable(copy.deepcopy(eager))
    ids = torch.randint(0, 128, (1, PROMPT), generator=torch.Generator().manual_seed(1)).to(device)
    with torch.no_grad():
        prefill_ours, prefill_eager = ours(ids).logits, eager(ids).logits
    assert _rel(prefill_ours, prefill_eager) < 1e-4
    tokens, gen_logits = _generate(ours, ids)
    want, _ = _stepwise_logits(eager, ids, tokens)
    assert _rel(gen_logits, want) < 1e-4
    calls = op_calls(ours)
    # One prefill forward, then generate(): its prefill and NEW_TOKENS - 1 decode steps; the
    # three attention layers and the CSA layer's indexer.
    assert len(calls) == 4 and set(calls.values()) == {1 + NEW_TOKENS}, calls
    assert any(name.endswith("indexer") for name in calls), calls
    assert ours.config._attn_implementation == "dsv4_attn"


class _DsvOpCalls(TorchDispatchMode):
    """Counts the dsv4 ops dispatched under it, by name."""

    def __init__(self):
        super().__init__()
        self.count = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "dsv4":
            self.count[func.__name__.split(".")[0]] += 1
        return func(*args, **(kwargs or {}))


class _TopkCalls(torch.overrides.TorchFunctionMode):
    """Records the input shapes of every torch top-k call made under it."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.topk, torch.Tensor.topk):
            self.shapes.append(tuple(args[0].shape))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("seq", [3, 40, 300])  # no closed row, some, more than index_topk
def test_deepseek_v4_indexer_returns_the_ops_picks(device, seq):
    """The routed indexer returns the op's picks from inside its own forward: the eager
    indexer's output, exactly, with no top-k over a (B, S, Sc) score tensor (the model's
    masked scores are never built)."""
    eager = _tiny_deepseek_v4().to(device)
    ours = enable(copy.deepcopy(eager))
    [(name, mine)] = [(n, m) for n, m in ours.named_modules() if n.endswith("indexer")]
    theirs = eager.get_submodule(name)
    scores = {}
    theirs.scorer.register_forward_hook(lambda module, args, out: scores.update(eager=out))
    g = torch.Generator().manual_seed(seq)
    hidden = torch.randn(2, seq, 64, generator=g).to(device)
    q_residual = torch.randn(2, seq, 32, generator=g).to(device)
    positions = torch.arange(seq).expand(2, seq).to(device)
    with torch.no_grad():
        want = theirs(hidden, q_residual, positions, None, 1)
        with _TopkCalls() as topk:
            got = mine(hidden, q_residual, positions, None, 1)
    assert got.dtype == want.dtype == torch.int64 and got.shape == want.shape
    assert torch.equal(got < 0, want < 0)  # as many visible rows, the -1s last
    # The same rows in the same order, but where scores tie (rows whose every head's product
    # is negative score exactly 0) the op takes the lower row and torch.topk any: compare the
    # eager scores of both picks, rank by rank.
    eager_scores = scores["eager"]
    score_of = lambda picks: eager_scores.gather(-1, picks.clamp(min=0))
    torch.testing.assert_close(score_of(got), score_of(want), rtol=1e-5, atol=1e-7)
    untied = score_of(want) > score_of(want)[..., -1:] + 1e-6  # above the k-th, not tied to it
    assert torch.equal(torch.where(untied, got, 0).sort(-1).values,
                       torch.where(untied, want, 0).sort(-1).values)
    closed = seq // 4
    assert topk.shapes == ([(2, seq, 0)] if closed == 0 else []), topk.shapes
    assert mine._dsv4_calls == (1 if closed else 0)


def test_deepseek_v4_bf16_flash_attention_rule(device):
    ref32 = _tiny_deepseek_v4().to(device)
    eager16 = copy.deepcopy(ref32).to(torch.bfloat16)
    ours16 = enable(copy.deepcopy(ref32).to(torch.bfloat16))
    ids = torch.randint(0, 128, (1, PROMPT), generator=torch.Generator().manual_seed(2)).to(device)
    tokens, ours_logits = _generate(ours16, ids)
    want, _ = _stepwise_logits(ref32, ids, tokens)
    eager_logits, _ = _stepwise_logits(eager16, ids, tokens)
    ours_err, eager_err = _rel(ours_logits, want), _rel(eager_logits, want)
    assert ours_err <= 2 * eager_err + 1e-3, (ours_err, eager_err)
    calls = op_calls(ours16)
    assert len(calls) == 4 and set(calls.values()) == {NEW_TOKENS}, calls
    assert any(name.endswith("indexer") for name in calls), calls


def test_qwen3_next_bf16_flash_attention_rule(device):
    ref32 = _tiny_qwen3_next().to(device)
    torch16 = copy.deepcopy(ref32).to(torch.bfloat16)
    ours16 = enable(copy.deepcopy(ref32).to(torch.bfloat16))
    ids = torch.randint(0, 128, (1, 200), generator=torch.Generator().manual_seed(3)).to(device)
    with torch.no_grad():
        pre = [m(ids).logits.float() for m in (ours16, torch16, ref32)]
    assert _rel(pre[0], pre[2]) <= 2 * _rel(pre[1], pre[2]) + 1e-3
    tokens, ours_logits = _generate(ours16, ids)
    want, _ = _stepwise_logits(ref32, ids, tokens)
    torch_logits, _ = _stepwise_logits(torch16, ids, tokens)
    ours_err, torch_err = _rel(ours_logits, want), _rel(torch_logits, want)
    assert ours_err <= 2 * torch_err + 1e-3, (ours_err, torch_err)
    calls = op_calls(ours16)
    assert len(calls) == 3 and set(calls.values()) == {1 + NEW_TOKENS}, calls


def test_padded_batches_are_refused():
    model = enable(_tiny_deepseek_v4())
    ids = torch.randint(0, 128, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, :3] = 0
    with pytest.raises(NotImplementedError, match="padded batches"):
        model(input_ids=ids, attention_mask=mask)


def test_unsupported_model_is_refused():
    with pytest.raises(ValueError, match="unsupported model type"):
        enable(torch.nn.Linear(2, 2))


def test_qwen3_next_fp32_matches_torch(device):
    """fp32 Qwen3-Next: the chunked op (reference path for fp32) in prefill and the decode-step
    op in the cached steps, against the model's own torch path."""
    eager = _tiny_qwen3_next().to(device)
    ours = enable(copy.deepcopy(eager))
    ids = torch.randint(0, 128, (1, 200), generator=torch.Generator().manual_seed(4)).to(device)
    with torch.no_grad():
        assert _rel(ours(ids).logits, eager(ids).logits) < 1e-4
    with _DsvOpCalls() as ops:
        tokens, gen_logits = _generate(ours, ids)
    want, _ = _stepwise_logits(eager, ids, tokens)
    assert _rel(gen_logits, want) < 1e-4
    calls = op_calls(ours)
    assert len(calls) == 3 and set(calls.values()) == {1 + NEW_TOKENS}, calls
    # generate(): the prefill through the chunked op, every cached step through the decode op.
    assert ops.count == {"chunk_gated_delta_rule": 3,
                         "gated_delta_rule_decode": 3 * (NEW_TOKENS - 1)}, ops.count
