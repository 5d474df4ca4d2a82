// Launches of the segment split's plan and combine kernels (csrc/sm90/chunk/segments.cuh).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#include "sm90/chunk/launch.h"
#include "sm90/chunk/segments.cuh"

namespace dsv4 {

ChunkSegmentPlanParams chunk_sm90_segment_plan_params(const ChunkProblem& c, int64_t segments,
                                                      int64_t segment_len, bool warmups,
                                                      const at::Tensor& g, const at::Tensor& beta,
                                                      at::Tensor& warmup, at::Tensor& gate_sum) {
  using Tr = ChunkSegmentTraits;
  const bool delta = c.rule == ChunkRule::kGatedDelta;
  ChunkSegmentPlanParams p;
  p.k = delta ? c.k.data_ptr() : nullptr;
  p.k_stride_b = c.k.stride(0);
  p.k_stride_t = c.k.stride(1);
  p.k_stride_h = c.k.stride(2);
  p.g = g.data_ptr<float>();
  p.beta = delta ? beta.data_ptr<float>() : nullptr;
  p.warmup = warmup.data_ptr<int>();
  p.gate_sum = delta ? nullptr : gate_sum.data_ptr<double>();
  p.seqlen = static_cast<int>(c.seqlen);
  p.heads_v = static_cast<int>(c.heads_v);
  p.group = static_cast<int>(c.heads_v / c.heads_qk);
  p.segments = static_cast<int>(segments);
  p.segment_len = static_cast<int>(segment_len);
  p.segments_per_cta = static_cast<int>(segments);
  // A warm-up longer than a segment would cost more than the exact combine's passes.
  p.max_warmup_chunks = warmups ? static_cast<int>(segment_len / Tr::kChunk) : 0;
  p.qk_l2norm = c.qk_l2norm;
  return p;
}

void chunk_sm90_segment_plan(const ChunkProblem& c, const ChunkSegmentPlanParams& p) {
  using Tr = ChunkSegmentTraits;
  // The delta rule's plan runs in the inverse kernel's launch (chunk_sm90_inverse).
  TORCH_INTERNAL_ASSERT(c.rule == ChunkRule::kSimpleGla, "the plan kernel is simple GLA's");
  const unsigned grid = static_cast<unsigned>(c.batch * c.heads_v);
  chunk_segment_plan_kernel<__nv_bfloat16, false>
      <<<grid, Tr::kPlanThreads, 0, at::cuda::getCurrentCUDAStream()>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void chunk_sm90_segment_combine(const ChunkProblem& c, int64_t segments, at::Tensor& warmup,
                                const at::Tensor& gate_sum, const at::Tensor& local,
                                const at::Tensor& maps, at::Tensor& start) {
  using Tr = ChunkSegmentTraits;
  const bool delta = c.rule == ChunkRule::kGatedDelta;
  const at::Tensor s0 = c.initial_state ? c.initial_state->contiguous() : at::Tensor();
  ChunkSegmentCombineParams p;
  p.warmup = warmup.data_ptr<int>();
  p.gate_sum = delta ? nullptr : gate_sum.data_ptr<double>();
  p.local = local.data_ptr<float>();
  p.maps = delta ? maps.data_ptr<float>() : nullptr;
  p.initial_state = s0.defined() ? s0.data_ptr<float>() : nullptr;
  p.start = start.data_ptr<float>();
  p.heads_v = static_cast<int>(c.heads_v);
  p.segments = static_cast<int>(segments);
  const unsigned grid =
      static_cast<unsigned>(c.batch * c.heads_v * (Tr::kDim / Tr::kCombineCols));
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  if (delta) {
    allow_dynamic_smem<chunk_segment_combine_kernel<true>>(c.k.get_device(),
                                                           Tr::kCombineSmemBytes);
  }
  // Right behind the state-only pass: follows it programmatically.
  launch_kernel(delta ? chunk_segment_combine_kernel<true> : chunk_segment_combine_kernel<false>,
                dim3(grid), dim3(Tr::kCombineThreads), delta ? Tr::kCombineSmemBytes : 0, stream,
                true, p);
}

}  // namespace dsv4
