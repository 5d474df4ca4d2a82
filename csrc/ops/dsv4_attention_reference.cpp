// Portable dsv4_attention: ATen ops in fp32 on any device. Dense calls are viewed as varlen
// ones (one sequence per batch row), and query rows are processed in blocks. For each row the
// block gathers its candidate keys: `window` kv rows ending at its position, then either the
// first closed compressed rows (HCA) or its top-k rows (CSA). Invalid slots are masked to -inf,
// and one fp32 softmax with the sink covers all of them. Per-row facts are computed on the
// device from cu_seqlens, so a varlen call with max_seqlen_* given makes no host sync.
#include <algorithm>
#include <limits>

#include "ops/dsv4_attention.h"

namespace dsv4 {
namespace {

// fp32 elements the gathered keys and scores of one block may take (256 MiB).
constexpr int64_t kBlockElems = int64_t(1) << 26;

// Per query row, int64 (rows,): its position t in its sequence's kv, and where its sequence's
// kv and compressed rows start in the flattened tensors and how many there are.
struct RowFacts {
  at::Tensor pos, kv_start, kv_len, c_start, c_len;
};

RowFacts row_facts(const Dsv4Call& c, int64_t rows) {
  const auto lopts = c.q.options().dtype(at::kLong);
  RowFacts f;
  if (!c.varlen) {
    const int64_t Sq = c.seqlen_q, Skv = c.seqlen_kv, Sc = c.seqlen_compressed;
    const at::Tensor r = at::arange(rows, lopts);
    const at::Tensor b = r.div(Sq, "floor");
    f.pos = r - b * Sq + (Skv - Sq);
    f.kv_start = b * Skv;
    f.kv_len = at::full({rows}, Skv, lopts);
    f.c_start = b * Sc;
    f.c_len = at::full({rows}, Sc, lopts);
    return f;
  }
  const int64_t N = c.batch;
  const at::Tensor cu_q = c.cu_seqlens_q->to(at::kLong), cu_kv = c.cu_seqlens_kv->to(at::kLong);
  const at::Tensor r = at::arange(rows, lopts);
  const at::Tensor seq = at::searchsorted(cu_q.narrow(0, 1, N), r, /*out_int32=*/false,
                                          /*right=*/true);
  const at::Tensor q_start = cu_q.index_select(0, seq);
  const at::Tensor q_len = cu_q.index_select(0, seq + 1) - q_start;
  f.kv_start = cu_kv.index_select(0, seq);
  f.kv_len = cu_kv.index_select(0, seq + 1) - f.kv_start;
  f.pos = f.kv_len - q_len + (r - q_start);
  if (c.cu_seqlens_compressed) {
    const at::Tensor cu_c = c.cu_seqlens_compressed->to(at::kLong);
    f.c_start = cu_c.index_select(0, seq);
    f.c_len = cu_c.index_select(0, seq + 1) - f.c_start;
  } else {
    f.c_start = at::zeros({rows}, lopts);
    f.c_len = at::zeros({rows}, lopts);
  }
  return f;
}

// src (T, D) rows at start + local (R, S), clamped into range where invalid -> fp32 (R, S, D).
at::Tensor gather_rows(const at::Tensor& src, const at::Tensor& start, const at::Tensor& local,
                       const at::Tensor& valid) {
  const int64_t R = local.size(0), S = local.size(1), D = src.size(1);
  if (src.size(0) == 0 || S == 0) return at::zeros({R, S, D}, src.options().dtype(at::kFloat));
  const at::Tensor idx = at::where(valid, start.view({R, 1}) + local, at::zeros({}, local.options()))
                             .clamp_(0, src.size(0) - 1);
  return src.index_select(0, idx.reshape(-1)).view({R, S, D}).to(at::kFloat);
}

}  // namespace

void dsv4_attention_reference(const Dsv4Call& c, at::Tensor& out, at::Tensor& lse) {
  if (out.numel() == 0 && lse.numel() == 0) return;
  const int64_t H = c.heads, D = c.head_dim;
  const int64_t rows = c.varlen ? c.q.size(0) : c.batch * c.seqlen_q;
  const at::Tensor q_rows = c.q.reshape({rows, H, D});
  const at::Tensor kv_rows = c.kv.reshape({-1, D});
  const bool has_c = c.compressed_kv.has_value(), csa = c.topk_indices.has_value();
  const at::Tensor c_rows = has_c ? c.compressed_kv->reshape({-1, D}) : at::Tensor();
  const at::Tensor topk = csa ? c.topk_indices->reshape({rows, c.topk}).to(at::kLong) : at::Tensor();
  const RowFacts f = row_facts(c, rows);
  const auto fopts = c.q.options().dtype(at::kFloat);
  const auto lopts = c.q.options().dtype(at::kLong);
  const float neg_inf = -std::numeric_limits<float>::infinity();

  // Candidate slots per row: W window rows, then Kc compressed rows (all that can ever be
  // closed for HCA, the K listed ones for CSA).
  const int64_t max_kv = std::max<int64_t>(c.seqlen_kv, 0);
  const int64_t W = std::min(c.window, max_kv);
  int64_t Kc = 0;
  if (csa) {
    Kc = c.topk;
  } else if (has_c) {
    Kc = max_kv / c.compress_ratio;
    if (!c.varlen) Kc = std::min(Kc, c.seqlen_compressed);
  }
  const int64_t slots = W + Kc;
  const int64_t block = std::max<int64_t>(1, kBlockElems / std::max<int64_t>(1, slots * (D + 3 * H)));

  at::Tensor out_rows = out.view({rows, H, D});
  at::Tensor lse_rows = at::empty({rows, H}, fopts);
  at::Tensor sink = c.sinks ? c.sinks->to(fopts).view({1, H}) : at::Tensor();
  const at::Tensor win_slot = at::arange(W, lopts).view({1, W});
  const at::Tensor comp_slot = at::arange(Kc, lopts).view({1, Kc});

  for (int64_t r0 = 0; r0 < rows; r0 += block) {
    const int64_t R = std::min(block, rows - r0);
    const at::Tensor pos = f.pos.narrow(0, r0, R).view({R, 1});
    // Window: kv rows pos - s for s < W (s < window holds since W <= window).
    const at::Tensor win_local = pos - win_slot;
    const at::Tensor win_valid = win_local >= 0;
    at::Tensor keys = gather_rows(kv_rows, f.kv_start.narrow(0, r0, R), win_local, win_valid);
    at::Tensor valid = win_valid;
    if (has_c) {
      // Closed rows: w < min(Sc, floor((t + 1) / r)).
      const at::Tensor closed = at::minimum(f.c_len.narrow(0, r0, R).view({R, 1}),
                                            (pos + 1).clamp_min(0).div(c.compress_ratio, "floor"));
      const at::Tensor local = csa ? topk.narrow(0, r0, R) : comp_slot.expand({R, Kc});
      const at::Tensor c_valid = (local >= 0) & (local < closed);
      keys = at::cat({keys, gather_rows(c_rows, f.c_start.narrow(0, r0, R), local, c_valid)}, 1);
      valid = at::cat({valid, c_valid}, 1);
    }
    // One softmax over every slot of the row, plus the sink.
    const at::Tensor qf = q_rows.narrow(0, r0, R).to(at::kFloat);          // (R, H, D)
    at::Tensor s = at::bmm(qf, keys.transpose(1, 2)).mul_(c.scale);          // (R, H, slots)
    s.masked_fill_(valid.logical_not().view({R, 1, slots}), neg_inf);
    at::Tensor row_lse = slots > 0 ? at::logsumexp(s, -1) : at::full({R, H}, neg_inf, fopts);
    if (c.sinks) row_lse = at::logaddexp(row_lse, sink);
    // A row with nothing visible and no sink has lse = -inf: shift by 0 so p = 0, not NaN. (A
    // sink of +inf gives lse = +inf and p = 0: out = 0.)
    const at::Tensor shift = at::where(row_lse == neg_inf, at::zeros({}, fopts), row_lse);
    const at::Tensor p = at::exp(s - shift.unsqueeze(-1));
    out_rows.narrow(0, r0, R).copy_(at::bmm(p, keys));
    lse_rows.narrow(0, r0, R).copy_(row_lse);
  }
  if (c.varlen) {
    lse.copy_(lse_rows.t());
  } else {
    lse.copy_(lse_rows.view({c.batch, c.seqlen_q, H}).permute({0, 2, 1}));
  }
}

}  // namespace dsv4
