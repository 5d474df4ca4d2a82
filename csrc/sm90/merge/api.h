// The fused merge_attn_states kernel (kernel.cuh), as the op unit calls it: the route (the
// access width, or why not) and the launch.
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "sm90/shared/plan.h"

namespace dsv4 {

// Validated inputs in fmha's layouts: out (B, Sq, H, Dv) | (total_q, H, Dv) with lse
// (B, H, Sq) | (H, total_q) fp32; out_a and out_b bf16, fp16 or fp32 alike.
struct MergeProblem {
  at::Tensor out_a, lse_a, out_b, lse_b;
};

struct MergePlan {
  int vec = 1;         // elements per access: 16 bytes where every row start allows, else 1
  int per_thread = 1;  // accesses per thread: 4 when the row splits evenly
  int64_t blocks = 0;
};

Route<MergePlan> route_merge(const MergeProblem& problem, const DeviceFacts& device,
                             const Overrides& overrides);
std::string describe(const MergePlan& plan);

// Queues the kernel on the current stream: out and lse contiguous, out_a's and lse_a's shapes.
void run_merge(const MergeProblem& problem, const MergePlan& plan, at::Tensor& out,
               at::Tensor& lse);

}  // namespace dsv4
