// Host side of the fused merge_attn_states kernel (csrc/sm90/merge/kernel.cuh): which calls
// it covers, the row geometry of both layouts, and the launch.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#include <algorithm>
#include <limits>

#include "sm90/merge/kernel.cuh"
#include "sm90/shared/host.h"
#include "ops/fmha.h"

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

// 16-byte chunks need every row start of both inputs on a 16-byte boundary.
bool rows_aligned(const at::Tensor& t, int64_t vec) {
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) return false;
  for (int i = 0; i < 3; ++i) {
    if (t.size(i) > 1 && t.stride(i) % vec != 0) return false;
  }
  return t.size(3) % vec == 0;
}

template <typename Element, int kVec, int kPerThread>
void launch_kernel(const MergeStatesParams& p, int64_t threads, cudaStream_t stream,
                   int num_sms) {
  const unsigned blocks = static_cast<unsigned>(std::clamp<int64_t>(
      (threads + kMergeStatesThreads - 1) / kMergeStatesThreads, 1, int64_t(num_sms) * 16));
  merge_states_kernel<Element, kVec, kPerThread><<<blocks, kMergeStatesThreads, 0, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// 16-byte chunks when both inputs allow them, four per thread when the row splits evenly.
template <typename Element>
void launch(const MergeStatesParams& p, bool vectors, int64_t elements, cudaStream_t stream,
            int num_sms) {
  constexpr int kVec = 16 / sizeof(Element), kPerThread = 4;
  if (!vectors) return launch_kernel<Element, 1, 1>(p, elements, stream, num_sms);
  if (p.head_dim % (kVec * kPerThread) == 0) {
    return launch_kernel<Element, kVec, kPerThread>(p, elements / (kVec * kPerThread), stream,
                                                    num_sms);
  }
  launch_kernel<Element, kVec, 1>(p, elements / kVec, stream, num_sms);
}

}  // namespace

bool merge_attn_states_sm90_covers(const at::Tensor& out_a, const at::Tensor& out_b) {
  if (!out_a.is_cuda() || sm90_disabled_by_env()) return false;
  if (!device_info(out_a.get_device()).is_sm90) return false;
  if (out_a.numel() == 0) return false;  // nothing to launch; the ATen path returns empties
  // Element indices of one (row, column) are unsigned 32-bit in the kernel.
  if (out_a.numel() > std::numeric_limits<int>::max()) return false;
  for (const at::Tensor* t : {&out_a, &out_b}) {
    if (t->size(-1) > 1 && t->stride(-1) != 1) return false;
  }
  return true;
}

void merge_attn_states_sm90(const at::Tensor& out_a, const at::Tensor& lse_a,
                            const at::Tensor& out_b, const at::Tensor& lse_b, at::Tensor& out,
                            at::Tensor& lse) {
  const at::Tensor a = as_rows(out_a), b = as_rows(out_b);
  const at::Tensor la = as_lse(lse_a), lb = as_lse(lse_b);
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
  const int64_t vec = 16 / a.element_size();
  const bool vectors = rows_aligned(a, vec) && rows_aligned(b, vec);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int num_sms = device_info(out_a.get_device()).num_sms;
  switch (a.scalar_type()) {
    case at::kBFloat16: return launch<__nv_bfloat16>(p, vectors, a.numel(), stream, num_sms);
    case at::kHalf: return launch<__half>(p, vectors, a.numel(), stream, num_sms);
    case at::kFloat: return launch<float>(p, vectors, a.numel(), stream, num_sms);
    default: TORCH_CHECK(false, "merge_attn_states: no kernel for ", a.scalar_type());
  }
}

}  // namespace dsv4
