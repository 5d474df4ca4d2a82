// fmha: the validated call, its checks, and the op with its _path and _plan twins (registered in
// torch_bindings.cpp through OpEntry). The sm90 fmha family (csrc/sm90/fmha) runs head_dim 64,
// 128 and 256, the head_dim-512 family (csrc/sm90/mqa512) head_dim 512 with k and v one tensor,
// and fmha_reference.cpp everything else.
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
  int64_t seqlen_q = 0, seqlen_k = 0;  // dense lengths; varlen: max_seqlen_*
  int64_t heads_q = 0, heads_kv = 0, head_dim = 0, head_dim_v = 0;
  double scale = 1.0;
  bool causal = false;
  int64_t window_left = -1;
};

// The op's arguments, in schema order (torch_bindings.cpp's kFmhaArgs).
FmhaCall check_fmha_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           std::optional<double> scale, bool causal, int64_t window_left,
                           const std::optional<at::Tensor>& sinks,
                           const std::optional<at::Tensor>& cu_seqlens_q,
                           const std::optional<at::Tensor>& cu_seqlens_k, int64_t max_seqlen_q,
                           int64_t max_seqlen_k);

std::tuple<at::Tensor, at::Tensor> fmha(const FmhaCall& call);
std::string fmha_path(const FmhaCall& call);  // "sm90" or "reference"
std::string fmha_plan(const FmhaCall& call);  // the route's launch decisions, or why not

// Portable path: ATen ops in fp32, any device. Fills out (q's shape, Dv last) and lse (fp32).
void fmha_reference(const FmhaCall& call, at::Tensor& out, at::Tensor& lse);

}  // namespace dsv4
