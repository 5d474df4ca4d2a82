// dsv4_attention_paged: one DeepSeek-V4 attention layer over the paged FP8 KV caches
// (sm90/kv_cache/format.h). Each query token attends to the rows its window slot list names and,
// optionally, those its compressed slot list names, in one softmax with the sink. The validated
// call, its checks, and the op with its _path and _plan twins.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>

namespace dsv4 {

// A validated call: q (T, Hq, 512) and out (the same, contiguous); each list is a cache view,
// int32 slots (T, L) and optional int32 lengths (T,). Entry j of token t's list is read iff
// j < lengths[t] and 0 <= slot < num_blocks * P; a repeated slot counts twice.
struct Dsv4PagedCall {
  at::Tensor q, out;
  at::Tensor window_cache, window_slots;
  std::optional<at::Tensor> window_lengths;
  std::optional<at::Tensor> compressed_cache, compressed_slots, compressed_lengths;
  std::optional<at::Tensor> sinks;
  int64_t tokens = 0, heads = 0;
  double scale = 1.0;
};

// The op's arguments, in schema order (torch_bindings.cpp's kDsv4PagedArgs).
Dsv4PagedCall check_dsv4_paged_inputs(const at::Tensor& q, const at::Tensor& window_cache,
                                      const at::Tensor& window_slots,
                                      const std::optional<at::Tensor>& window_lengths,
                                      const std::optional<at::Tensor>& compressed_cache,
                                      const std::optional<at::Tensor>& compressed_slots,
                                      const std::optional<at::Tensor>& compressed_lengths,
                                      const std::optional<at::Tensor>& sinks,
                                      std::optional<double> scale, const at::Tensor& out);

// Writes call.out and returns lse, fp32 (Hq, T), without the sink.
at::Tensor dsv4_attention_paged(const Dsv4PagedCall& call);
std::string dsv4_attention_paged_path(const Dsv4PagedCall& call);  // "reference" for now
std::string dsv4_attention_paged_plan(const Dsv4PagedCall& call);

}  // namespace dsv4
