// gated_delta_rule_decode: one decode step (T <= a few tokens per sequence) of the gated delta
// rule over a state pool, updated in place. The validated call, its checks, and the op with its
// _path and _plan twins.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>

#include "sm90/linear_decode/api.h"

namespace dsv4 {

using GatedDeltaDecodeCall = GatedDeltaDecodeProblem;

// The op's arguments, in schema order (torch_bindings.cpp's kDecodeArgs).
GatedDeltaDecodeCall check_gated_delta_decode_inputs(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
    const at::Tensor& beta, const at::Tensor& state,
    const std::optional<at::Tensor>& state_indices, std::optional<double> scale,
    bool use_qk_l2norm_in_kernel);

at::Tensor gated_delta_rule_decode(const GatedDeltaDecodeCall& call);
std::string gated_delta_rule_decode_path(const GatedDeltaDecodeCall& call);
std::string gated_delta_rule_decode_plan(const GatedDeltaDecodeCall& call);

}  // namespace dsv4
