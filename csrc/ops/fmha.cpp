// fmha launcher: validate every input, then run the sm90 kernel when it covers the call and
// the portable reference path otherwise.
#include "ops/fmha.h"

#include <c10/core/DeviceGuard.h>

#include <cmath>

#include "ops/checks.h"

namespace dsv4 {

namespace {
constexpr const char* kOp = "fmha";
}  // namespace

FmhaCall check_fmha_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           std::optional<double> scale, bool causal, int64_t window_left,
                           const std::optional<at::Tensor>& sinks,
                           const std::optional<at::Tensor>& cu_seqlens_q,
                           const std::optional<at::Tensor>& cu_seqlens_k, int64_t max_seqlen_q,
                           int64_t max_seqlen_k) {
  check_qkv(kOp, q, k, v);
  TORCH_CHECK(cu_seqlens_q.has_value() == cu_seqlens_k.has_value(), kOp,
              ": cu_seqlens_q and cu_seqlens_k must be given together (got cu_seqlens_q ",
              cu_seqlens_q ? "given" : "None", ", cu_seqlens_k ",
              cu_seqlens_k ? "given" : "None", ")");

  FmhaCall c;
  c.q = q;
  c.k = k;
  c.v = v;
  c.varlen = cu_seqlens_q.has_value();
  c.causal = causal;
  c.window_left = window_left < 0 ? -1 : window_left;

  if (c.varlen) {
    check_dim(kOp, "q", q, 3, "(total_q, Hq, D) with cu_seqlens");
    check_dim(kOp, "k", k, 3, "(total_k, Hkv, D) with cu_seqlens");
    check_dim(kOp, "v", v, 3, "(total_k, Hkv, Dv) with cu_seqlens");
    check_size(kOp, "v", v, 0, k.size(0), "total_k, as in k");
    const int64_t n = check_cu_seqlens_shape(kOp, "cu_seqlens_q", *cu_seqlens_q, q);
    const int64_t nk = check_cu_seqlens_shape(kOp, "cu_seqlens_k", *cu_seqlens_k, q);
    TORCH_CHECK(n == nk, kOp, ": cu_seqlens_k must have the same length as cu_seqlens_q (",
                n + 1, ") (got ", nk + 1, ")");
    TORCH_CHECK(max_seqlen_q >= -1 && max_seqlen_k >= -1, kOp,
                ": max_seqlen_q and max_seqlen_k must be >= 0, or -1 to read them from "
                "cu_seqlens (got ", max_seqlen_q, ", ", max_seqlen_k, ")");
    c.batch = n;
    c.cu_seqlens_q = as_int32_cu_seqlens(*cu_seqlens_q);
    c.cu_seqlens_k = as_int32_cu_seqlens(*cu_seqlens_k);
    c.seqlen_q = resolve_max_seqlen(kOp, "query", "cu_seqlens_q", *c.cu_seqlens_q, q.size(0),
                                    "q.size(0)", "max_seqlen_q", max_seqlen_q);
    c.seqlen_k = resolve_max_seqlen(kOp, "key", "cu_seqlens_k", *c.cu_seqlens_k, k.size(0),
                                    "k.size(0)", "max_seqlen_k", max_seqlen_k);
  } else {
    check_dim(kOp, "q", q, 4, "(B, Sq, Hq, D)");
    check_dim(kOp, "k", k, 4, "(B, Sk, Hkv, D)");
    check_dim(kOp, "v", v, 4, "(B, Sk, Hkv, Dv)");
    check_size(kOp, "k", k, 0, q.size(0), "batch, as in q");
    check_size(kOp, "v", v, 0, q.size(0), "batch, as in q");
    check_size(kOp, "v", v, 1, k.size(1), "Sk, as in k");
    TORCH_CHECK(max_seqlen_q == -1 && max_seqlen_k == -1, kOp,
                ": max_seqlen_q and max_seqlen_k apply to varlen calls only; leave them at -1 "
                "without cu_seqlens (got ", max_seqlen_q, ", ", max_seqlen_k, ")");
    c.batch = q.size(0);
    c.seqlen_q = q.size(1);
    c.seqlen_k = k.size(1);
  }
  const int64_t hd = q.dim() - 2;  // heads dim index
  c.heads_q = q.size(hd);
  c.heads_kv = k.size(hd);
  check_size(kOp, "v", v, hd, c.heads_kv, "Hkv, as in k");
  // Zero heads on both sides is an empty call (empty outputs), not an error.
  TORCH_CHECK((c.heads_kv > 0 && c.heads_q % c.heads_kv == 0) ||
                  (c.heads_q == 0 && c.heads_kv == 0),
              kOp, ": the query heads must be a multiple of the KV heads (got Hq = ", c.heads_q,
              ", Hkv = ", c.heads_kv, ")");
  c.head_dim = q.size(-1);
  c.head_dim_v = v.size(-1);
  check_head_dim(kOp, "q.size(-1) (head_dim)", c.head_dim);
  TORCH_CHECK(k.size(-1) == c.head_dim, kOp, ": k must have the same head_dim as q (q: ",
              c.head_dim, ", k: ", k.size(-1), ")");
  check_head_dim(kOp, "v.size(-1) (head_dim_v)", c.head_dim_v);
  check_last_dim_contiguous(kOp, "q", q);
  check_last_dim_contiguous(kOp, "k", k);
  check_last_dim_contiguous(kOp, "v", v);

  if (sinks.has_value()) {
    check_same_device(kOp, "sinks", *sinks, "q", q);
    check_dtype(kOp, "sinks", *sinks, at::kFloat);
    TORCH_CHECK(sinks->dim() == 1 && sinks->size(0) == c.heads_q, kOp,
                ": sinks must have shape (Hq,) = (", c.heads_q, ",) (got shape ",
                shape_str(*sinks), ")");
    c.sinks = sinks->contiguous();
  }
  check_scale(kOp, scale);
  c.scale = scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  return c;
}

std::tuple<at::Tensor, at::Tensor> fmha(const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v, std::optional<double> scale,
                                        bool causal, int64_t window_left,
                                        const std::optional<at::Tensor>& sinks,
                                        const std::optional<at::Tensor>& cu_seqlens_q,
                                        const std::optional<at::Tensor>& cu_seqlens_k,
                                        int64_t max_seqlen_q, int64_t max_seqlen_k) {
  FmhaCall call = check_fmha_inputs(q, k, v, scale, causal, window_left, sinks, cu_seqlens_q,
                                    cu_seqlens_k, max_seqlen_q, max_seqlen_k);
  c10::DeviceGuard guard(q.device());
  std::vector<int64_t> out_shape = q.sizes().vec();
  out_shape.back() = call.head_dim_v;
  at::Tensor out = at::empty(out_shape, q.options());
  at::Tensor lse = call.varlen
                       ? at::empty({call.heads_q, q.size(0)}, q.options().dtype(at::kFloat))
                       : at::empty({call.batch, call.heads_q, call.seqlen_q},
                                   q.options().dtype(at::kFloat));
  if (fmha_sm90_covers(call)) {
    fmha_sm90(call, out, lse);
  } else if (mqa512_sm90_covers(call)) {
    mqa512_sm90(call, out, lse);
  } else {
    fmha_reference(call, out, lse);
  }
  return {out, lse};
}

std::string fmha_path(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                      int64_t window_left, const std::optional<at::Tensor>& sinks,
                      const std::optional<at::Tensor>& cu_seqlens_q,
                      const std::optional<at::Tensor>& cu_seqlens_k) {
  const FmhaCall call = check_fmha_inputs(q, k, v, std::nullopt, causal, window_left, sinks,
                                          cu_seqlens_q, cu_seqlens_k, -1, -1);
  return fmha_sm90_covers(call) || mqa512_sm90_covers(call) ? "sm90" : "reference";
}

#ifndef DSV4_WITH_CUDA
bool fmha_sm90_covers(const FmhaCall&) { return false; }
void fmha_sm90(const FmhaCall&, at::Tensor&, at::Tensor&) {
  TORCH_CHECK(false, "fmha: this build has no CUDA kernels");
}
bool mqa512_sm90_covers(const FmhaCall&) { return false; }
void mqa512_sm90(const FmhaCall&, at::Tensor&, at::Tensor&) {
  TORCH_CHECK(false, "fmha: this build has no CUDA kernels");
}
bool merge_attn_states_sm90_covers(const at::Tensor&, const at::Tensor&) { return false; }
void merge_attn_states_sm90(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                            const at::Tensor&, at::Tensor&, at::Tensor&) {
  TORCH_CHECK(false, "merge_attn_states: this build has no CUDA kernels");
}
#endif

}  // namespace dsv4
