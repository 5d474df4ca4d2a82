// The fused merge_attn_states kernel's launch (kernel.cuh): the row geometry of both layouts.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#include "sm90/merge/api.h"
#include "sm90/merge/kernel.cuh"

namespace dsv4 {
namespace {

// Both layouts as (B, T, H, Dv) rows and (B, H, T) lse: varlen is one batch.
at::Tensor as_rows(const at::Tensor& out) { return out.dim() == 4 ? out : out.unsqueeze(0); }
at::Tensor as_lse(const at::Tensor& lse) { return lse.dim() == 3 ? lse : lse.unsqueeze(0); }

// Element strides of the (b, t, h) dims: out (B, T, H, Dv), lse (B, H, T).
void out_strides(const at::Tensor& out, long long (&s)[3]) {
  for (int i = 0; i < 3; ++i) s[i] = out.stride(i);
}
void lse_strides(const at::Tensor& lse, long long (&s)[3]) {
  s[0] = lse.stride(0);
  s[1] = lse.stride(2);
  s[2] = lse.stride(1);
}

template <typename Element>
void launch(const MergeStatesParams& p, const MergePlan& plan, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(Element);
  const unsigned blocks = static_cast<unsigned>(plan.blocks);
  if (plan.vec == 1) {
    merge_states_kernel<Element, 1, 1><<<blocks, kMergeStatesThreads, 0, stream>>>(p);
  } else if (plan.per_thread == 4) {
    merge_states_kernel<Element, kVec, 4><<<blocks, kMergeStatesThreads, 0, stream>>>(p);
  } else {
    merge_states_kernel<Element, kVec, 1><<<blocks, kMergeStatesThreads, 0, stream>>>(p);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

void run_merge(const MergeProblem& pr, const MergePlan& plan, at::Tensor& out, at::Tensor& lse) {
  static_assert(kMergeStatesThreads == 256, "plan.cpp's threads per block");
  const at::Tensor a = as_rows(pr.out_a), b = as_rows(pr.out_b);
  const at::Tensor la = as_lse(pr.lse_a), lb = as_lse(pr.lse_b);
  MergeStatesParams p;
  p.out_a = a.data_ptr();
  p.out_b = b.data_ptr();
  p.lse_a = la.data_ptr<float>();
  p.lse_b = lb.data_ptr<float>();
  p.out = out.data_ptr();
  p.lse = lse.data_ptr<float>();
  p.batch = static_cast<int>(a.size(0));
  p.tokens = static_cast<int>(a.size(1));
  p.heads = static_cast<int>(a.size(2));
  p.head_dim = static_cast<int>(a.size(3));
  out_strides(a, p.a_stride);
  out_strides(b, p.b_stride);
  lse_strides(la, p.la_stride);
  lse_strides(lb, p.lb_stride);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  switch (a.scalar_type()) {
    case at::kBFloat16: return launch<__nv_bfloat16>(p, plan, stream);
    case at::kHalf: return launch<__half>(p, plan, stream);
    case at::kFloat: return launch<float>(p, plan, stream);
    default: TORCH_CHECK(false, "merge_attn_states: no kernel for ", a.scalar_type());
  }
}

}  // namespace dsv4
