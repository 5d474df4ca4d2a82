// The sm90 chunk family (chunk_gated_delta_rule and chunk_simple_gla at K = V = 128), as the op
// units call it: the problem, the route (every launch decision, or why not) and the launch.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>

#include "sm90/shared/plan.h"

namespace dsv4 {

enum class ChunkRule { kSimpleGla, kGatedDelta };

// A chunk call. q, k (B, T, H, K); v (B, T, HV, V); g, beta (B, T, HV) fp32. Varlen: B == 1 and
// cu_seqlens int32 (N+1,). States fp32 (N, HV, K, V), N = B when dense. qk_l2norm (delta rule):
// q and k rows are l2-normalized first, as in flash-linear-attention's use_qk_l2norm_in_kernel.
// The chunk ops' validated call is this problem (ops/chunk.h).
struct ChunkProblem {
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

struct ChunkPlan {
  bool delta = false, varlen = false;
  // Each sequence cut into `segments` segments of segment_len tokens walked in parallel
  // (1: unsplit), their starting states from warm-ups where the plan allows them.
  int64_t segments = 1, segment_len = 0;
  bool warmups = true;
  bool fused_inverse = false;  // the prep solves the even chunks' inverses itself (kFused)
};

Route<ChunkPlan> route_chunk(const ChunkProblem& problem, const DeviceFacts& device,
                             const Overrides& overrides);

// "chunk delta segments=4x2048 warmups fused=0", for the _plan ops.
std::string describe(const ChunkPlan& plan);

// Queues the kernels on the current stream: fills o and, when defined, final_state
// (N, HV, K, V) fp32. CUDA builds only.
void run_chunk(const ChunkProblem& problem, const ChunkPlan& plan, at::Tensor& o,
               at::Tensor& final_state);

}  // namespace dsv4
