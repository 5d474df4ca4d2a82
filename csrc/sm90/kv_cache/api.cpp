// The paged FP8 KV cache kernels' routes: 16-byte accesses need aligned rows and records.
#include "sm90/kv_cache/api.h"

#include <c10/util/Exception.h>

#include <cstdint>

namespace dsv4 {
namespace {

constexpr int64_t kRowsPerBlock = 8;  // kernel.cuh's kKvCacheRowsPerBlock (launch.cu asserts)

bool aligned16(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

KvCachePlan plan_rows(int64_t rows) { return {(rows + kRowsPerBlock - 1) / kRowsPerBlock}; }

}  // namespace

Route<KvCachePlan> route_kv_cache_insert(const KvCacheProblem& pr, const DeviceFacts& device) {
  using R = Route<KvCachePlan>;
  if (!device.sm90) return R::reference(device.why_not);
  if (pr.slots.numel() == 0) return R::reference("no rows");
  if (!aligned16(pr.cache)) return R::reference("a cache base not 16-byte aligned");
  if (pr.kv.stride(1) != 1 || pr.kv.stride(0) % 8 != 0 || !aligned16(pr.kv)) {
    return R::reference("kv rows not 16-byte aligned and contiguous");
  }
  return R::kernel(plan_rows(pr.slots.numel()));
}

Route<KvCachePlan> route_kv_cache_gather(const KvCacheProblem& pr, const DeviceFacts& device) {
  using R = Route<KvCachePlan>;
  if (!device.sm90) return R::reference(device.why_not);
  if (pr.slots.numel() == 0) return R::reference("no rows");
  if (pr.out_dtype != at::kBFloat16 && pr.out_dtype != at::kHalf) {
    return R::reference("rows gathered as a dtype other than bf16 or fp16");
  }
  if (!aligned16(pr.cache)) return R::reference("a cache base not 16-byte aligned");
  return R::kernel(plan_rows(pr.slots.numel()));
}

std::string describe(const KvCachePlan& plan) {
  return "kv_cache rows_per_block=" + std::to_string(kRowsPerBlock) +
         " blocks=" + std::to_string(plan.blocks);
}

#ifndef DSV4_WITH_CUDA
void run_kv_cache_insert(const KvCacheProblem&, const KvCachePlan&) {
  TORCH_CHECK(false, "dsv4: this build has no CUDA kernels");
}
void run_kv_cache_gather(const KvCacheProblem&, const KvCachePlan&, at::Tensor&) {
  TORCH_CHECK(false, "dsv4: this build has no CUDA kernels");
}
#endif

}  // namespace dsv4
