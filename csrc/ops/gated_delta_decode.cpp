// gated_delta_rule_decode: the sm90 decode-step kernel (csrc/sm90/linear_decode), and elsewhere
// the same recurrence as ATen ops, token by token.
#include "ops/gated_delta_decode.h"

#include <c10/core/DeviceGuard.h>

#include <cmath>

#include "ops/checks.h"
#include "ops/chunk.h"

namespace dsv4 {
namespace {
constexpr const char* kOp = "gated_delta_rule_decode";

// q or k (B, T, H, D) -> fp32 (B, T, HV, D), each v-head reading qk-head hv / (HV / H), first
// l2-normalized over D and rounded to the input's dtype when asked (the chunk op's rule).
at::Tensor per_v_head(const at::Tensor& x, int64_t heads_v, bool l2norm) {
  const at::Tensor f = (l2norm ? l2norm_rows(x) : x).to(at::kFloat);
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), D = x.size(3);
  if (H == heads_v) return f;
  return f.unsqueeze(3).expand({B, T, H, heads_v / H, D}).reshape({B, T, heads_v, D});
}

Route<GatedDeltaDecodePlan> route(const GatedDeltaDecodeCall& c, bool for_plan) {
  const Overrides overrides = read_overrides();
  return route_gated_delta_decode(c, device_facts(c.q, overrides, for_plan));
}

}  // namespace

GatedDeltaDecodeCall check_gated_delta_decode_inputs(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
    const at::Tensor& beta, const at::Tensor& state,
    const std::optional<at::Tensor>& state_indices, std::optional<double> scale,
    bool use_qk_l2norm_in_kernel) {
  check_qkv(kOp, q, k, v, /*allow_fp32=*/true);
  check_dim(kOp, "q", q, 4, "(B, T, H, K)");
  check_dim(kOp, "v", v, 4, "(B, T, HV, V)");
  TORCH_CHECK(k.sizes() == q.sizes(), kOp, ": k must have q's shape ", shape_str(q), " (got ",
              shape_str(k), ")");
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3);
  check_size(kOp, "v", v, 0, B, "B, as in q");
  check_size(kOp, "v", v, 1, T, "T, as in q");
  const int64_t HV = v.size(2), V = v.size(3);
  TORCH_CHECK(T >= 1, kOp, ": q must hold at least one token per sequence (got T = ", T, ")");
  TORCH_CHECK(K > 0 && V > 0, kOp, ": the key and value dims must be positive (got K = ", K,
              ", V = ", V, ")");
  TORCH_CHECK((H > 0 && HV % H == 0) || (H == 0 && HV == 0), kOp,
              ": the v-heads HV must be a multiple of the qk-heads H (got H = ", H, ", HV = ", HV,
              ")");
  for (const auto& [name, t] : {std::pair{"g", &g}, std::pair{"beta", &beta}}) {
    check_defined(kOp, name, *t);
    check_same_device(kOp, name, *t, "q", q);
    check_gate_dtype(kOp, name, *t);
    TORCH_CHECK(t->dim() == 3 && t->size(0) == B && t->size(1) == T && t->size(2) == HV, kOp,
                ": ", name, " must have shape (B, T, HV) = (", B, ", ", T, ", ", HV, ") (got ",
                shape_str(*t), ")");
  }
  check_defined(kOp, "state", state);
  check_same_device(kOp, "state", state, "q", q);
  TORCH_CHECK(state.scalar_type() == at::kFloat || state.scalar_type() == at::kBFloat16, kOp,
              ": state must be fp32 or bf16 (got ", state.scalar_type(), ")");
  TORCH_CHECK(state.dim() == 4 && state.size(1) == HV && state.size(2) == K && state.size(3) == V,
              kOp, ": state must have shape (N, HV, K, V) with HV = ", HV, ", K = ", K, ", V = ",
              V, " (got ", shape_str(state), ")");
  if (state_indices.has_value()) {
    const at::Tensor& idx = *state_indices;
    check_same_device(kOp, "state_indices", idx, "q", q);
    TORCH_CHECK(idx.scalar_type() == at::kInt || idx.scalar_type() == at::kLong, kOp,
                ": state_indices must be int32 or int64 (got ", idx.scalar_type(), ")");
    TORCH_CHECK(idx.dim() == 1 && idx.size(0) == B, kOp,
                ": state_indices must have shape (B,) = (", B, ") (got ", shape_str(idx), ")");
  } else {
    TORCH_CHECK(state.size(0) == B, kOp,
                ": without state_indices, state must hold one state per sequence, N = B = ", B,
                " (got N = ", state.size(0), ")");
  }
  check_scale(kOp, scale);
  GatedDeltaDecodeCall c;
  c.q = q;
  c.k = k;
  c.v = v;
  c.g = g.to(at::kFloat).contiguous();  // no copy when already fp32 and contiguous
  c.beta = beta.to(at::kFloat).contiguous();
  c.state = state;
  c.state_indices = state_indices;
  c.scale = scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(K));
  c.qk_l2norm = use_qk_l2norm_in_kernel;
  return c;
}

at::Tensor gated_delta_rule_decode(const GatedDeltaDecodeCall& c) {
  c10::DeviceGuard guard(c.q.device());
  at::Tensor o = at::empty(c.v.sizes(), c.v.options().memory_format(at::MemoryFormat::Contiguous));
  if (const Route<GatedDeltaDecodePlan> r = route(c, false); r.sm90) {
    run_gated_delta_decode(c, r.plan, o);
    return o;
  }
  // The reference path: the sequences' states gathered (a GPU syncs here to drop skipped
  // slots), the recurrence token by token in fp32, the states written back.
  const int64_t B = c.q.size(0), T = c.q.size(1), HV = c.v.size(2);
  o.zero_();
  if (B == 0 || HV == 0) return o;
  at::Tensor rows = at::arange(B, c.q.options().dtype(at::kLong));
  at::Tensor slots = rows;
  if (c.state_indices) {
    slots = c.state_indices->to(at::kLong);
    const at::Tensor keep = at::nonzero((slots >= 0) & (slots < c.state.size(0))).squeeze(1);
    rows = keep;
    slots = slots.index_select(0, keep);
  }
  if (rows.numel() == 0) return o;
  const at::Tensor q = per_v_head(c.q.index_select(0, rows), HV, c.qk_l2norm);
  const at::Tensor k = per_v_head(c.k.index_select(0, rows), HV, c.qk_l2norm);
  const at::Tensor v = c.v.index_select(0, rows).to(at::kFloat);
  const at::Tensor g = c.g.index_select(0, rows), beta = c.beta.index_select(0, rows);
  at::Tensor S = c.state.index_select(0, slots).to(at::kFloat);  // (n, HV, K, V)
  std::vector<at::Tensor> outs;
  for (int64_t t = 0; t < T; ++t) {
    S = S * g.select(1, t).exp().unsqueeze(-1).unsqueeze(-1);
    const at::Tensor kt = k.select(1, t).unsqueeze(-2);  // (n, HV, 1, K)
    const at::Tensor w = at::matmul(kt, S);              // (n, HV, 1, V)
    const at::Tensor u = beta.select(1, t).unsqueeze(-1).unsqueeze(-1) *
                         (v.select(1, t).unsqueeze(-2) - w);
    S = S + at::matmul(kt.transpose(-1, -2), u);
    outs.push_back(at::matmul(q.select(1, t).unsqueeze(-2), S).squeeze(-2) * c.scale);
  }
  o.index_copy_(0, rows, at::stack(outs, 1).to(o.scalar_type()));
  c.state.index_copy_(0, slots, S.to(c.state.scalar_type()));
  return o;
}

std::string gated_delta_rule_decode_path(const GatedDeltaDecodeCall& c) {
  return route(c, false).sm90 ? "sm90" : "reference";
}

std::string gated_delta_rule_decode_plan(const GatedDeltaDecodeCall& c) {
  const Route<GatedDeltaDecodePlan> r = route(c, true);
  return r.sm90 ? "sm90 " + describe(r.plan) : "reference: " + r.why_not;
}

}  // namespace dsv4
