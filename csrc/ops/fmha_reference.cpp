// Portable fmha: ATen ops in fp32 on any device. Varlen batches are gathered into a padded
// (N, max_seqlen, ...) batch and masked by per-sequence lengths, so no host sync is needed
// when max_seqlen_* are given. Query rows are processed in blocks to bound the score memory.
#include <limits>

#include "ops/fmha.h"

namespace dsv4 {
namespace {

constexpr int64_t kScoreElemsPerBlock = int64_t(1) << 26;  // 256 MiB of fp32 scores

// Padded attention. qf (B, Hkv, G, Sq, D), kf (B, Hkv, Sk, D), vf (B, Hkv, Sk, Dv) in fp32;
// len_q / len_k (B,) int64 true lengths (<= Sq / Sk). Returns out (B, Hkv, G, Sq, Dv) and
// lse (B, Hkv, G, Sq).
std::tuple<at::Tensor, at::Tensor> attention_padded(const FmhaCall& c, const at::Tensor& qf,
                                                    const at::Tensor& kf, const at::Tensor& vf,
                                                    const at::Tensor& len_q,
                                                    const at::Tensor& len_k) {
  const int64_t B = qf.size(0), Hkv = qf.size(1), G = qf.size(2), Sq = qf.size(3);
  const int64_t Sk = kf.size(2), Dv = vf.size(3);
  const auto fopts = qf.options();
  const float neg_inf = -std::numeric_limits<float>::infinity();

  at::Tensor sink_logit;  // (1, Hkv, G, 1)
  if (c.sinks) sink_logit = c.sinks->to(fopts).view({1, Hkv, G, 1});

  at::Tensor out = at::empty({B, Hkv, G, Sq, Dv}, fopts);
  at::Tensor lse = at::empty({B, Hkv, G, Sq}, fopts);
  const at::Tensor kt = kf.transpose(-1, -2);
  const at::Tensor key_pos = at::arange(Sk, len_k.options()).view({1, 1, Sk});
  const at::Tensor lq = len_q.view({B, 1, 1}), lk = len_k.view({B, 1, 1});

  const int64_t block =
      std::max<int64_t>(1, kScoreElemsPerBlock / std::max<int64_t>(1, B * Hkv * G * Sk));
  for (int64_t i0 = 0; i0 < Sq; i0 += block) {
    const int64_t rows = std::min(block, Sq - i0);
    at::Tensor q_blk = qf.narrow(3, i0, rows).reshape({B, Hkv, G * rows, qf.size(4)});
    at::Tensor s = at::matmul(q_blk, kt).mul_(c.scale).view({B, Hkv, G, rows, Sk});

    // Query i sits at position p = i + Lk - Lq of its sequence (bottom-right alignment).
    at::Tensor pos = at::arange(i0, i0 + rows, len_k.options()).view({1, rows, 1}) + lk - lq;
    at::Tensor visible = key_pos < lk;  // (B, 1, Sk) -> broadcast to (B, rows, Sk)
    visible = visible.expand({B, rows, Sk});
    if (c.causal) visible = visible & (key_pos <= pos);
    if (c.window_left >= 0) visible = visible & (key_pos >= pos - c.window_left);
    s.masked_fill_(visible.logical_not().view({B, 1, 1, rows, Sk}), neg_inf);

    at::Tensor row_lse = Sk > 0 ? at::logsumexp(s, -1)
                                : at::full({B, Hkv, G, rows}, neg_inf, fopts);
    if (c.sinks) row_lse = at::logaddexp(row_lse, sink_logit);
    // A row with nothing visible and no sink has lse = -inf; subtracting 0 keeps p = 0. (A sink
    // of +inf gives lse = +inf and p = 0: out = 0.)
    at::Tensor shift = at::where(row_lse == neg_inf, at::zeros({}, fopts), row_lse);
    at::Tensor p = at::exp(s - shift.unsqueeze(-1));
    at::Tensor o = at::matmul(p.view({B, Hkv, G * rows, Sk}), vf).view({B, Hkv, G, rows, Dv});
    out.narrow(3, i0, rows).copy_(o);
    lse.narrow(3, i0, rows).copy_(row_lse);
  }
  return {out, lse};
}

// (B, S, H, D) -> fp32 (B, H, S, D)
at::Tensor heads_first(const at::Tensor& t) { return t.permute({0, 2, 1, 3}).to(at::kFloat); }

void reference_dense(const FmhaCall& c, at::Tensor& out, at::Tensor& lse) {
  const int64_t B = c.batch, Sq = c.seqlen_q, Hkv = c.heads_kv, G = c.heads_q / c.heads_kv;
  at::Tensor qf = heads_first(c.q).reshape({B, Hkv, G, Sq, c.head_dim});
  at::Tensor kf = heads_first(c.k), vf = heads_first(c.v);
  const auto lopts = c.q.options().dtype(at::kLong);
  auto [o, l] = attention_padded(c, qf, kf, vf, at::full({B}, Sq, lopts),
                                 at::full({B}, c.seqlen_k, lopts));
  out.copy_(o.reshape({B, c.heads_q, Sq, c.head_dim_v}).permute({0, 2, 1, 3}));
  lse.copy_(l.reshape({B, c.heads_q, Sq}));
}

// Row index into a packed varlen tensor for each padded slot (n, i), clamped into range, and
// the packed -> padded inverse map.
struct VarlenMaps {
  at::Tensor lengths;    // (N,) int64
  at::Tensor gather;     // (N * max_len,) int64: padded slot -> packed row (clamped)
  at::Tensor scatter;    // (total,) int64: packed row -> padded slot
};

VarlenMaps varlen_maps(const at::Tensor& cu, int64_t max_len, int64_t total) {
  at::Tensor cu64 = cu.to(at::kLong);
  const int64_t N = cu64.size(0) - 1;
  at::Tensor starts = cu64.narrow(0, 0, N);
  VarlenMaps m;
  m.lengths = cu64.narrow(0, 1, N) - starts;
  at::Tensor slot = at::arange(max_len, cu64.options()).view({1, max_len});
  m.gather = (starts.view({N, 1}) + slot).clamp_max(std::max<int64_t>(total - 1, 0)).reshape(-1);
  at::Tensor row = at::arange(total, cu64.options());
  at::Tensor seq = at::searchsorted(cu64.narrow(0, 1, N), row, /*out_int32=*/false,
                                    /*right=*/true);
  m.scatter = seq * max_len + (row - cu64.index_select(0, seq));
  return m;
}

void reference_varlen(const FmhaCall& c, at::Tensor& out, at::Tensor& lse) {
  const int64_t N = c.batch, Hq = c.heads_q, Hkv = c.heads_kv, G = Hq / Hkv;
  const int64_t total_q = c.q.size(0), total_k = c.k.size(0);
  const int64_t Lq = c.seqlen_q, Lk = c.seqlen_k;
  if (total_q == 0) return;
  if (total_k == 0) {  // nothing to attend to: sink-only rows or empty rows
    out.zero_();
    if (c.sinks) lse.copy_(c.sinks->view({Hq, 1}).expand({Hq, total_q}));
    else lse.fill_(-std::numeric_limits<float>::infinity());
    return;
  }
  VarlenMaps mq = varlen_maps(*c.cu_seqlens_q, Lq, total_q);
  VarlenMaps mk = varlen_maps(*c.cu_seqlens_k, Lk, total_k);
  at::Tensor qf = heads_first(c.q.index_select(0, mq.gather).view({N, Lq, Hq, c.head_dim}))
                      .reshape({N, Hkv, G, Lq, c.head_dim});
  at::Tensor kf = heads_first(c.k.index_select(0, mk.gather).view({N, Lk, Hkv, c.head_dim}));
  at::Tensor vf = heads_first(c.v.index_select(0, mk.gather).view({N, Lk, Hkv, c.head_dim_v}));
  auto [o, l] = attention_padded(c, qf, kf, vf, mq.lengths, mk.lengths);
  // (N, Hq, Lq, Dv) -> (N*Lq, Hq, Dv), then pick each packed row's slot.
  at::Tensor o_rows = o.reshape({N, Hq, Lq, c.head_dim_v}).permute({0, 2, 1, 3})
                          .reshape({N * Lq, Hq, c.head_dim_v});
  out.copy_(o_rows.index_select(0, mq.scatter));
  at::Tensor l_rows = l.reshape({N, Hq, Lq}).permute({1, 0, 2}).reshape({Hq, N * Lq});
  lse.copy_(l_rows.index_select(1, mq.scatter));
}

}  // namespace

void fmha_reference(const FmhaCall& call, at::Tensor& out, at::Tensor& lse) {
  if (out.numel() == 0 && lse.numel() == 0) return;
  if (call.varlen) {
    reference_varlen(call, out, lse);
  } else {
    reference_dense(call, out, lse);
  }
}

}  // namespace dsv4
