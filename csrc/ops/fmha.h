// fmha and merge_attn_states: the op entry points, the validated call description that both
// the reference path and the sm90 kernel consume, and the two implementations' entry points.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <tuple>

namespace dsv4 {

// A validated fmha call. Dense: q (B, Sq, Hq, D), k (B, Sk, Hkv, D), v (B, Sk, Hkv, Dv).
// Varlen: q (total_q, Hq, D), k/v (total_k, Hkv, D|Dv), cu_seqlens_* int32 (N+1,).
struct FmhaCall {
  at::Tensor q, k, v;
  std::optional<at::Tensor> sinks;                       // fp32 (Hq,)
  std::optional<at::Tensor> cu_seqlens_q, cu_seqlens_k;  // int32 (N+1,)
  bool varlen = false;
  int64_t batch = 0;  // B dense, N varlen
  int64_t seqlen_q = 0, seqlen_k = 0;  // dense lengths; varlen: max_seqlen_* (-1 = unknown)
  int64_t heads_q = 0, heads_kv = 0, head_dim = 0, head_dim_v = 0;
  double scale = 1.0;
  bool causal = false;
  int64_t window_left = -1;
};

// q/k/v as the sm90 tensor maps describe them, (B, S, H, D): a varlen call's packed
// (total, H, D) tensors are one batch.
inline at::Tensor as_bshd(const FmhaCall& c, const at::Tensor& t) {
  return c.varlen ? t.unsqueeze(0) : t;
}

FmhaCall check_fmha_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           std::optional<double> scale, bool causal, int64_t window_left,
                           const std::optional<at::Tensor>& sinks,
                           const std::optional<at::Tensor>& cu_seqlens_q,
                           const std::optional<at::Tensor>& cu_seqlens_k, int64_t max_seqlen_q,
                           int64_t max_seqlen_k);

void check_merge_inputs(const at::Tensor& out_a, const at::Tensor& lse_a,
                        const at::Tensor& out_b, const at::Tensor& lse_b);

// Portable path: ATen ops in fp32, any device. Fills out (q's shape, Dv last) and lse (fp32).
void fmha_reference(const FmhaCall& call, at::Tensor& out, at::Tensor& lse);

// sm90 paths (compiled only with DSV4_WITH_CUDA): head_dim 64/128/256 (csrc/fmha), and
// head_dim 512 with k and v one tensor, query heads packed per KV head (csrc/sm90/mqa512).
bool fmha_sm90_covers(const FmhaCall& call);
void fmha_sm90(const FmhaCall& call, at::Tensor& out, at::Tensor& lse);
bool mqa512_sm90_covers(const FmhaCall& call);
void mqa512_sm90(const FmhaCall& call, at::Tensor& out, at::Tensor& lse);
// merge_attn_states in one fused pass (validated inputs; out and lse allocated contiguous).
bool merge_attn_states_sm90_covers(const at::Tensor& out_a, const at::Tensor& out_b);
void merge_attn_states_sm90(const at::Tensor& out_a, const at::Tensor& lse_a,
                            const at::Tensor& out_b, const at::Tensor& lse_b, at::Tensor& out,
                            at::Tensor& lse);

// ---- ops (registered in torch_bindings.cpp)
std::tuple<at::Tensor, at::Tensor> fmha(const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v, std::optional<double> scale,
                                        bool causal, int64_t window_left,
                                        const std::optional<at::Tensor>& sinks,
                                        const std::optional<at::Tensor>& cu_seqlens_q,
                                        const std::optional<at::Tensor>& cu_seqlens_k,
                                        int64_t max_seqlen_q, int64_t max_seqlen_k);

std::string fmha_path(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                      int64_t window_left, const std::optional<at::Tensor>& sinks,
                      const std::optional<at::Tensor>& cu_seqlens_q,
                      const std::optional<at::Tensor>& cu_seqlens_k);

std::tuple<at::Tensor, at::Tensor> merge_attn_states(const at::Tensor& out_a,
                                                     const at::Tensor& lse_a,
                                                     const at::Tensor& out_b,
                                                     const at::Tensor& lse_b);

}  // namespace dsv4
