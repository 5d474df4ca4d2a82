// dsv4_attention: one DeepSeek-V4 attention layer as one softmax over three key sets that share
// a single KV head used as both key and value (the sliding window of raw tokens, and the closed
// rows of a compressed KV, all of them (HCA) or those an indexer listed (CSA)), plus a per-head
// sink logit. The validated call, its checks, and the op with its twins.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <tuple>

namespace dsv4 {

// A validated call. Dense: q (B, Sq, Hq, D), kv (B, Skv, D), compressed_kv (B, Sc, D),
// topk_indices int32 (B, Sq, K). Varlen: q (total_q, Hq, D), kv (total_kv, D),
// compressed_kv (total_c, D), topk_indices (total_q, K), cu_seqlens_* (N+1,) held in int32.
// Query i of a sequence sits at position t = Skv - Sq + i and sees
//   kv rows j with t - window < j <= t, and
//   compressed rows w < min(Sc, floor((t + 1) / compress_ratio)) (all of them, or with
//   topk_indices those listed; an index outside that range is skipped, a repeat counts twice).
struct Dsv4Call {
  at::Tensor q, kv;
  std::optional<at::Tensor> compressed_kv, topk_indices, sinks;
  std::optional<at::Tensor> cu_seqlens_q, cu_seqlens_kv, cu_seqlens_compressed;
  bool varlen = false;
  int64_t batch = 0;                   // B dense, N varlen
  int64_t seqlen_q = 0, seqlen_kv = 0;  // dense lengths; varlen: max_seqlen_* (-1 = unknown)
  int64_t seqlen_compressed = 0;        // dense Sc; varlen: unused
  int64_t heads = 0, head_dim = 0, topk = 0;
  int64_t window = 0, compress_ratio = 0;
  double scale = 1.0;
};

// The op's arguments, in schema order (torch_bindings.cpp's kDsv4Args).
Dsv4Call check_dsv4_inputs(const at::Tensor& q, const at::Tensor& kv,
                           const std::optional<at::Tensor>& sinks, int64_t window,
                           const std::optional<at::Tensor>& compressed_kv, int64_t compress_ratio,
                           const std::optional<at::Tensor>& topk_indices,
                           std::optional<double> scale,
                           const std::optional<at::Tensor>& cu_seqlens_q,
                           const std::optional<at::Tensor>& cu_seqlens_kv,
                           const std::optional<at::Tensor>& cu_seqlens_compressed,
                           int64_t max_seqlen_q, int64_t max_seqlen_kv);

// Portable path: ATen ops in fp32 on any device, in blocks of query rows. Fills out (q's
// shape) and lse (fp32, (B, Hq, Sq) or (Hq, total_q)).
void dsv4_attention_reference(const Dsv4Call& call, at::Tensor& out, at::Tensor& lse);

// The op and its _path and _plan twins (registered through OpEntry; the head_dim-512 family,
// csrc/sm90/mqa512, runs what its route takes).
std::tuple<at::Tensor, at::Tensor> dsv4_attention(const Dsv4Call& call);
std::string dsv4_attention_path(const Dsv4Call& call);  // "sm90" or "reference"
std::string dsv4_attention_plan(const Dsv4Call& call);

}  // namespace dsv4
