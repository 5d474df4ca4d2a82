// dsv4_attention: validate every input, then run the head_dim-512 family when its route takes
// the call, and the portable reference path otherwise.
#include "ops/dsv4_attention.h"

#include <c10/core/DeviceGuard.h>

#include <algorithm>
#include <cmath>

#include "ops/checks.h"
#include "sm90/mqa512/api.h"

namespace dsv4 {

namespace {
constexpr const char* kOp = "dsv4_attention";

// Per sequence, Sq <= Skv (the queries are the last Sq of the Skv tokens). Reads both
// cu_seqlens on the host: called only where check_cu_seqlens_values already did.
void check_queries_within_kv(const at::Tensor& cu_q, const at::Tensor& cu_kv) {
  const at::Tensor hq = cu_q.to(at::kCPU).to(at::kLong).contiguous();
  const at::Tensor hk = cu_kv.to(at::kCPU).to(at::kLong).contiguous();
  const int64_t* a = hq.data_ptr<int64_t>();
  const int64_t* b = hk.data_ptr<int64_t>();
  for (int64_t i = 0; i + 1 < hq.size(0); ++i) {
    const int64_t sq = a[i + 1] - a[i], skv = b[i + 1] - b[i];
    TORCH_CHECK(sq <= skv, kOp, ": sequence ", i, " has more queries than kv tokens (Sq = ", sq,
                ", Skv = ", skv, "); the queries must be the last Sq of the Skv tokens");
  }
}
}  // namespace

Dsv4Call check_dsv4_inputs(const at::Tensor& q, const at::Tensor& kv,
                           const std::optional<at::Tensor>& sinks, int64_t window,
                           const std::optional<at::Tensor>& compressed_kv, int64_t compress_ratio,
                           const std::optional<at::Tensor>& topk_indices,
                           std::optional<double> scale,
                           const std::optional<at::Tensor>& cu_seqlens_q,
                           const std::optional<at::Tensor>& cu_seqlens_kv,
                           const std::optional<at::Tensor>& cu_seqlens_compressed,
                           int64_t max_seqlen_q, int64_t max_seqlen_kv) {
  check_defined(kOp, "q", q);
  check_defined(kOp, "kv", kv);
  // fp32 runs on the reference path (for fp32 models); the kernel takes bf16 and fp16.
  check_float_dtype(kOp, "q", q);
  check_same_dtype(kOp, "kv", kv, "q", q);
  check_same_device(kOp, "kv", kv, "q", q);
  const bool has_c = compressed_kv.has_value();
  if (has_c) {
    check_same_dtype(kOp, "compressed_kv", *compressed_kv, "q", q);
    check_same_device(kOp, "compressed_kv", *compressed_kv, "q", q);
    TORCH_CHECK(compress_ratio >= 1, kOp,
                ": compress_ratio must be >= 1 when compressed_kv is given (got ", compress_ratio,
                ")");
  } else {
    TORCH_CHECK(compress_ratio == 0, kOp,
                ": compress_ratio applies only with compressed_kv; leave it at 0 without it (got ",
                compress_ratio, ")");
    TORCH_CHECK(!topk_indices.has_value(), kOp,
                ": topk_indices select rows of compressed_kv, which was not given");
  }
  TORCH_CHECK(window >= 0, kOp, ": window must be >= 0 (0: no window keys) (got ", window, ")");

  Dsv4Call c;
  c.q = q;
  c.kv = kv;
  c.compressed_kv = compressed_kv;
  c.window = window;
  c.compress_ratio = compress_ratio;
  c.varlen = cu_seqlens_q.has_value();
  TORCH_CHECK(cu_seqlens_q.has_value() == cu_seqlens_kv.has_value(), kOp,
              ": cu_seqlens_q and cu_seqlens_kv must be given together (got cu_seqlens_q ",
              cu_seqlens_q ? "given" : "None", ", cu_seqlens_kv ", cu_seqlens_kv ? "given" : "None",
              ")");
  TORCH_CHECK(!cu_seqlens_compressed.has_value() || (c.varlen && has_c), kOp,
              ": cu_seqlens_compressed goes with compressed_kv in a varlen call (cu_seqlens_q and "
              "cu_seqlens_kv given)");
  TORCH_CHECK(!(c.varlen && has_c) || cu_seqlens_compressed.has_value(), kOp,
              ": a varlen call with compressed_kv needs cu_seqlens_compressed");

  if (c.varlen) {
    check_dim(kOp, "q", q, 3, "(total_q, Hq, D) with cu_seqlens");
    check_dim(kOp, "kv", kv, 2, "(total_kv, D) with cu_seqlens");
    if (has_c) check_dim(kOp, "compressed_kv", *compressed_kv, 2, "(total_c, D) with cu_seqlens");
    const int64_t n = check_cu_seqlens_shape(kOp, "cu_seqlens_q", *cu_seqlens_q, q);
    const int64_t nk = check_cu_seqlens_shape(kOp, "cu_seqlens_kv", *cu_seqlens_kv, q);
    TORCH_CHECK(nk == n, kOp, ": cu_seqlens_kv must have the same length as cu_seqlens_q (",
                n + 1, ") (got ", nk + 1, ")");
    c.batch = n;
    c.cu_seqlens_q = as_int32_cu_seqlens(*cu_seqlens_q);
    c.cu_seqlens_kv = as_int32_cu_seqlens(*cu_seqlens_kv);
    TORCH_CHECK(max_seqlen_q >= -1 && max_seqlen_kv >= -1, kOp,
                ": max_seqlen_q and max_seqlen_kv must be >= 0, or -1 to read them from "
                "cu_seqlens (got ", max_seqlen_q, ", ", max_seqlen_kv, ")");
    c.seqlen_q = resolve_max_seqlen(kOp, "query", "cu_seqlens_q", *c.cu_seqlens_q, q.size(0),
                                    "q.size(0)", "max_seqlen_q", max_seqlen_q);
    c.seqlen_kv = resolve_max_seqlen(kOp, "kv", "cu_seqlens_kv", *c.cu_seqlens_kv, kv.size(0),
                                     "kv.size(0)", "max_seqlen_kv", max_seqlen_kv);
    if (q.device().is_cpu()) check_queries_within_kv(*c.cu_seqlens_q, *c.cu_seqlens_kv);
    if (has_c) {
      const int64_t nc = check_cu_seqlens_shape(kOp, "cu_seqlens_compressed",
                                                *cu_seqlens_compressed, q);
      TORCH_CHECK(nc == n, kOp,
                  ": cu_seqlens_compressed must have the same length as cu_seqlens_q (", n + 1,
                  ") (got ", nc + 1, ")");
      c.cu_seqlens_compressed = as_int32_cu_seqlens(*cu_seqlens_compressed);
      if (q.device().is_cpu()) {
        check_cu_seqlens_values(kOp, "cu_seqlens_compressed", *c.cu_seqlens_compressed,
                                compressed_kv->size(0), "compressed_kv.size(0)");
      }
    }
  } else {
    check_dim(kOp, "q", q, 4, "(B, Sq, Hq, D)");
    check_dim(kOp, "kv", kv, 3, "(B, Skv, D)");
    if (has_c) check_dim(kOp, "compressed_kv", *compressed_kv, 3, "(B, Sc, D)");
    TORCH_CHECK(max_seqlen_q == -1 && max_seqlen_kv == -1, kOp,
                ": max_seqlen_q and max_seqlen_kv apply to varlen calls only; leave them at -1 "
                "without cu_seqlens (got ", max_seqlen_q, ", ", max_seqlen_kv, ")");
    check_size(kOp, "kv", kv, 0, q.size(0), "batch, as in q");
    if (has_c) check_size(kOp, "compressed_kv", *compressed_kv, 0, q.size(0), "batch, as in q");
    c.batch = q.size(0);
    c.seqlen_q = q.size(1);
    c.seqlen_kv = kv.size(1);
    c.seqlen_compressed = has_c ? compressed_kv->size(1) : 0;
    TORCH_CHECK(c.seqlen_q <= c.seqlen_kv, kOp, ": q has more tokens than kv (Sq = ", c.seqlen_q,
                ", Skv = ", c.seqlen_kv, "); the queries must be the last Sq of the Skv tokens");
  }

  c.heads = q.size(-2);
  c.head_dim = q.size(-1);
  check_head_dim(kOp, "q.size(-1) (head_dim)", c.head_dim);
  TORCH_CHECK(kv.size(-1) == c.head_dim, kOp, ": kv must have the same head_dim as q (q: ",
              c.head_dim, ", kv: ", kv.size(-1), ")");
  if (has_c) {
    TORCH_CHECK(compressed_kv->size(-1) == c.head_dim, kOp,
                ": compressed_kv must have the same head_dim as q (q: ", c.head_dim,
                ", compressed_kv: ", compressed_kv->size(-1), ")");
  }
  check_last_dim_contiguous(kOp, "q", q);
  check_last_dim_contiguous(kOp, "kv", kv);
  if (has_c) check_last_dim_contiguous(kOp, "compressed_kv", *compressed_kv);

  if (topk_indices.has_value()) {
    const at::Tensor& t = *topk_indices;
    check_same_device(kOp, "topk_indices", t, "q", q);
    check_dtype(kOp, "topk_indices", t, at::kInt);
    if (c.varlen) {
      TORCH_CHECK(t.dim() == 2 && t.size(0) == q.size(0), kOp,
                  ": topk_indices must have shape (total_q, K) = (", q.size(0),
                  ", K) (got shape ", shape_str(t), ")");
    } else {
      TORCH_CHECK(t.dim() == 3 && t.size(0) == c.batch && t.size(1) == c.seqlen_q, kOp,
                  ": topk_indices must have shape (B, Sq, K) = (", c.batch, ", ", c.seqlen_q,
                  ", K) (got shape ", shape_str(t), ")");
    }
    c.topk_indices = t;
    c.topk = t.size(-1);
  }
  if (sinks.has_value()) {
    check_same_device(kOp, "sinks", *sinks, "q", q);
    check_dtype(kOp, "sinks", *sinks, at::kFloat);
    TORCH_CHECK(sinks->dim() == 1 && sinks->size(0) == c.heads, kOp,
                ": sinks must have shape (Hq,) = (", c.heads, ",) (got shape ", shape_str(*sinks),
                ")");
    c.sinks = sinks->contiguous();
  }
  check_scale(kOp, scale);
  c.scale = scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  return c;
}

namespace {

// Compressed rows that exist: dense Sc > 0, varlen total_c > 0.
bool has_compressed(const Dsv4Call& c) {
  return c.compressed_kv.has_value() &&
         (c.varlen ? c.compressed_kv->size(0) > 0 : c.seqlen_compressed > 0);
}

// The call as the head_dim-512 family takes it: the window W as fmha's causal mask with
// window_left W - 1; varlen tensors as one batch; kv and compressed_kv as one KV head.
Mqa512Problem mqa512_problem(const Dsv4Call& c) {
  auto rows = [&](const at::Tensor& t) { return (c.varlen ? t.unsqueeze(0) : t).unsqueeze(2); };
  Mqa512Problem p;
  p.op = kOp;
  p.q = c.varlen ? c.q.unsqueeze(0) : c.q;
  p.kv = rows(c.kv);
  p.sinks = c.sinks;
  p.cu_seqlens_q = c.cu_seqlens_q;
  p.cu_seqlens_k = c.cu_seqlens_kv;
  Mqa512Shape& s = p.shape;
  s.batch = c.batch;
  s.varlen = c.varlen;
  s.seqlen_q = c.varlen ? c.q.size(0) : c.seqlen_q;
  s.seqlen_k = c.varlen ? c.kv.size(0) : c.seqlen_kv;
  s.longest_k = c.seqlen_kv;
  s.heads_q = c.heads;
  s.heads_kv = 1;
  s.scale = c.scale;
  s.use_kv = c.window > 0;
  s.causal = true;
  s.window_left = std::max<int64_t>(c.window - 1, 0);
  if (has_compressed(c)) {
    p.compressed = rows(*c.compressed_kv);
    p.cu_seqlens_c = c.cu_seqlens_compressed;
    s.compress_ratio = c.compress_ratio;
    s.seqlen_c = c.varlen ? c.compressed_kv->size(0) : c.seqlen_compressed;
    // HCA sees at most the longest sequence's closed rows.
    s.max_compressed_rows = c.varlen ? c.seqlen_kv / c.compress_ratio : c.seqlen_compressed;
    if (c.topk_indices) {
      p.topk = c.topk_indices;
      s.topk_k = c.topk;
    }
  }
  return p;
}

struct Dsv4Dispatch {
  Mqa512Problem problem;
  Route<Mqa512Plan> route;
};

Dsv4Dispatch dispatch(const Dsv4Call& c, bool for_plan) {
  const Overrides overrides = read_overrides();
  Dsv4Dispatch d{mqa512_problem(c), {}};
  d.route = route_mqa512(d.problem, device_facts(c.q, overrides, for_plan), overrides);
  return d;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> dsv4_attention(const Dsv4Call& call) {
  c10::DeviceGuard guard(call.q.device());
  at::Tensor out = at::empty(call.q.sizes(), call.q.options());
  at::Tensor lse = call.varlen
                       ? at::empty({call.heads, call.q.size(0)}, call.q.options().dtype(at::kFloat))
                       : at::empty({call.batch, call.heads, call.seqlen_q},
                                   call.q.options().dtype(at::kFloat));
  const Dsv4Dispatch d = dispatch(call, false);
  if (d.route.sm90) {
    run_mqa512(d.problem, d.route.plan, out, lse);
  } else {
    dsv4_attention_reference(call, out, lse);
  }
  return {out, lse};
}

std::string dsv4_attention_path(const Dsv4Call& call) {
  return dispatch(call, false).route.sm90 ? "sm90" : "reference";
}

std::string dsv4_attention_plan(const Dsv4Call& call) {
  const Dsv4Dispatch d = dispatch(call, true);
  return d.route.sm90 ? "sm90 " + describe(d.route.plan) : "reference: " + d.route.why_not;
}

}  // namespace dsv4
