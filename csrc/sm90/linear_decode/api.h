// The gated delta rule's decode step (kernel.cuh), as the op unit calls it: the route (the
// kernel, or why not) and the launch.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>

#include "sm90/shared/plan.h"

namespace dsv4 {

// A validated call (csrc/ops/gated_delta_decode.cpp): q, k (B, T, H, K), v (B, T, HV, V), g and
// beta (B, T, HV) fp32, state (N, HV, K, V) fp32 or bf16, state_indices (B,) or none.
struct GatedDeltaDecodeProblem {
  at::Tensor q, k, v, g, beta, state;
  std::optional<at::Tensor> state_indices;
  double scale = 0.0;
  bool qk_l2norm = false;
};

struct GatedDeltaDecodePlan {
  int64_t ctas = 0;  // one per (sequence, v-head)
};

Route<GatedDeltaDecodePlan> route_gated_delta_decode(const GatedDeltaDecodeProblem& problem,
                                                     const DeviceFacts& device);
std::string describe(const GatedDeltaDecodePlan& plan);

// Queues the kernel on the current stream; o (B, T, HV, V) contiguous, v's dtype.
void run_gated_delta_decode(const GatedDeltaDecodeProblem& problem,
                            const GatedDeltaDecodePlan& plan, at::Tensor& o);

}  // namespace dsv4
