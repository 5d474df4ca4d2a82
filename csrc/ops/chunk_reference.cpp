// Portable chunked linear attention: 64-token chunks, batched matmuls in fp32, any device.
// Intra-chunk terms are computed for a block of chunks at once; the state recurrence runs
// chunk by chunk. Varlen batches are gathered into a zero-padded (N, max_len) batch: padded
// tokens have k = v = g = beta = 0, so they leave the state unchanged.
#include <limits>

#include "ops/chunk.h"

namespace dsv4 {
namespace {

constexpr int64_t C = kChunkSize;
constexpr int64_t kIntraElemsPerBlock = int64_t(1) << 24;  // bounds the (.., C, C) temporaries

// (B, T, H, D) -> fp32 (B, HV, NC, C, D), each v-head hv reading qk-head hv / (HV / H);
// T is zero-padded up to NC * C.
at::Tensor to_chunks(const at::Tensor& x, int64_t heads_v, int64_t nc) {
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), D = x.size(3);
  at::Tensor f = x.to(at::kFloat);
  if (H != heads_v) {
    f = f.unsqueeze(3).expand({B, T, H, heads_v / H, D}).reshape({B, T, heads_v, D});
  }
  f = at::constant_pad_nd(f, {0, 0, 0, 0, 0, nc * C - T});
  return f.view({B, nc, C, heads_v, D}).permute({0, 3, 1, 2, 4});
}

// (B, T, HV) fp32 -> (B, HV, NC, C), zero-padded.
at::Tensor gate_chunks(const at::Tensor& x, int64_t nc) {
  const int64_t B = x.size(0), T = x.size(1), HV = x.size(2);
  at::Tensor f = at::constant_pad_nd(x.to(at::kFloat), {0, 0, 0, nc * C - T});
  return f.view({B, nc, C, HV}).permute({0, 3, 1, 2});
}

// Dense core: q, k (B, T, H, K), v (B, T, HV, V), g, beta (B, T, HV); state (B, HV, K, V)
// fp32, updated in place. Returns o (B, T, HV, V) fp32.
at::Tensor chunk_dense(const ChunkCall& c, const at::Tensor& q, const at::Tensor& k,
                       const at::Tensor& v, const at::Tensor& g, const at::Tensor& beta,
                       at::Tensor& state) {
  const int64_t B = q.size(0), T = q.size(1), HV = v.size(2), V = v.size(3);
  const int64_t nc = (T + C - 1) / C;
  const bool delta = c.rule == ChunkRule::kGatedDelta;
  at::Tensor qc = to_chunks(q, HV, nc), kc = to_chunks(k, HV, nc), vc = to_chunks(v, HV, nc);
  at::Tensor G = gate_chunks(g, nc).cumsum(-1);  // inclusive cumulative log-decay per chunk
  at::Tensor bc = delta ? gate_chunks(beta, nc) : at::Tensor();
  at::Tensor o = at::empty({B, HV, nc, C, V}, qc.options());

  const auto fopts = qc.options();
  const float neg_inf = -std::numeric_limits<float>::infinity();
  at::Tensor idx = at::arange(C, fopts.dtype(at::kLong));
  at::Tensor incl = idx.view({C, 1}) >= idx.view({1, C});   // i >= j
  at::Tensor strict = idx.view({C, 1}) > idx.view({1, C});  // i > j
  at::Tensor eye = at::eye(C, fopts);

  const int64_t block = std::max<int64_t>(1, kIntraElemsPerBlock / std::max<int64_t>(1, B * HV * C * C));
  for (int64_t c0 = 0; c0 < nc; c0 += block) {
    const int64_t nb = std::min(block, nc - c0);
    at::Tensor Q = qc.narrow(2, c0, nb), K = kc.narrow(2, c0, nb), Vb = vc.narrow(2, c0, nb);
    at::Tensor Gb = G.narrow(2, c0, nb);
    // Gamma_ij = exp(G_i - G_j), computed pairwise and masked by selection before exp, so the
    // upper triangle can never overflow.
    at::Tensor diff = Gb.unsqueeze(-1) - Gb.unsqueeze(-2);
    at::Tensor gamma_incl = diff.masked_fill(incl.logical_not(), neg_inf).exp();
    at::Tensor attn = at::matmul(Q, K.transpose(-1, -2)).mul_(gamma_incl);  // (.., C, C)
    at::Tensor exp_g = Gb.exp().unsqueeze(-1);                                // (.., C, 1)
    at::Tensor g_last = Gb.narrow(-1, C - 1, 1);                              // (.., 1)
    at::Tensor tail_decay = (g_last - Gb).exp().unsqueeze(-1);                // exp(G_last - G)

    at::Tensor W, U;  // delta rule: V_new = U - W S0
    if (delta) {
      at::Tensor Bt = bc.narrow(2, c0, nb).unsqueeze(-1);  // (.., C, 1)
      at::Tensor gamma_strict = diff.masked_fill(strict.logical_not(), neg_inf).exp();
      at::Tensor A = at::matmul(K, K.transpose(-1, -2)).mul_(gamma_strict).mul_(Bt);
      at::Tensor rhs = at::cat({Bt * exp_g * K, Bt * Vb}, -1);
      at::Tensor sol = at::linalg_solve_triangular(A + eye, rhs, /*upper=*/false,
                                                   /*left=*/true, /*unitriangular=*/true);
      W = sol.narrow(-1, 0, K.size(-1));
      U = sol.narrow(-1, K.size(-1), V);
    }
    for (int64_t j = 0; j < nb; ++j) {
      at::Tensor vnew = delta ? U.select(2, j) - at::matmul(W.select(2, j), state)
                              : Vb.select(2, j);
      at::Tensor oj = at::matmul(Q.select(2, j), state).mul_(exp_g.select(2, j))
                          .add_(at::matmul(attn.select(2, j), vnew))
                          .mul_(c.scale);
      o.select(2, c0 + j).copy_(oj);
      at::Tensor kt_decayed = (K.select(2, j) * tail_decay.select(2, j)).transpose(-1, -2);
      state.mul_(g_last.select(2, j).exp().unsqueeze(-1)).add_(at::matmul(kt_decayed, vnew));
    }
  }
  return o.permute({0, 2, 3, 1, 4}).reshape({B, nc * C, HV, V}).narrow(1, 0, T);
}

}  // namespace

at::Tensor l2norm_rows(const at::Tensor& x) {
  const at::Tensor f = x.to(at::kFloat);
  return (f * f.square().sum(-1, /*keepdim=*/true).add_(1e-6).rsqrt_()).to(x.scalar_type());
}

at::Tensor chunk_reference(const ChunkCall& c, at::Tensor& o) {
  const at::Tensor q = c.qk_l2norm ? l2norm_rows(c.q) : c.q;
  const at::Tensor k = c.qk_l2norm ? l2norm_rows(c.k) : c.k;
  const auto fopts = c.q.options().dtype(at::kFloat);
  const int64_t N = c.num_seqs, HV = c.heads_v;
  at::Tensor state = c.initial_state ? c.initial_state->to(fopts).clone()
                                     : at::zeros({N, HV, c.dim_k, c.dim_v}, fopts);
  const bool delta = c.rule == ChunkRule::kGatedDelta;
  if (!c.cu_seqlens) {
    if (c.seqlen > 0 && N > 0) {
      o.copy_(chunk_dense(c, q, k, c.v, c.g, delta ? *c.beta : at::Tensor(), state));
    }
    return state;
  }
  // Varlen: gather into (N, L, ...) with zero padding, run dense, scatter back.
  const int64_t T = c.seqlen;
  if (T == 0 || N == 0) return state;
  at::Tensor cu = c.cu_seqlens->to(at::kLong);
  at::Tensor starts = cu.narrow(0, 0, N), lengths = cu.narrow(0, 1, N) - starts;
  const int64_t L = lengths.max().item<int64_t>();  // host sync (the reference path needs L)
  at::Tensor slot = at::arange(L, cu.options()).view({1, L});
  at::Tensor valid = slot < lengths.view({N, 1});                            // (N, L)
  at::Tensor gather = (starts.view({N, 1}) + slot).clamp_max(T - 1).reshape(-1);
  auto pad = [&](const at::Tensor& x) {  // (1, T, ...) -> (N, L, ...), zeros past each end
    at::Tensor y = x.select(0, 0).index_select(0, gather);
    std::vector<int64_t> shape = {N, L};
    for (int64_t d = 1; d < y.dim(); ++d) shape.push_back(y.size(d));
    y = y.view(shape);
    std::vector<int64_t> mshape = {N, L};
    mshape.resize(y.dim(), 1);
    return y * valid.view(mshape).to(y.scalar_type());
  };
  at::Tensor o_pad = chunk_dense(c, pad(q), pad(k), pad(c.v), pad(c.g),
                                 delta ? pad(*c.beta) : at::Tensor(), state);
  at::Tensor row = at::arange(T, cu.options());
  at::Tensor seq = at::searchsorted(cu.narrow(0, 1, N), row, false, /*right=*/true);
  at::Tensor scatter = seq * L + (row - starts.index_select(0, seq));
  o.select(0, 0).copy_(o_pad.reshape({N * L, HV, c.dim_v}).index_select(0, scatter));
  return state;
}

}  // namespace dsv4
