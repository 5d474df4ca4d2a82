// chunk_gated_delta_rule and chunk_simple_gla: the validated call, its checks, and the ops with
// their _path and _plan twins (registered in torch_bindings.cpp through OpEntry). The sm90 chunk
// family (csrc/sm90/chunk) runs what its route takes, chunk_reference.cpp the rest.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <tuple>

#include "sm90/chunk/api.h"

namespace dsv4 {

// The validated call is exactly what the sm90 chunk family takes (ChunkProblem, its api.h).
using ChunkCall = ChunkProblem;

constexpr int64_t kChunkSize = 64;

// Each op's arguments, in schema order (torch_bindings.cpp's kGatedDeltaArgs, kSimpleGlaArgs).
ChunkCall check_gated_delta_rule_inputs(const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v, const at::Tensor& g,
                                        const at::Tensor& beta, std::optional<double> scale,
                                        const std::optional<at::Tensor>& initial_state,
                                        bool output_final_state,
                                        const std::optional<at::Tensor>& cu_seqlens,
                                        bool use_qk_l2norm_in_kernel);
ChunkCall check_simple_gla_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& g, std::optional<double> scale,
                                  const std::optional<at::Tensor>& initial_state,
                                  bool output_final_state,
                                  const std::optional<at::Tensor>& cu_seqlens);

// Both ops: o (v's shape and dtype) and, when asked for, the final state (N, HV, K, V) fp32.
std::tuple<at::Tensor, std::optional<at::Tensor>> chunk_op(const ChunkCall& call);
std::string chunk_path(const ChunkCall& call);  // "sm90" or "reference"
std::string chunk_plan(const ChunkCall& call);

// Portable path: chunk-by-chunk batched matmuls in fp32. Fills o; returns the final state
// (N, HV, K, V) fp32, or an undefined tensor when not asked for.
at::Tensor chunk_reference(const ChunkCall& call, at::Tensor& o);

// flash-linear-attention's l2norm (use_qk_l2norm_in_kernel): x / sqrt(sum x^2 + 1e-6) over the
// last dim, computed in fp32 and rounded back to x's dtype. The decode step's reference uses
// it too.
at::Tensor l2norm_rows(const at::Tensor& x);

}  // namespace dsv4
