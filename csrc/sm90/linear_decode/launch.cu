// The decode step's launch (kernel.cuh): one CTA of 128 threads per (sequence, v-head).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#include "sm90/linear_decode/api.h"
#include "sm90/linear_decode/kernel.cuh"
#include "sm90/shared/host.h"

namespace dsv4 {
namespace {

template <typename Element, typename State>
void launch(const GatedDeltaDecodeParams& p, int64_t ctas, int device, cudaStream_t stream) {
  constexpr auto kKernel = gated_delta_decode_kernel<Element, State>;
  constexpr int kSmem = decode_smem_bytes<State>();
  allow_dynamic_smem<kKernel>(device, kSmem);
  kKernel<<<static_cast<unsigned>(ctas), kDecodeDim, kSmem, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename Element>
void launch_state(const GatedDeltaDecodeParams& p, bool bf16_state, int64_t ctas, int device,
                  cudaStream_t stream) {
  bf16_state ? launch<Element, __nv_bfloat16>(p, ctas, device, stream)
             : launch<Element, float>(p, ctas, device, stream);
}

}  // namespace

void run_gated_delta_decode(const GatedDeltaDecodeProblem& pr, const GatedDeltaDecodePlan& plan,
                            at::Tensor& o) {
  GatedDeltaDecodeParams p{};
  p.q = pr.q.data_ptr();
  p.k = pr.k.data_ptr();
  p.v = pr.v.data_ptr();
  p.g = pr.g.data_ptr<float>();
  p.beta = pr.beta.data_ptr<float>();
  p.state = pr.state.data_ptr();
  p.state_indices = pr.state_indices ? pr.state_indices->data_ptr() : nullptr;
  p.indices_64 = pr.state_indices && pr.state_indices->scalar_type() == at::kLong;
  p.o = o.data_ptr();
  for (int d = 0; d < 3; ++d) {
    p.q_stride[d] = pr.q.stride(d);
    p.k_stride[d] = pr.k.stride(d);
    p.v_stride[d] = pr.v.stride(d);
  }
  p.batch = static_cast<int>(pr.q.size(0));
  p.tokens = static_cast<int>(pr.q.size(1));
  p.heads_qk = static_cast<int>(pr.q.size(2));
  p.heads_v = static_cast<int>(pr.v.size(2));
  p.num_states = pr.state.size(0);
  p.scale = static_cast<float>(pr.scale);
  p.qk_l2norm = pr.qk_l2norm;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int device = pr.q.get_device();
  const bool bf16_state = pr.state.scalar_type() == at::kBFloat16;
  switch (pr.q.scalar_type()) {
    case at::kBFloat16: launch_state<__nv_bfloat16>(p, bf16_state, plan.ctas, device, stream); break;
    case at::kHalf: launch_state<__half>(p, bf16_state, plan.ctas, device, stream); break;
    default: launch_state<float>(p, bf16_state, plan.ctas, device, stream); break;
  }
}

}  // namespace dsv4
