// Host side of the sm90 chunk kernels, shared by their launchers (CUDA builds only).
#pragma once

#include <ATen/ATen.h>

#include "common/sm90_host.h"
#include "gla/chunk.h"

namespace dsv4 {

// Queues the delta rule's inverse kernel (csrc/gla/chunk_sm90_inverse.cuh) on the current
// stream. t_u: (B, T, HV, 64) in q's dtype; plan: the varlen plan, or nullptr when dense.
void chunk_sm90_inverse(const ChunkCall& c, const VarlenSequencePlanBuffers* plan,
                        at::Tensor& t_u);

}  // namespace dsv4
