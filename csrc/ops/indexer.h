// dsv4_indexer_topk: DeepSeek-V4's lightning indexer, the top-k closed compressed rows of each
// query by Σ_h w_h ReLU(scale q_h·k). The validated call, its checks, and the op with its
// _path and _plan twins.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>

#include "sm90/indexer/api.h"

namespace dsv4 {

using IndexerCall = IndexerProblem;

// The op's arguments, in schema order (torch_bindings.cpp's kIndexerArgs).
IndexerCall check_indexer_inputs(const at::Tensor& q, const at::Tensor& k,
                                 const at::Tensor& weights, const at::Tensor& positions,
                                 int64_t topk, int64_t compress_ratio,
                                 std::optional<double> scale,
                                 const std::optional<at::Tensor>& k_scale,
                                 const std::optional<at::Tensor>& cu_seqlens_q,
                                 const std::optional<at::Tensor>& cu_seqlens_k,
                                 int64_t max_seqlen_q, int64_t max_seqlen_k);

at::Tensor dsv4_indexer_topk(const IndexerCall& call);
std::string dsv4_indexer_topk_path(const IndexerCall& call);
std::string dsv4_indexer_topk_plan(const IndexerCall& call);

}  // namespace dsv4
