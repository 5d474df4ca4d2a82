// Launch of the delta rule's inverse kernel: one CTA per (chunk, v-head), every chunk at once.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#include <limits>

#include "gla/chunk_sm90.h"
#include "gla/chunk_sm90_inverse.cuh"

namespace dsv4 {
namespace {

template <typename Element>
at::Tensor launch(const ChunkCall& c, const VarlenSequencePlanBuffers* plan) {
  using Tr = ChunkInverseTraits<Element>;
  auto kernel = chunk_sm90_inverse_kernel<Element>;
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(Tr::kSmemBytes)));
  const CUtensorMap tk = make_tensor_map_bshd("chunk_gated_delta_rule", c.k, "k", Tr::kChunk);
  const at::Tensor beta = c.beta->contiguous();

  ChunkSm90InverseParams p;
  p.beta = beta.data_ptr<float>();
  p.sequences = plan != nullptr ? plan->sequences : nullptr;
  p.chunk_start = plan != nullptr ? plan->chunk_start : nullptr;
  p.num_seqs = static_cast<int>(c.num_seqs);
  p.seqlen = static_cast<int>(c.seqlen);
  p.chunks_per_seq = static_cast<int>((c.seqlen + Tr::kChunk - 1) / Tr::kChunk);
  p.heads_v = static_cast<int>(c.heads_v);
  p.group = static_cast<int>(c.heads_v / c.heads_qk);
  p.qk_l2norm = c.qk_l2norm;

  // Chunk slots: exact when dense; for varlen an upper bound, sum ceil(len / 64), and the
  // slots past the plan's total return at once.
  const int64_t slots = plan != nullptr
                            ? varlen_tile_capacity(c.seqlen, c.num_seqs, Tr::kChunk)
                            : c.batch * p.chunks_per_seq;
  const int64_t blocks = slots * c.heads_v;
  TORCH_CHECK(blocks <= std::numeric_limits<int>::max(),
              "chunk_gated_delta_rule: too many (chunk, v-head) pairs for one launch (", blocks,
              ")");
  at::Tensor t_u = at::empty({slots, c.heads_v, PackedTu::kElems}, c.q.options());
  if (blocks == 0) return t_u;
  p.t_u = t_u.data_ptr();
  kernel<<<static_cast<unsigned>(blocks), Tr::kThreads, Tr::kSmemBytes,
           at::cuda::getCurrentCUDAStream()>>>(tk, p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return t_u;
}

}  // namespace

at::Tensor chunk_sm90_inverse(const ChunkCall& c, const VarlenSequencePlanBuffers* plan) {
  if (c.q.scalar_type() == at::kBFloat16) return launch<__nv_bfloat16>(c, plan);
  return launch<__half>(c, plan);
}

}  // namespace dsv4
