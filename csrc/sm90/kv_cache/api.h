// The paged FP8 KV cache kernels (kernel.cuh), as the op unit calls them: the route (the
// kernels, or why not) and the launches. The record is format.h's.
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "sm90/shared/plan.h"

namespace dsv4 {

// Validated calls (csrc/ops/kv_cache_fp8.cpp): kv (N, 512) bf16/fp16; cache a
// (num_blocks, P, 1, 584) uint8 view whose blocks are stride(0) bytes apart; slots (N,) int32 or
// int64 global slots; out_dtype the gathered rows' dtype.
struct KvCacheProblem {
  at::Tensor kv;  // insert only
  at::Tensor cache, slots;
  at::ScalarType out_dtype = at::kBFloat16;  // gather only
};

struct KvCachePlan {
  int64_t blocks = 0;  // CTAs of kKvCacheRowsPerBlock rows
};

Route<KvCachePlan> route_kv_cache_insert(const KvCacheProblem& problem, const DeviceFacts& device);
Route<KvCachePlan> route_kv_cache_gather(const KvCacheProblem& problem, const DeviceFacts& device);
std::string describe(const KvCachePlan& plan);

// Queue the kernels on the current stream (out: (N, 512) contiguous, out_dtype).
void run_kv_cache_insert(const KvCacheProblem& problem, const KvCachePlan& plan);
void run_kv_cache_gather(const KvCacheProblem& problem, const KvCachePlan& plan, at::Tensor& out);

}  // namespace dsv4
