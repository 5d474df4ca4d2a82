// merge_attn_states: exact attention over the union of two disjoint key sets from each set's
// fmha (out, lse), in both of fmha's layouts. One fused kernel on sm90 (csrc/sm90/merge);
// elsewhere the same arithmetic as ATen elementwise ops.
#include <c10/core/DeviceGuard.h>

#include <limits>

#include "ops/checks.h"
#include "ops/merge_attn_states.h"
#include "sm90/merge/api.h"

namespace dsv4 {
namespace {
constexpr const char* kOp = "merge_attn_states";

// lse in fmha's layout -> fp32 view broadcastable against out:
//   dense  out (B, Sq, H, Dv), lse (B, H, Sq)  -> (B, Sq, H, 1)
//   varlen out (total, H, Dv), lse (H, total)  -> (total, H, 1)
at::Tensor lse_as_out(const at::Tensor& lse, int64_t out_dim) {
  return out_dim == 4 ? lse.permute({0, 2, 1}).unsqueeze(-1) : lse.t().unsqueeze(-1);
}
}  // namespace

MergeCall check_merge_inputs(const at::Tensor& out_a, const at::Tensor& lse_a,
                             const at::Tensor& out_b, const at::Tensor& lse_b) {
  check_defined(kOp, "out_a", out_a);
  check_defined(kOp, "lse_a", lse_a);
  check_defined(kOp, "out_b", out_b);
  check_defined(kOp, "lse_b", lse_b);
  check_float_dtype(kOp, "out_a", out_a);
  check_same_dtype(kOp, "out_b", out_b, "out_a", out_a);
  check_dtype(kOp, "lse_a", lse_a, at::kFloat);
  check_dtype(kOp, "lse_b", lse_b, at::kFloat);
  check_same_device(kOp, "lse_a", lse_a, "out_a", out_a);
  check_same_device(kOp, "out_b", out_b, "out_a", out_a);
  check_same_device(kOp, "lse_b", lse_b, "out_a", out_a);
  TORCH_CHECK(out_a.dim() == 4 || out_a.dim() == 3, kOp,
              ": out_a must be (B, Sq, H, Dv) or (total_q, H, Dv) (got shape ", shape_str(out_a),
              ")");
  TORCH_CHECK(out_b.sizes() == out_a.sizes(), kOp, ": out_b must have out_a's shape ",
              shape_str(out_a), " (got ", shape_str(out_b), ")");
  std::vector<int64_t> want_lse =
      out_a.dim() == 4 ? std::vector<int64_t>{out_a.size(0), out_a.size(2), out_a.size(1)}
                       : std::vector<int64_t>{out_a.size(1), out_a.size(0)};
  const char* layout = out_a.dim() == 4 ? "(B, H, Sq)" : "(H, total_q)";
  TORCH_CHECK(lse_a.sizes() == at::IntArrayRef(want_lse), kOp, ": lse_a must have shape ", layout,
              " = ", at::IntArrayRef(want_lse), " to match out_a (got ", shape_str(lse_a), ")");
  TORCH_CHECK(lse_b.sizes() == at::IntArrayRef(want_lse), kOp, ": lse_b must have shape ", layout,
              " = ", at::IntArrayRef(want_lse), " to match out_b (got ", shape_str(lse_b), ")");
  return {out_a, lse_a, out_b, lse_b};
}

namespace {

Route<MergePlan> route(const MergeCall& c, bool for_plan) {
  const Overrides overrides = read_overrides();
  return route_merge(c, device_facts(c.out_a, overrides, for_plan), overrides);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> merge_attn_states(const MergeCall& c) {
  c10::DeviceGuard guard(c.out_a.device());
  if (const Route<MergePlan> r = route(c, false); r.sm90) {
    at::Tensor out = at::empty(c.out_a.sizes(), c.out_a.options());
    at::Tensor lse = at::empty(c.lse_a.sizes(), c.lse_a.options());
    run_merge(c, r.plan, out, lse);
    return {out, lse};
  }
  const at::Tensor &out_a = c.out_a, &lse_a = c.lse_a, &out_b = c.out_b, &lse_b = c.lse_b;
  at::Tensor lse = at::logaddexp(lse_a, lse_b);
  // Where both sides are -inf the merged lse is -inf: shift by 0 so both weights are 0, not NaN.
  at::Tensor shift = at::where(at::isinf(lse) & (lse < 0), at::zeros({}, lse.options()), lse);
  at::Tensor wa = at::exp(lse_as_out(lse_a, out_a.dim()) - lse_as_out(shift, out_a.dim()));
  at::Tensor wb = at::exp(lse_as_out(lse_b, out_a.dim()) - lse_as_out(shift, out_a.dim()));
  at::Tensor out = (out_a.to(at::kFloat) * wa + out_b.to(at::kFloat) * wb).to(out_a.scalar_type());
  return {out.contiguous(), lse.contiguous()};
}

std::string merge_attn_states_path(const MergeCall& c) {
  return route(c, false).sm90 ? "sm90" : "reference";
}

std::string merge_attn_states_plan(const MergeCall& c) {
  const Route<MergePlan> r = route(c, true);
  return r.sm90 ? "sm90 " + describe(r.plan) : "reference: " + r.why_not;
}

}  // namespace dsv4
