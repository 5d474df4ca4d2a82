// chunk_gated_delta_rule and chunk_simple_gla: the op entry points, the validated call, and
// the implementations' entry points.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <tuple>

namespace dsv4 {

enum class ChunkRule { kSimpleGla, kGatedDelta };

// A validated call. q, k (B, T, H, K); v (B, T, HV, V); g, beta fp32 (B, T, HV).
// Varlen: B == 1 and cu_seqlens int32 (N+1,). States fp32 (N, HV, K, V), N = B when dense.
struct ChunkCall {
  ChunkRule rule = ChunkRule::kSimpleGla;
  at::Tensor q, k, v, g;
  std::optional<at::Tensor> beta;  // delta rule only
  std::optional<at::Tensor> initial_state;
  std::optional<at::Tensor> cu_seqlens;
  bool output_final_state = false;
  int64_t batch = 0, seqlen = 0, num_seqs = 0;
  int64_t heads_qk = 0, heads_v = 0, dim_k = 0, dim_v = 0;
  double scale = 1.0;
};

constexpr int64_t kChunkSize = 64;

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
    const std::optional<at::Tensor>& cu_seqlens);

std::tuple<at::Tensor, std::optional<at::Tensor>> chunk_simple_gla(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
    std::optional<double> scale, const std::optional<at::Tensor>& initial_state,
    bool output_final_state, const std::optional<at::Tensor>& cu_seqlens);

std::string chunk_gla_path(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const std::optional<at::Tensor>& cu_seqlens);

}  // namespace dsv4
