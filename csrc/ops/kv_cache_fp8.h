// The paged FP8 KV cache ops (the record: sm90/kv_cache/format.h, README.md): kv_cache_insert_fp8
// quantizes rows into their slots in place, kv_cache_gather_fp8 reads slots back as rows. The
// validated calls, their checks, and the ops with their _path and _plan twins.
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "sm90/kv_cache/api.h"

namespace dsv4 {

using KvCacheCall = KvCacheProblem;

// cache (the argument `name` of op): a (num_blocks, P, 1, 584) uint8 view of whole blocks of P
// records, stride(0) bytes apart (format.h).
void check_kv_cache(const char* op, const char* name, const at::Tensor& cache);

// The ops' arguments, in schema order (torch_bindings.cpp).
KvCacheCall check_kv_cache_insert_inputs(const at::Tensor& kv, const at::Tensor& cache,
                                         const at::Tensor& slots);
KvCacheCall check_kv_cache_gather_inputs(const at::Tensor& cache, const at::Tensor& slots,
                                         at::ScalarType dtype);

void kv_cache_insert_fp8(const KvCacheCall& call);
std::string kv_cache_insert_fp8_path(const KvCacheCall& call);  // "sm90" or "reference"
std::string kv_cache_insert_fp8_plan(const KvCacheCall& call);
at::Tensor kv_cache_gather_fp8(const KvCacheCall& call);
std::string kv_cache_gather_fp8_path(const KvCacheCall& call);
std::string kv_cache_gather_fp8_plan(const KvCacheCall& call);

}  // namespace dsv4
