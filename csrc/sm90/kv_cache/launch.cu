// The paged FP8 KV cache kernels' launches (kernel.cuh).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#include "sm90/kv_cache/api.h"
#include "sm90/kv_cache/kernel.cuh"

namespace dsv4 {
namespace {

KvCacheLayout layout_of(const at::Tensor& cache) {
  return {static_cast<uint8_t*>(cache.data_ptr()), cache.size(0), static_cast<int>(cache.size(1)),
          cache.stride(0)};
}

template <typename Element, typename Slot>
void launch_insert(const KvCacheProblem& pr, const KvCachePlan& plan, cudaStream_t stream) {
  kv_cache_insert_fp8_kernel<Element, Slot>
      <<<static_cast<unsigned>(plan.blocks), kKvCacheRowsPerBlock * 32, 0, stream>>>(
          static_cast<const Element*>(pr.kv.data_ptr()), pr.kv.stride(0),
          static_cast<const Slot*>(pr.slots.data_ptr()), pr.slots.numel(), layout_of(pr.cache));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename Element, typename Slot>
void launch_gather(const KvCacheProblem& pr, const KvCachePlan& plan, at::Tensor& out,
                   cudaStream_t stream) {
  kv_cache_gather_fp8_kernel<Element, Slot>
      <<<static_cast<unsigned>(plan.blocks), kKvCacheRowsPerBlock * 32, 0, stream>>>(
          layout_of(pr.cache), static_cast<const Slot*>(pr.slots.data_ptr()), pr.slots.numel(),
          static_cast<Element*>(out.data_ptr()));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

void run_kv_cache_insert(const KvCacheProblem& pr, const KvCachePlan& plan) {
  static_assert(kKvCacheRowsPerBlock == 8, "api.cpp's rows per block");
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const bool bf16 = pr.kv.scalar_type() == at::kBFloat16, i64 = pr.slots.scalar_type() == at::kLong;
  if (bf16) {
    i64 ? launch_insert<__nv_bfloat16, int64_t>(pr, plan, stream)
        : launch_insert<__nv_bfloat16, int32_t>(pr, plan, stream);
  } else {
    i64 ? launch_insert<__half, int64_t>(pr, plan, stream) : launch_insert<__half, int32_t>(pr, plan, stream);
  }
}

void run_kv_cache_gather(const KvCacheProblem& pr, const KvCachePlan& plan, at::Tensor& out) {
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const bool bf16 = pr.out_dtype == at::kBFloat16, i64 = pr.slots.scalar_type() == at::kLong;
  if (bf16) {
    i64 ? launch_gather<__nv_bfloat16, int64_t>(pr, plan, out, stream)
        : launch_gather<__nv_bfloat16, int32_t>(pr, plan, out, stream);
  } else {
    i64 ? launch_gather<__half, int64_t>(pr, plan, out, stream)
        : launch_gather<__half, int32_t>(pr, plan, out, stream);
  }
}

}  // namespace dsv4
