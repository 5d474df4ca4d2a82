// dsv4_indexer_topk: the sm90 kernels (csrc/sm90/indexer), and elsewhere the reference path:
// the scores of a block of queries against all of its sequence's rows, one head at a time (so
// memory stays at a block x rows fp32 tensor, never Sq x H x Sc), then a stable sort for the
// top-k (ties to the lower row). dsv4_indexer_topk_paged, its form over the paged FP8 indexer
// cache: the sm90 kernels for float8_e4m3 q, the reference path elsewhere.
#include "ops/indexer.h"

#include <c10/core/DeviceGuard.h>

#include <cmath>
#include <limits>
#include <vector>

#include "ops/checks.h"

namespace dsv4 {
namespace {
constexpr const char* kOp = "dsv4_indexer_topk";
constexpr int64_t kQueryBlock = 256;

bool is_fp8(const at::Tensor& t) { return t.scalar_type() == at::kFloat8_e4m3fn; }

Route<IndexerPlan> route(const IndexerCall& c, bool for_plan) {
  const Overrides overrides = read_overrides();
  return route_indexer(c, device_facts(c.q, overrides, for_plan), overrides);
}

// Σ_h w_h ReLU(scale q_h · k) of fp32 queries q (..., n, H, D) against the keys transposed,
// keys_t (..., D, S), with weights w (..., n, H): (..., n, S), one head at a time.
at::Tensor head_sum_scores(const at::Tensor& q, const at::Tensor& keys_t, const at::Tensor& w,
                           double scale) {
  std::vector<int64_t> shape(q.sizes().begin(), q.sizes().end() - 2);
  shape.push_back(keys_t.size(-1));
  at::Tensor score = at::zeros(shape, q.options());
  for (int64_t h = 0; h < q.size(-2); ++h) {
    score.add_(at::relu(at::matmul(q.select(-2, h), keys_t) * scale) *
               w.select(-1, h).unsqueeze(-1));
  }
  return score;
}

// The `keep` best rows along score's last dim (-inf: not visible, listed as -1); the sort is
// stable, so ties go to the lower row.
at::Tensor best_rows(const at::Tensor& score, int64_t keep) {
  const auto [val, idx] = at::sort(score, /*stable=*/true, /*dim=*/-1, /*descending=*/true);
  return at::where(at::isfinite(val.narrow(-1, 0, keep)), idx.narrow(-1, 0, keep), -1);
}

// One sequence: q (Sq, H, D), k (Sc, D) fp32 (k_scale folded in), weights (Sq, H) fp32,
// positions (Sq,) int64 -> (Sq, topk) int32.
at::Tensor topk_of_sequence(const IndexerCall& c, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& w, const at::Tensor& pos) {
  const int64_t sq = q.size(0), sc = k.size(0);
  at::Tensor out = at::full({sq, c.topk}, -1, pos.options().dtype(at::kInt));
  if (sq == 0 || sc == 0) return out;
  const at::Tensor rows = at::arange(sc, pos.options());
  const int64_t keep = std::min(c.topk, sc);
  for (int64_t i0 = 0; i0 < sq; i0 += kQueryBlock) {
    const int64_t n = std::min(kQueryBlock, sq - i0);
    at::Tensor score =
        head_sum_scores(q.narrow(0, i0, n), k.t(), w.narrow(0, i0, n), c.scale);  // (n, Sc)
    const at::Tensor closed = at::clamp(at::div(pos.narrow(0, i0, n) + 1, c.compress_ratio,
                                                "floor"), 0, sc);
    score.masked_fill_(rows.unsqueeze(0) >= closed.unsqueeze(1),
                       -std::numeric_limits<float>::infinity());
    out.narrow(0, i0, n).narrow(1, 0, keep).copy_(best_rows(score, keep));
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

// ----------------------------------------------------------------------------- the paged form

namespace {
constexpr const char* kPagedOp = "dsv4_indexer_topk_paged";
constexpr int64_t kCacheDim = 128;       // float8_e4m3 values per row
constexpr int64_t kCacheRowBytes = 132;  // per row of a block: 128 values and an fp32 scale
constexpr int64_t kDequantBudget = int64_t(256) << 20;  // fp32 rows dequantized at once

Route<IndexerPlan> route_paged(const IndexerPagedCall& c, bool for_plan) {
  const Overrides overrides = read_overrides();
  return route_indexer_paged(c, device_facts(c.q, overrides, for_plan), overrides);
}

void check_index_dtype(const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, kPagedOp, ": ", name,
              " must be int32 or int64 (got ", t.scalar_type(), ")");
}

// The cache's blocks as rows of bytes: (num_blocks, P * 132), each P * 128 value bytes then
// P * 4 scale bytes.
at::Tensor cache_block_bytes(const at::Tensor& cache) {
  const int64_t blocks = cache.size(0), rows = cache.size(1);
  const int64_t block_stride = blocks == 1 ? rows * kCacheRowBytes : cache.stride(0);
  return cache.as_strided({blocks, rows * kCacheRowBytes}, {block_stride, 1},
                          cache.storage_offset());
}
}  // namespace

IndexerPagedCall check_indexer_paged_inputs(const at::Tensor& q, const at::Tensor& k_cache,
                                            const at::Tensor& weights,
                                            const at::Tensor& positions,
                                            const at::Tensor& block_table,
                                            const at::Tensor& context_lens, int64_t topk,
                                            int64_t compress_ratio, std::optional<double> scale) {
  const char* op = kPagedOp;
  for (const auto& [name, t] : {std::pair{"q", &q}, std::pair{"k_cache", &k_cache},
                                std::pair{"weights", &weights}, std::pair{"positions", &positions},
                                std::pair{"block_table", &block_table},
                                std::pair{"context_lens", &context_lens}}) {
    check_defined(op, name, *t);
    if (t != &q) check_same_device(op, name, *t, "q", q);
  }
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf ||
                  q.scalar_type() == at::kFloat || is_fp8(q),
              op, ": q must be bf16, fp16, fp32 or float8_e4m3fn (got ", q.scalar_type(), ")");
  check_dim(op, "q", q, 4, "(B, N, H, 128): N query tokens per request");
  check_size(op, "q", q, 3, kCacheDim, "the indexer cache's head dim");
  TORCH_CHECK(q.size(2) >= 1, op, ": q must have at least one head (got shape ", shape_str(q),
              ")");
  // The cache: (num_blocks, P, 1, 132) bytes over whole blocks of P * 132 bytes or more.
  check_dtype(op, "k_cache", k_cache, at::kByte);
  check_dim(op, "k_cache", k_cache, 4, "(num_blocks, P, 1, 132)");
  check_size(op, "k_cache", k_cache, 2, 1, "one head");
  check_size(op, "k_cache", k_cache, 3, kCacheRowBytes, "bytes per row: 128 values, a scale");
  TORCH_CHECK(k_cache.size(0) >= 1 && k_cache.size(1) >= 1, op,
              ": k_cache must hold at least one block of at least one row (got shape ",
              shape_str(k_cache), ")");
  TORCH_CHECK(k_cache.stride(3) == 1 &&
                  (k_cache.size(1) == 1 || k_cache.stride(1) == kCacheRowBytes) &&
                  (k_cache.size(0) == 1 || k_cache.stride(0) >= k_cache.size(1) * kCacheRowBytes),
              op, ": k_cache must be a view of whole blocks, strides (block bytes >= P * 132, "
              "132, any, 1) (got ", k_cache.strides(), ")");
  const int64_t batch = q.size(0);
  TORCH_CHECK(weights.scalar_type() == at::kFloat || weights.scalar_type() == at::kBFloat16 ||
                  weights.scalar_type() == at::kHalf,
              op, ": weights must be fp32, bf16 or fp16 (got ", weights.scalar_type(), ")");
  TORCH_CHECK(weights.sizes() == q.sizes().slice(0, 3), op,
              ": weights must have shape (B, N, H) = ", q.sizes().slice(0, 3), " (got ",
              shape_str(weights), ")");
  check_index_dtype("positions", positions);
  TORCH_CHECK(positions.sizes() == q.sizes().slice(0, 2), op,
              ": positions must have shape (B, N) = ", q.sizes().slice(0, 2), " (got ",
              shape_str(positions), ")");
  check_index_dtype("block_table", block_table);
  check_dim(op, "block_table", block_table, 2, "(B, max_blocks)");
  check_size(op, "block_table", block_table, 0, batch, "B, as in q");
  check_index_dtype("context_lens", context_lens);
  check_dim(op, "context_lens", context_lens, 1, "(B,)");
  check_size(op, "context_lens", context_lens, 0, batch, "B, as in q");
  TORCH_CHECK(topk >= 1, op, ": topk must be at least 1 (got ", topk, ")");
  TORCH_CHECK(compress_ratio >= 1, op, ": compress_ratio must be at least 1 (got ",
              compress_ratio, ")");
  check_scale(op, scale);
  // The table's contents: free to check on the CPU; on a GPU they are trusted (clamped into
  // the cache), as reading them would be a host sync.
  if (block_table.device().is_cpu() && batch > 0) {
    const int64_t rows = k_cache.size(1), capacity = block_table.size(1) * rows;
    const at::Tensor lens = context_lens.to(at::kLong);
    const int64_t lo = lens.min().item<int64_t>(), hi = lens.max().item<int64_t>();
    TORCH_CHECK(lo >= 0 && hi <= capacity, op, ": context_lens must lie in [0, max_blocks * P = ",
                capacity, "] (got values from ", lo, " to ", hi, ")");
    const at::Tensor used = at::arange(block_table.size(1), lens.options()).unsqueeze(0) * rows <
                            lens.unsqueeze(1);
    const at::Tensor ids = block_table.to(at::kLong).masked_select(used);
    if (ids.numel() > 0) {
      const int64_t id_lo = ids.min().item<int64_t>(), id_hi = ids.max().item<int64_t>();
      TORCH_CHECK(id_lo >= 0 && id_hi < k_cache.size(0), op,
                  ": block_table's blocks within context_lens must lie in [0, num_blocks = ",
                  k_cache.size(0), ") (got values from ", id_lo, " to ", id_hi, ")");
    }
  }
  IndexerPagedCall c;
  c.q = q;
  c.k_cache = k_cache;
  c.weights = weights;
  c.positions = positions;
  c.block_table = block_table;
  c.context_lens = context_lens;
  c.topk = topk;
  c.compress_ratio = compress_ratio;
  c.scale = scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(kCacheDim));
  return c;
}

// The reference path, on any device and without a host sync: each request's table is read in
// full (max_blocks * P rows, dequantized in fp32, a few requests at a time), and rows at or past
// min(context_lens[b], (p + 1) // compress_ratio) score -inf before a stable sort.
at::Tensor dsv4_indexer_topk_paged(const IndexerPagedCall& c) {
  c10::DeviceGuard guard(c.q.device());
  if (const Route<IndexerPlan> r = route_paged(c, false); r.sm90) {
    at::Tensor out = at::empty({c.q.size(0), c.q.size(1), c.topk}, c.q.options().dtype(at::kInt));
    run_indexer_paged(c, r.plan, out);
    return out;
  }
  const int64_t batch = c.q.size(0), tokens = c.q.size(1);
  const int64_t num_blocks = c.k_cache.size(0), rows = c.k_cache.size(1);
  const int64_t max_blocks = c.block_table.size(1), span = max_blocks * rows;
  const at::TensorOptions int_opts = c.q.options().dtype(at::kInt);
  at::Tensor out = at::full({batch, tokens, c.topk}, -1, int_opts);
  if (batch == 0 || tokens == 0 || span == 0) return out;
  const at::Tensor bytes = cache_block_bytes(c.k_cache);
  const at::Tensor q = c.q.to(at::kFloat), w = c.weights.to(at::kFloat);
  const at::Tensor pos = c.positions.to(at::kLong), lens = c.context_lens.to(at::kLong);
  const at::Tensor table = c.block_table.to(at::kLong).clamp(0, num_blocks - 1);
  const at::Tensor row_ids = at::arange(span, pos.options());
  const int64_t keep = std::min(c.topk, span);
  const int64_t per_chunk = std::max<int64_t>(1, kDequantBudget / (span * kCacheDim * 4));
  for (int64_t b0 = 0; b0 < batch; b0 += per_chunk) {
    const int64_t nb = std::min(per_chunk, batch - b0);
    const at::Tensor blocks = bytes.index_select(0, table.narrow(0, b0, nb).reshape({-1}));
    const at::Tensor values = blocks.narrow(1, 0, rows * kCacheDim)
                                  .view(at::kFloat8_e4m3fn)
                                  .to(at::kFloat)
                                  .reshape({nb, span, kCacheDim});
    const at::Tensor scales = blocks.narrow(1, rows * kCacheDim, rows * 4)
                                  .contiguous()
                                  .view(at::kFloat)
                                  .reshape({nb, span, 1});
    const at::Tensor keys_t = (values * scales).transpose(1, 2);  // (nb, 128, span)
    at::Tensor score = head_sum_scores(q.narrow(0, b0, nb), keys_t, w.narrow(0, b0, nb),
                                       c.scale);  // (nb, N, span)
    const at::Tensor closed = at::clamp(at::div(pos.narrow(0, b0, nb) + 1, c.compress_ratio,
                                                "floor"), 0);
    const at::Tensor limit = at::minimum(closed, lens.narrow(0, b0, nb).unsqueeze(1));
    score.masked_fill_(row_ids.view({1, 1, span}) >= limit.unsqueeze(2),
                       -std::numeric_limits<float>::infinity());
    out.narrow(0, b0, nb).narrow(2, 0, keep).copy_(best_rows(score, keep));
  }
  return out;
}

std::string dsv4_indexer_topk_paged_path(const IndexerPagedCall& c) {
  return route_paged(c, false).sm90 ? "sm90" : "reference";
}

std::string dsv4_indexer_topk_paged_plan(const IndexerPagedCall& c) {
  const Route<IndexerPlan> r = route_paged(c, true);
  return r.sm90 ? "sm90 " + describe(r.plan) : "reference: " + r.why_not;
}

}  // namespace dsv4
