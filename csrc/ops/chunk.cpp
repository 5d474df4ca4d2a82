// Launchers for the chunked linear-attention ops: validate every input, then run the sm90
// kernel when it covers the call and the portable reference path otherwise.
#include "ops/chunk.h"

#include <c10/core/DeviceGuard.h>

#include <cmath>

#include "ops/checks.h"

namespace dsv4 {

ChunkCall check_chunk_inputs(const char* op, ChunkRule rule, const at::Tensor& q,
                             const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                             const std::optional<at::Tensor>& beta, std::optional<double> scale,
                             const std::optional<at::Tensor>& initial_state,
                             bool output_final_state,
                             const std::optional<at::Tensor>& cu_seqlens) {
  check_qkv(op, q, k, v);
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

namespace {

std::tuple<at::Tensor, std::optional<at::Tensor>> run_chunk(const ChunkCall& call) {
  c10::DeviceGuard guard(call.q.device());
  at::Tensor o = at::empty(call.v.sizes(), call.v.options());
  at::Tensor final_state;
  if (call.heads_v == 0) {  // no heads: empty outputs
    final_state = at::empty({call.num_seqs, 0, call.dim_k, call.dim_v},
                            call.q.options().dtype(at::kFloat));
  } else if (chunk_sm90_covers(call)) {
    if (call.output_final_state) {
      final_state = at::empty({call.num_seqs, call.heads_v, call.dim_k, call.dim_v},
                              call.q.options().dtype(at::kFloat));
    }
    chunk_sm90(call, o, final_state);
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

}  // namespace

std::tuple<at::Tensor, std::optional<at::Tensor>> chunk_gated_delta_rule(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
    const at::Tensor& beta, std::optional<double> scale,
    const std::optional<at::Tensor>& initial_state, bool output_final_state,
    const std::optional<at::Tensor>& cu_seqlens, bool use_qk_l2norm_in_kernel) {
  ChunkCall call = check_chunk_inputs("chunk_gated_delta_rule", ChunkRule::kGatedDelta, q, k, v,
                                      g, beta, scale, initial_state, output_final_state,
                                      cu_seqlens);
  call.qk_l2norm = use_qk_l2norm_in_kernel;
  return run_chunk(call);
}

std::tuple<at::Tensor, std::optional<at::Tensor>> chunk_simple_gla(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
    std::optional<double> scale, const std::optional<at::Tensor>& initial_state,
    bool output_final_state, const std::optional<at::Tensor>& cu_seqlens) {
  return run_chunk(check_chunk_inputs("chunk_simple_gla", ChunkRule::kSimpleGla, q, k, v, g,
                                      std::nullopt, scale, initial_state, output_final_state,
                                      cu_seqlens));
}

std::string chunk_gla_path(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const std::optional<at::Tensor>& cu_seqlens) {
  const char* op = "chunk_gla_path";
  check_dim(op, "v", v, 4, "(B, T, HV, V)");
  at::Tensor g = at::empty({v.size(0), v.size(1), v.size(2)}, v.options().dtype(at::kFloat));
  const ChunkCall call = check_chunk_inputs(op, ChunkRule::kSimpleGla, q, k, v, g, std::nullopt,
                                            std::nullopt, std::nullopt, false, cu_seqlens);
  return chunk_sm90_covers(call) ? "sm90" : "reference";
}

#ifndef DSV4_WITH_CUDA
bool chunk_sm90_covers(const ChunkCall&) { return false; }
void chunk_sm90(const ChunkCall&, at::Tensor&, at::Tensor&) {
  TORCH_CHECK(false, "chunk ops: this build has no CUDA kernels");
}
#endif

}  // namespace dsv4
