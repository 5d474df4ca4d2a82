// The head_dim-512 shared-KV family, as the op units call it (fmha at D = 512 with k and v one
// tensor, and dsv4_attention): the problem, the route (plan, or why not) and the launch.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>

#include "sm90/mqa512/plan.h"
#include "sm90/shared/plan.h"

namespace dsv4 {

struct Mqa512Problem {
  const char* op = "";  // the calling op, for error messages
  Mqa512Shape shape;
  // As the tensor maps see them: q (B, Sq, Hq, 512), kv (B, Skv, Hkv, 512), read as K and V,
  // compressed (B, Sc, 1, 512) or undefined; varlen calls' packed tensors as one batch.
  at::Tensor q, kv, compressed;
  std::optional<at::Tensor> topk;   // CSA: int32 (B, Sq, K) | (total_q, K), rows relative to each
                                    // sequence's compressed rows
  std::optional<at::Tensor> sinks;  // fp32 (Hq,)
  // Varlen: int32 (N + 1,) each; cu_seqlens_c with compressed rows.
  std::optional<at::Tensor> cu_seqlens_q, cu_seqlens_k, cu_seqlens_c;
  // Paged (dsv4_attention_paged; shape.paged_tiles > 0): q (1, T, Hq, 512), kv and compressed
  // unused; the window list, then optionally the compressed list, over paged FP8 caches
  // ((num_blocks, P, 1, 584) uint8 views), int32 slots (T, L) and optional lengths (T,).
  struct PagedList {
    at::Tensor cache, slots;
    std::optional<at::Tensor> lengths;
  };
  PagedList paged[2];
  int num_paged = 0;
};

// Dense and varlen calls, and paged ones (num_paged > 0).
Route<Mqa512Plan> route_mqa512(const Mqa512Problem& problem, const DeviceFacts& device,
                               const Overrides& overrides);

// "mqa512 tile=1x64 splits=1 grid=persistent:132": a route's decisions, for the _plan ops.
std::string describe(const Mqa512Plan& plan);

// Queues the kernel (and the split-KV combine) on the current stream: out has q's shape and
// dtype, lse is fp32 (B, Hq, Sq) | (Hq, total_q). CUDA builds only.
void run_mqa512(const Mqa512Problem& problem, const Mqa512Plan& plan, at::Tensor& out,
                at::Tensor& lse);

}  // namespace dsv4
