// The chunked linear-attention ops: validate every input, then run the sm90 chunk family when
// its route takes the call, and the portable reference path otherwise.
#include "ops/chunk.h"

#include <c10/core/DeviceGuard.h>

#include <cmath>

#include "ops/checks.h"

namespace dsv4 {

namespace {

ChunkCall check_chunk_inputs(const char* op, ChunkRule rule, const at::Tensor& q,
                             const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                             const std::optional<at::Tensor>& beta, std::optional<double> scale,
                             const std::optional<at::Tensor>& initial_state,
                             bool output_final_state,
                             const std::optional<at::Tensor>& cu_seqlens) {
  check_qkv(op, q, k, v, /*allow_fp32=*/true);  // fp32: the reference path
  check_defined(op, "g", g);
  check_same_device(op, "g", g, "q", q);
  check_dim(op, "q", q, 4, "(B, T, H, K)");
  check_dim(op, "k", k, 4, "(B, T, H, K)");
  check_dim(op, "v", v, 4, "(B, T, HV, V)");
  TORCH_CHECK(k.sizes() == q.sizes(), op, ": k must have q's shape ", shape_str(q), " (got ",
              shape_str(k), ")");
  ChunkCall c;
  c.rule = rule;
  c.batch = q.size(0);
  c.seqlen = q.size(1);
  c.heads_qk = q.size(2);
  c.dim_k = q.size(3);
  c.heads_v = v.size(2);
  c.dim_v = v.size(3);
  check_size(op, "v", v, 0, c.batch, "B, as in q");
  check_size(op, "v", v, 1, c.seqlen, "T, as in q");
  TORCH_CHECK(c.dim_k > 0 && c.dim_v > 0, op, ": the key and value dims must be positive (got K = ",
              c.dim_k, ", V = ", c.dim_v, ")");
  TORCH_CHECK((c.heads_qk > 0 && c.heads_v % c.heads_qk == 0) ||
                  (c.heads_qk == 0 && c.heads_v == 0),
              op,
              ": the v-heads HV must be a multiple of the qk-heads H (got H = ", c.heads_qk,
              ", HV = ", c.heads_v, ")");
  check_gate_dtype(op, "g", g);
  TORCH_CHECK(g.dim() == 3 && g.size(0) == c.batch && g.size(1) == c.seqlen &&
                  g.size(2) == c.heads_v,
              op, ": g must have shape (B, T, HV) = (", c.batch, ", ", c.seqlen, ", ", c.heads_v,
              ") (got ", shape_str(g), ")");
  if (rule == ChunkRule::kGatedDelta) {
    check_defined(op, "beta", *beta);
    check_same_device(op, "beta", *beta, "q", q);
    check_gate_dtype(op, "beta", *beta);
    TORCH_CHECK(beta->sizes() == g.sizes(), op, ": beta must have shape (B, T, HV) = ",
                shape_str(g), " (got ", shape_str(*beta), ")");
  }
  c.num_seqs = c.batch;
  if (cu_seqlens.has_value()) {
    TORCH_CHECK(c.batch == 1, op, ": with cu_seqlens, q must have batch size 1 (got B = ",
                c.batch, ")");
    c.num_seqs = check_cu_seqlens_shape(op, "cu_seqlens", *cu_seqlens, q);
    // The contents are checked where reading them is free: on the CPU here, and on a GPU only
    // by the reference path, which reads them on the host anyway. The sm90 kernels trust them
    // (as FlashAttention does) and clamp every sequence into [0, T].
    if (cu_seqlens->device().is_cpu()) {
      check_cu_seqlens_values(op, "cu_seqlens", *cu_seqlens, c.seqlen, "T = q.size(1)");
    }
    c.cu_seqlens = as_int32_cu_seqlens(*cu_seqlens);
  }
  if (initial_state.has_value()) {
    const at::Tensor& s = *initial_state;
    check_same_device(op, "initial_state", s, "q", q);
    check_dtype(op, "initial_state", s, at::kFloat);
    TORCH_CHECK(s.dim() == 4 && s.size(0) == c.num_seqs && s.size(1) == c.heads_v &&
                    s.size(2) == c.dim_k && s.size(3) == c.dim_v,
                op, ": initial_state must have shape (N, HV, K, V) = (", c.num_seqs, ", ",
                c.heads_v, ", ", c.dim_k, ", ", c.dim_v, ") (got ", shape_str(s), ")");
  }
  check_scale(op, scale);
  c.q = q;
  c.k = k;
  c.v = v;
  c.g = g.to(at::kFloat);  // no copy when already fp32
  if (beta) c.beta = beta->to(at::kFloat);
  c.initial_state = initial_state;
  c.output_final_state = output_final_state;
  c.scale = scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(c.dim_k));
  return c;
}

}  // namespace

ChunkCall check_gated_delta_rule_inputs(const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v, const at::Tensor& g,
                                        const at::Tensor& beta, std::optional<double> scale,
                                        const std::optional<at::Tensor>& initial_state,
                                        bool output_final_state,
                                        const std::optional<at::Tensor>& cu_seqlens,
                                        bool use_qk_l2norm_in_kernel) {
  ChunkCall c = check_chunk_inputs("chunk_gated_delta_rule", ChunkRule::kGatedDelta, q, k, v, g,
                                   beta, scale, initial_state, output_final_state, cu_seqlens);
  c.qk_l2norm = use_qk_l2norm_in_kernel;
  return c;
}

ChunkCall check_simple_gla_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& g, std::optional<double> scale,
                                  const std::optional<at::Tensor>& initial_state,
                                  bool output_final_state,
                                  const std::optional<at::Tensor>& cu_seqlens) {
  return check_chunk_inputs("chunk_simple_gla", ChunkRule::kSimpleGla, q, k, v, g, std::nullopt,
                            scale, initial_state, output_final_state, cu_seqlens);
}

namespace {

Route<ChunkPlan> route(const ChunkCall& c, bool for_plan) {
  const Overrides overrides = read_overrides();
  if (c.heads_v == 0) return Route<ChunkPlan>::reference("no heads");
  return route_chunk(c, device_facts(c.q, overrides, for_plan), overrides);
}

}  // namespace

std::tuple<at::Tensor, std::optional<at::Tensor>> chunk_op(const ChunkCall& call) {
  c10::DeviceGuard guard(call.q.device());
  at::Tensor o = at::empty(call.v.sizes(), call.v.options());
  at::Tensor final_state;
  const Route<ChunkPlan> r = route(call, false);
  if (call.heads_v == 0) {  // no heads: empty outputs
    final_state = at::empty({call.num_seqs, 0, call.dim_k, call.dim_v},
                            call.q.options().dtype(at::kFloat));
  } else if (r.sm90) {
    if (call.output_final_state) {
      final_state = at::empty({call.num_seqs, call.heads_v, call.dim_k, call.dim_v},
                              call.q.options().dtype(at::kFloat));
    }
    run_chunk(call, r.plan, o, final_state);
  } else {
    if (call.cu_seqlens && !call.cu_seqlens->device().is_cpu()) {
      check_cu_seqlens_values(call.rule == ChunkRule::kGatedDelta ? "chunk_gated_delta_rule"
                                                                  : "chunk_simple_gla",
                              "cu_seqlens", *call.cu_seqlens, call.seqlen, "T = q.size(1)");
    }
    final_state = chunk_reference(call, o);
  }
  if (!call.output_final_state) return {o, std::nullopt};
  return {o, final_state};
}

std::string chunk_path(const ChunkCall& call) { return route(call, false).sm90 ? "sm90" : "reference"; }

std::string chunk_plan(const ChunkCall& call) {
  const Route<ChunkPlan> r = route(call, true);
  return r.sm90 ? "sm90 " + describe(r.plan) : "reference: " + r.why_not;
}

}  // namespace dsv4
