// Launch of the delta rule's inverse kernel: one CTA per chunk and v-head, or per chunk and two
// or four v-heads of one qk-head, every chunk at once.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#include <limits>

#include "sm90/chunk/launch.h"
#include "sm90/chunk/inverse.cuh"

namespace dsv4 {
namespace {

template <typename Element, bool kGrouped>
at::Tensor launch(const ChunkProblem& c, const VarlenSequencePlanBuffers* plan, int heads_per_cta,
                  const ChunkSegmentPlanParams* segment_plan, bool odd_chunks_only) {
  using Tr = ChunkInverseTraits<Element, kGrouped>;
  constexpr auto kernel = chunk_sm90_inverse_kernel<Element, kGrouped>;
  allow_dynamic_smem<kernel>(c.k.get_device(), Tr::kSmemBytes);
  const CUtensorMap tk = make_tensor_map_bshd("chunk_gated_delta_rule", c.k, "k", Tr::kChunk);
  const at::Tensor beta = c.beta->contiguous();

  ChunkSm90InverseParams p{};  // segment_plan stays zero without a plan
  p.beta = beta.data_ptr<float>();
  p.sequences = plan != nullptr ? plan->sequences : nullptr;
  p.chunk_start = plan != nullptr ? plan->chunk_start : nullptr;
  p.num_seqs = static_cast<int>(c.num_seqs);
  p.seqlen = static_cast<int>(c.seqlen);
  p.chunks_per_seq = static_cast<int>((c.seqlen + Tr::kChunk - 1) / Tr::kChunk);
  p.heads_v = static_cast<int>(c.heads_v);
  p.group = static_cast<int>(c.heads_v / c.heads_qk);
  p.heads_per_cta = heads_per_cta;
  p.qk_l2norm = c.qk_l2norm;
  p.odd_chunks_only = odd_chunks_only && plan == nullptr;
  if (segment_plan != nullptr) {  // a warp per segment
    p.segment_plan = *segment_plan;
    p.segment_plan.segments_per_cta = Tr::kThreads / 32;
    const int64_t per_head = (segment_plan->segments + Tr::kThreads / 32 - 1) / (Tr::kThreads / 32);
    p.plan_ctas = static_cast<int>(c.batch * c.heads_v * per_head);
  }

  // Chunk slots: exact when dense; for varlen an upper bound, sum ceil(len / 64), and the
  // slots past the plan's total return at once.
  const int64_t slots = plan != nullptr
                            ? varlen_tile_capacity(c.seqlen, c.num_seqs, Tr::kChunk)
                            : c.batch * p.chunks_per_seq;
  const int64_t blocks = slots * (c.heads_v / p.heads_per_cta) + p.plan_ctas;
  TORCH_CHECK(blocks <= std::numeric_limits<int>::max(),
              "chunk_gated_delta_rule: too many (chunk, v-head group) pairs for one launch (",
              blocks, ")");
  at::Tensor t_u = at::empty({slots, c.heads_v, PackedTu::kElems}, c.q.options());
  if (blocks == 0) return t_u;
  p.t_u = t_u.data_ptr();
  kernel<<<static_cast<unsigned>(blocks), Tr::kThreads, Tr::kSmemBytes,
           at::cuda::getCurrentCUDAStream()>>>(tk, p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return t_u;
}

}  // namespace

at::Tensor chunk_sm90_inverse(const ChunkProblem& c, const VarlenSequencePlanBuffers* plan,
                              const ChunkSegmentPlanParams* segment_plan, bool odd_chunks_only) {
  // Up to four v-heads of a qk-head per CTA: more would leave too few CTAs for short calls.
  const int64_t group = c.heads_v / c.heads_qk;
  const int heads_per_cta = group % 4 == 0 ? 4 : group % 2 == 0 ? 2 : 1;
  const bool bf16 = c.q.scalar_type() == at::kBFloat16;
  if (heads_per_cta > 1) {
    return bf16 ? launch<__nv_bfloat16, true>(c, plan, heads_per_cta, segment_plan, odd_chunks_only)
                : launch<__half, true>(c, plan, heads_per_cta, segment_plan, odd_chunks_only);
  }
  return bf16 ? launch<__nv_bfloat16, false>(c, plan, 1, segment_plan, odd_chunks_only)
              : launch<__half, false>(c, plan, 1, segment_plan, odd_chunks_only);
}

}  // namespace dsv4
