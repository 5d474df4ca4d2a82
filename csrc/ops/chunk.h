// chunk_gated_delta_rule and chunk_simple_gla: the op entry points, the validated call, and
// the implementations' entry points.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <tuple>

namespace dsv4 {

enum class ChunkRule { kSimpleGla, kGatedDelta };

// A validated call. q, k (B, T, H, K); v (B, T, HV, V); g, beta (B, T, HV), held in fp32.
// Varlen: B == 1 and cu_seqlens (N+1,), held in int32. States fp32 (N, HV, K, V), N = B when
// dense. qk_l2norm (delta rule): q and k rows are l2-normalized first, as in
// flash-linear-attention's use_qk_l2norm_in_kernel.
struct ChunkCall {
  ChunkRule rule = ChunkRule::kSimpleGla;
  at::Tensor q, k, v, g;
  std::optional<at::Tensor> beta;  // delta rule only
  std::optional<at::Tensor> initial_state;
  std::optional<at::Tensor> cu_seqlens;
  bool output_final_state = false;
  bool qk_l2norm = false;
  int64_t batch = 0, seqlen = 0, num_seqs = 0;
  int64_t heads_qk = 0, heads_v = 0, dim_k = 0, dim_v = 0;
  double scale = 1.0;
};

constexpr int64_t kChunkSize = 64;

// Validates every input of a chunk op (beta only for the delta rule) and returns the call.
ChunkCall check_chunk_inputs(const char* op, ChunkRule rule, const at::Tensor& q,
                             const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                             const std::optional<at::Tensor>& beta, std::optional<double> scale,
                             const std::optional<at::Tensor>& initial_state,
                             bool output_final_state,
                             const std::optional<at::Tensor>& cu_seqlens);

// Portable path: chunk-by-chunk batched matmuls in fp32. Fills o; returns the final state
// (N, HV, K, V) fp32, or an undefined tensor when not asked for.
at::Tensor chunk_reference(const ChunkCall& call, at::Tensor& o);

// sm90 path (compiled only with DSV4_WITH_CUDA): K = V = 128 on an sm_90 device with
// TMA-compatible q, k, v. Fills o and, when defined, final_state (N, HV, K, V) fp32.
bool chunk_sm90_covers(const ChunkCall& call);
void chunk_sm90(const ChunkCall& call, at::Tensor& o, at::Tensor& final_state);

// ---- ops (registered in torch_bindings.cpp)
std::tuple<at::Tensor, std::optional<at::Tensor>> chunk_gated_delta_rule(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
    const at::Tensor& beta, std::optional<double> scale,
    const std::optional<at::Tensor>& initial_state, bool output_final_state,
    const std::optional<at::Tensor>& cu_seqlens, bool use_qk_l2norm_in_kernel);

std::tuple<at::Tensor, std::optional<at::Tensor>> chunk_simple_gla(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
    std::optional<double> scale, const std::optional<at::Tensor>& initial_state,
    bool output_final_state, const std::optional<at::Tensor>& cu_seqlens);

std::string chunk_gla_path(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const std::optional<at::Tensor>& cu_seqlens);

}  // namespace dsv4
