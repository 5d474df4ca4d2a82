// The sm90 fmha family (head_dim 64, 128, 256), as the fmha op calls it: the problem, the route
// (every launch decision, or why not) and the launch.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>

#include "sm90/shared/plan.h"

namespace dsv4 {

struct FmhaProblem {
  // As the tensor maps see them: q (B, Sq, Hq, D), k (B, Sk, Hkv, D), v (B, Sk, Hkv, D);
  // varlen calls' packed tensors as one batch (1, total, H, D).
  at::Tensor q, k, v;
  std::optional<at::Tensor> sinks;                       // fp32 (Hq,)
  std::optional<at::Tensor> cu_seqlens_q, cu_seqlens_k;  // varlen: int32 (N + 1,)
  bool varlen = false;
  int64_t batch = 0;                  // B, or N sequences
  int64_t seqlen_q = 0, seqlen_k = 0;  // dense lengths; varlen: the longest sequence's
  int64_t heads_q = 0, heads_kv = 0, head_dim = 0;
  double scale = 0.0;
  bool causal = false;
  int64_t window_left = -1;
};

enum class FmhaGrid { kPerTile, kPersistent, kDynamic };

struct FmhaPlan {
  int head_dim = 0, block_m = 0, block_n = 0;  // the kernel: rows and keys per work tile
  // A work tile's rows: pack_tokens tokens of pack_heads query heads of one KV head.
  int pack_tokens = 0, pack_heads = 0;
  int section_units = 0;  // the work order's sections (params.h)
  int64_t num_m_blocks = 0;  // dense: query tiles per (batch, head group); varlen: 0
  int64_t work_tiles = 0;    // before the split
  int num_splits = 1;
  FmhaGrid grid = FmhaGrid::kPerTile;
  int64_t ctas = 0;
};

Route<FmhaPlan> route_fmha(const FmhaProblem& problem, const DeviceFacts& device,
                           const Overrides& overrides);

// "fmha d=128 n=176 pack=128x1 sections=1 splits=1 grid=persistent:132", for the _plan ops.
std::string describe(const FmhaPlan& plan);

// Queues the kernel (and the split-KV combine) on the current stream. CUDA builds only.
void run_fmha(const FmhaProblem& problem, const FmhaPlan& plan, at::Tensor& out, at::Tensor& lse);

}  // namespace dsv4
