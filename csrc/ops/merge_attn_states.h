// merge_attn_states: exact attention over the union of two disjoint key sets from each set's
// fmha (out, lse). The validated call, its checks, and the op with its _path and _plan twins.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <tuple>

#include "sm90/merge/api.h"

namespace dsv4 {

// The validated call is exactly what the fused kernel takes (MergeProblem, sm90/merge/api.h).
using MergeCall = MergeProblem;

// The op's arguments, in schema order (torch_bindings.cpp's kMergeArgs).
MergeCall check_merge_inputs(const at::Tensor& out_a, const at::Tensor& lse_a,
                             const at::Tensor& out_b, const at::Tensor& lse_b);

std::tuple<at::Tensor, at::Tensor> merge_attn_states(const MergeCall& call);
std::string merge_attn_states_path(const MergeCall& call);  // "sm90" or "reference"
std::string merge_attn_states_plan(const MergeCall& call);

}  // namespace dsv4
