// dsv4_indexer_topk: the sm90 kernels (csrc/sm90/indexer), and elsewhere the reference path:
// the scores of a block of queries against all of its sequence's rows, one head at a time (so
// memory stays at a block x rows fp32 tensor, never Sq x H x Sc), then a stable sort for the
// top-k (ties to the lower row).
#include "ops/indexer.h"

#include <c10/core/DeviceGuard.h>

#include <cmath>
#include <limits>

#include "ops/checks.h"

namespace dsv4 {
namespace {
constexpr const char* kOp = "dsv4_indexer_topk";
constexpr int64_t kQueryBlock = 256;

bool is_fp8(const at::Tensor& t) { return t.scalar_type() == at::kFloat8_e4m3fn; }

Route<IndexerPlan> route(const IndexerCall& c, bool for_plan) {
  const Overrides overrides = read_overrides();
  return route_indexer(c, device_facts(c.q, overrides, for_plan));
}

// One sequence: q (Sq, H, D), k (Sc, D) fp32 (k_scale folded in), weights (Sq, H) fp32,
// positions (Sq,) int64 -> (Sq, topk) int32.
at::Tensor topk_of_sequence(const IndexerCall& c, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& w, const at::Tensor& pos) {
  const int64_t sq = q.size(0), heads = q.size(1), sc = k.size(0);
  at::Tensor out = at::full({sq, c.topk}, -1, pos.options().dtype(at::kInt));
  if (sq == 0 || sc == 0) return out;
  const at::Tensor rows = at::arange(sc, pos.options());
  const int64_t keep = std::min(c.topk, sc);
  for (int64_t i0 = 0; i0 < sq; i0 += kQueryBlock) {
    const int64_t n = std::min(kQueryBlock, sq - i0);
    const at::Tensor qb = q.narrow(0, i0, n), wb = w.narrow(0, i0, n);
    at::Tensor score = at::zeros({n, sc}, k.options());
    for (int64_t h = 0; h < heads; ++h) {
      score.add_(at::relu(at::matmul(qb.select(1, h), k.t()) * c.scale) *
                 wb.select(1, h).unsqueeze(1));
    }
    const at::Tensor closed = at::clamp(at::div(pos.narrow(0, i0, n) + 1, c.compress_ratio,
                                                "floor"), 0, sc);
    score.masked_fill_(rows.unsqueeze(0) >= closed.unsqueeze(1),
                       -std::numeric_limits<float>::infinity());
    const auto [val, idx] = at::sort(score, /*stable=*/true, /*dim=*/1, /*descending=*/true);
    const at::Tensor top = idx.narrow(1, 0, keep);
    const at::Tensor seen = at::isfinite(val.narrow(1, 0, keep));
    out.narrow(0, i0, n).narrow(1, 0, keep).copy_(at::where(seen, top, -1));
  }
  return out;
}

}  // namespace

IndexerCall check_indexer_inputs(const at::Tensor& q, const at::Tensor& k,
                                 const at::Tensor& weights, const at::Tensor& positions,
                                 int64_t topk, int64_t compress_ratio,
                                 std::optional<double> scale,
                                 const std::optional<at::Tensor>& k_scale,
                                 const std::optional<at::Tensor>& cu_seqlens_q,
                                 const std::optional<at::Tensor>& cu_seqlens_k,
                                 int64_t max_seqlen_q, int64_t max_seqlen_k) {
  check_defined(kOp, "q", q);
  check_defined(kOp, "k", k);
  check_defined(kOp, "weights", weights);
  check_defined(kOp, "positions", positions);
  const bool fp8 = is_fp8(q);
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf ||
                  q.scalar_type() == at::kFloat || fp8,
              kOp, ": q must be bf16, fp16, fp32 or float8_e4m3fn (got ", q.scalar_type(), ")");
  check_same_dtype(kOp, "k", k, "q", q);
  for (const auto& [name, t] : {std::pair{"k", &k}, std::pair{"weights", &weights},
                                std::pair{"positions", &positions}}) {
    check_same_device(kOp, name, *t, "q", q);
  }
  TORCH_CHECK(weights.scalar_type() == at::kFloat || weights.scalar_type() == at::kBFloat16 ||
                  weights.scalar_type() == at::kHalf,
              kOp, ": weights must be fp32, bf16 or fp16 (got ", weights.scalar_type(), ")");
  TORCH_CHECK(positions.scalar_type() == at::kInt || positions.scalar_type() == at::kLong, kOp,
              ": positions must be int32 or int64 (got ", positions.scalar_type(), ")");
  TORCH_CHECK(topk >= 1, kOp, ": topk must be at least 1 (got ", topk, ")");
  TORCH_CHECK(compress_ratio >= 1, kOp, ": compress_ratio must be at least 1 (got ",
              compress_ratio, ")");
  TORCH_CHECK(cu_seqlens_q.has_value() == cu_seqlens_k.has_value(), kOp,
              ": give both cu_seqlens_q and cu_seqlens_k, or neither");
  IndexerCall c;
  c.varlen = cu_seqlens_q.has_value();
  if (c.varlen) {
    check_dim(kOp, "q", q, 3, "(T, H, D) with cu_seqlens");
    check_dim(kOp, "k", k, 2, "(total_c, D) with cu_seqlens");
    TORCH_CHECK(weights.sizes() == q.sizes().slice(0, 2), kOp, ": weights must have shape (T, H) = ",
                q.sizes().slice(0, 2), " (got ", shape_str(weights), ")");
    TORCH_CHECK(positions.dim() == 1 && positions.size(0) == q.size(0), kOp,
                ": positions must have shape (T,) = (", q.size(0), ") (got ",
                shape_str(positions), ")");
    const int64_t n = check_cu_seqlens_shape(kOp, "cu_seqlens_q", *cu_seqlens_q, q);
    TORCH_CHECK(check_cu_seqlens_shape(kOp, "cu_seqlens_k", *cu_seqlens_k, q) == n, kOp,
                ": cu_seqlens_k must have cu_seqlens_q's length ", n + 1, " (got ",
                cu_seqlens_k->size(0), ")");
    TORCH_CHECK(max_seqlen_q >= -1 && max_seqlen_k >= -1, kOp,
                ": max_seqlen_q and max_seqlen_k must be >= 0, or -1 to read them from "
                "cu_seqlens (got ", max_seqlen_q, ", ", max_seqlen_k, ")");
    c.max_seqlen_q = resolve_max_seqlen(kOp, "query", "cu_seqlens_q", *cu_seqlens_q, q.size(0),
                                        "T = q.size(0)", "max_seqlen_q", max_seqlen_q);
    c.max_seqlen_k = resolve_max_seqlen(kOp, "key", "cu_seqlens_k", *cu_seqlens_k, k.size(0),
                                        "k.size(0)", "max_seqlen_k", max_seqlen_k);
    c.cu_seqlens_q = as_int32_cu_seqlens(*cu_seqlens_q);
    c.cu_seqlens_k = as_int32_cu_seqlens(*cu_seqlens_k);
  } else {
    TORCH_CHECK(max_seqlen_q == -1 && max_seqlen_k == -1, kOp,
                ": max_seqlen_q and max_seqlen_k apply to varlen calls only; leave them at -1 "
                "without cu_seqlens (got ", max_seqlen_q, ", ", max_seqlen_k, ")");
    check_dim(kOp, "q", q, 4, "(B, Sq, H, D)");
    check_dim(kOp, "k", k, 3, "(B, Sc, D)");
    check_size(kOp, "k", k, 0, q.size(0), "B, as in q");
    TORCH_CHECK(weights.sizes() == q.sizes().slice(0, 3), kOp,
                ": weights must have shape (B, Sq, H) = ", q.sizes().slice(0, 3), " (got ",
                shape_str(weights), ")");
    TORCH_CHECK(positions.sizes() == q.sizes().slice(0, 2), kOp,
                ": positions must have shape (B, Sq) = ", q.sizes().slice(0, 2), " (got ",
                shape_str(positions), ")");
  }
  TORCH_CHECK(k.size(-1) == q.size(-1), kOp, ": k's last dim must be q's head dim ", q.size(-1),
              " (got ", k.size(-1), ")");
  TORCH_CHECK(q.size(-1) >= 1, kOp, ": the head dim must be positive (got ", q.size(-1), ")");
  if (fp8) {
    TORCH_CHECK(k_scale.has_value(), kOp,
                ": float8_e4m3fn q and k need k_scale, one fp32 scale per row of k");
  }
  if (k_scale.has_value()) {
    check_same_device(kOp, "k_scale", *k_scale, "q", q);
    check_dtype(kOp, "k_scale", *k_scale, at::kFloat);
    TORCH_CHECK(k_scale->sizes() == k.sizes().slice(0, k.dim() - 1), kOp,
                ": k_scale must have k's shape without its last dim, ",
                k.sizes().slice(0, k.dim() - 1), " (got ", shape_str(*k_scale), ")");
  }
  check_scale(kOp, scale);
  c.q = q;
  c.k = k;
  c.weights = weights;
  c.positions = positions;
  c.k_scale = k_scale;
  c.topk = topk;
  c.compress_ratio = compress_ratio;
  c.scale = scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  return c;
}

at::Tensor dsv4_indexer_topk(const IndexerCall& c) {
  c10::DeviceGuard guard(c.q.device());
  if (const Route<IndexerPlan> r = route(c, false); r.sm90) {
    at::Tensor out = c.varlen ? at::empty({c.q.size(0), c.topk}, c.q.options().dtype(at::kInt))
                              : at::empty({c.q.size(0), c.q.size(1), c.topk},
                                          c.q.options().dtype(at::kInt));
    run_indexer(c, r.plan, out);
    return out;
  }
  const at::Tensor q = c.q.to(at::kFloat), w = c.weights.to(at::kFloat);
  at::Tensor k = c.k.to(at::kFloat);
  if (c.k_scale) k = k * c.k_scale->unsqueeze(-1);
  const at::Tensor pos = c.positions.to(at::kLong);
  if (!c.varlen) {
    std::vector<at::Tensor> outs;
    for (int64_t b = 0; b < q.size(0); ++b) {
      outs.push_back(topk_of_sequence(c, q[b], k[b], w[b], pos[b]));
    }
    return outs.empty() ? at::empty({0, q.size(1), c.topk}, pos.options().dtype(at::kInt))
                        : at::stack(outs);
  }
  at::Tensor out = at::full({q.size(0), c.topk}, -1, pos.options().dtype(at::kInt));
  const at::Tensor cq = c.cu_seqlens_q->to(at::kCPU).to(at::kLong);  // a GPU syncs here
  const at::Tensor ck = c.cu_seqlens_k->to(at::kCPU).to(at::kLong);
  const int64_t* vq = cq.data_ptr<int64_t>();
  const int64_t* vk = ck.data_ptr<int64_t>();
  for (int64_t i = 0; i + 1 < cq.size(0); ++i) {
    const int64_t q0 = vq[i], nq = vq[i + 1] - q0, k0 = vk[i], nk = vk[i + 1] - k0;
    if (nq == 0) continue;
    out.narrow(0, q0, nq).copy_(topk_of_sequence(c, q.narrow(0, q0, nq), k.narrow(0, k0, nk),
                                                 w.narrow(0, q0, nq), pos.narrow(0, q0, nq)));
  }
  return out;
}

std::string dsv4_indexer_topk_path(const IndexerCall& c) {
  return route(c, false).sm90 ? "sm90" : "reference";
}

std::string dsv4_indexer_topk_plan(const IndexerCall& c) {
  const Route<IndexerPlan> r = route(c, true);
  return r.sm90 ? "sm90 " + describe(r.plan) : "reference: " + r.why_not;
}

}  // namespace dsv4
