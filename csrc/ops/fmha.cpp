// fmha: validate every input, then run the kernel family whose route takes the call (csrc/sm90
// fmha or mqa512), or the portable reference path.
#include "ops/fmha.h"

#include <c10/core/DeviceGuard.h>

#include <cmath>

#include "ops/checks.h"
#include "sm90/fmha/api.h"
#include "sm90/mqa512/api.h"

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

namespace {

// Which kernel family runs a validated call, with its launch decisions, or why none does.
struct FmhaDispatch {
  enum class Kernel { kReference, kFmha, kMqa512 } kernel = Kernel::kReference;
  std::string why_not;
  FmhaProblem fmha;
  FmhaPlan fmha_plan;
  Mqa512Problem mqa512;
  Mqa512Plan mqa512_plan;
};

// q/k/v as the sm90 tensor maps describe them, (B, S, H, D): a varlen call's packed
// (total, H, D) tensors are one batch.
at::Tensor as_bshd(const FmhaCall& c, const at::Tensor& t) { return c.varlen ? t.unsqueeze(0) : t; }

FmhaDispatch dispatch(const FmhaCall& c, bool for_plan) {
  const Overrides overrides = read_overrides();
  const DeviceFacts device = device_facts(c.q, overrides, for_plan);
  FmhaDispatch d;
  if (c.head_dim == 512 && c.head_dim_v == 512) {
    // The head_dim-512 kernel reads one tensor as K and V: the same memory and geometry.
    if (c.k.data_ptr() != c.v.data_ptr() || c.k.sizes() != c.v.sizes() ||
        c.k.strides() != c.v.strides()) {
      d.why_not = "head_dim 512 with k and v not one tensor";
      return d;
    }
    Mqa512Problem& p = d.mqa512;
    p.op = kOp;
    p.q = as_bshd(c, c.q);
    p.kv = as_bshd(c, c.k);
    p.sinks = c.sinks;
    p.cu_seqlens_q = c.cu_seqlens_q;
    p.cu_seqlens_k = c.cu_seqlens_k;
    Mqa512Shape& s = p.shape;
    s.batch = c.batch;
    s.varlen = c.varlen;
    s.seqlen_q = c.varlen ? c.q.size(0) : c.seqlen_q;
    s.seqlen_k = c.varlen ? c.k.size(0) : c.seqlen_k;
    s.longest_k = c.seqlen_k;
    s.heads_q = c.heads_q;
    s.heads_kv = c.heads_kv;
    s.scale = c.scale;
    s.causal = c.causal;
    s.window_left = c.window_left;
    const Route<Mqa512Plan> route = route_mqa512(p, device, overrides);
    d.kernel = route.sm90 ? FmhaDispatch::Kernel::kMqa512 : FmhaDispatch::Kernel::kReference;
    d.why_not = route.why_not;
    d.mqa512_plan = route.plan;
    return d;
  }
  if (c.head_dim != c.head_dim_v) {
    d.why_not = "head_dim_v differs from head_dim";
    return d;
  }
  FmhaProblem& p = d.fmha;
  p.q = as_bshd(c, c.q);
  p.k = as_bshd(c, c.k);
  p.v = as_bshd(c, c.v);
  p.sinks = c.sinks;
  p.cu_seqlens_q = c.cu_seqlens_q;
  p.cu_seqlens_k = c.cu_seqlens_k;
  p.varlen = c.varlen;
  p.batch = c.batch;
  p.seqlen_q = c.seqlen_q;
  p.seqlen_k = c.seqlen_k;
  p.heads_q = c.heads_q;
  p.heads_kv = c.heads_kv;
  p.head_dim = c.head_dim;
  p.scale = c.scale;
  p.causal = c.causal;
  p.window_left = c.window_left;
  const Route<FmhaPlan> route = route_fmha(p, device, overrides);
  d.kernel = route.sm90 ? FmhaDispatch::Kernel::kFmha : FmhaDispatch::Kernel::kReference;
  d.why_not = route.why_not;
  d.fmha_plan = route.plan;
  return d;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> fmha(const FmhaCall& call) {
  c10::DeviceGuard guard(call.q.device());
  std::vector<int64_t> out_shape = call.q.sizes().vec();
  out_shape.back() = call.head_dim_v;
  at::Tensor out = at::empty(out_shape, call.q.options());
  at::Tensor lse = call.varlen
                       ? at::empty({call.heads_q, call.q.size(0)}, call.q.options().dtype(at::kFloat))
                       : at::empty({call.batch, call.heads_q, call.seqlen_q},
                                   call.q.options().dtype(at::kFloat));
  const FmhaDispatch d = dispatch(call, false);
  switch (d.kernel) {
    case FmhaDispatch::Kernel::kFmha: run_fmha(d.fmha, d.fmha_plan, out, lse); break;
    case FmhaDispatch::Kernel::kMqa512: run_mqa512(d.mqa512, d.mqa512_plan, out, lse); break;
    case FmhaDispatch::Kernel::kReference: fmha_reference(call, out, lse); break;
  }
  return {out, lse};
}

std::string fmha_path(const FmhaCall& call) {
  return dispatch(call, false).kernel == FmhaDispatch::Kernel::kReference ? "reference" : "sm90";
}

std::string fmha_plan(const FmhaCall& call) {
  const FmhaDispatch d = dispatch(call, true);
  switch (d.kernel) {
    case FmhaDispatch::Kernel::kFmha: return "sm90 " + describe(d.fmha_plan);
    case FmhaDispatch::Kernel::kMqa512: return "sm90 " + describe(d.mqa512_plan);
    case FmhaDispatch::Kernel::kReference: break;
  }
  return "reference: " + d.why_not;
}

}  // namespace dsv4
