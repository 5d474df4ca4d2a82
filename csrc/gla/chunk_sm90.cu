// Host side of the sm90 chunked linear-attention kernel: which calls it covers, and the launch.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#include <limits>

#include "gla/chunk_sm90.h"
#include "gla/chunk_sm90_kernel.cuh"

namespace dsv4 {
namespace {

template <typename Element, bool kDelta>
void launch(const ChunkCall& c, at::Tensor& o, at::Tensor& final_state) {
  using Tr = ChunkSm90Traits<Element>;
  const char* op = kDelta ? "chunk_gated_delta_rule" : "chunk_simple_gla";
  auto kernel = chunk_sm90_kernel<Element, kDelta>;
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(Tr::kSmemBytes)));
  const CUtensorMap tq = make_tensor_map_bshd(op, c.q, "q", Tr::kChunk);
  const CUtensorMap tk = make_tensor_map_bshd(op, c.k, "k", Tr::kChunk);
  const CUtensorMap tv = make_tensor_map_bshd(op, c.v, "v", Tr::kChunk);
  // Varlen: sequences clamped into the tensors and launched the longest first, planned on the
  // device (cu_seqlens is trusted and never read on the host).
  VarlenSequencePlanBuffers plan;
  if (c.cu_seqlens) plan = build_varlen_sequence_plan(*c.cu_seqlens, c.seqlen, Tr::kChunk);
  // Delta rule: every chunk's ungated inverse first, by a fully parallel kernel.
  at::Tensor t_u;
  if (kDelta) {
    t_u = at::empty({c.batch, c.seqlen, c.heads_v, Tr::kChunk}, c.q.options());
    chunk_sm90_inverse(c, c.cu_seqlens ? &plan : nullptr, t_u);
  }
  const CUtensorMap tt = kDelta ? make_tensor_map_bshd(op, t_u, "T_u", Tr::kChunk) : tv;
  // Small per-token and per-sequence inputs are read with plain loads: make them dense.
  const at::Tensor g = c.g.contiguous();
  const at::Tensor beta = kDelta ? c.beta->contiguous() : at::Tensor();
  const at::Tensor s0 = c.initial_state ? c.initial_state->contiguous() : at::Tensor();

  ChunkSm90Params p;
  p.o = o.data_ptr();
  p.g = g.data_ptr<float>();
  p.beta = kDelta ? beta.data_ptr<float>() : nullptr;
  p.initial_state = s0.defined() ? s0.data_ptr<float>() : nullptr;
  p.final_state = final_state.defined() ? final_state.data_ptr<float>() : nullptr;
  p.sequences = plan.sequences;
  p.order = plan.order;
  p.seqlen = static_cast<int>(c.seqlen);
  p.heads_v = static_cast<int>(c.heads_v);
  p.group = static_cast<int>(c.heads_v / c.heads_qk);
  p.scale = static_cast<float>(c.scale);
  p.qk_l2norm = c.qk_l2norm;

  const dim3 grid(static_cast<unsigned>(c.num_seqs * c.heads_v * 2));  // (sequence, v-head, half)
  kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, at::cuda::getCurrentCUDAStream()>>>(tq, tk, tv, tt, p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

bool chunk_sm90_covers(const ChunkCall& c) {
  if (!c.q.is_cuda() || sm90_disabled_by_env()) return false;
  if (!device_info(c.q.get_device()).is_sm90) return false;
  constexpr int64_t kDim = ChunkSm90Traits<__nv_bfloat16>::kDim;  // K = V the kernel is built for
  if (c.dim_k != kDim || c.dim_v != kDim) return false;
  if (c.seqlen < 1 || c.num_seqs < 1) return false;  // nothing for a tensor map to describe
  constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
  if (c.num_seqs * c.heads_v * 2 > kMaxInt || c.batch * c.seqlen > kMaxInt) return false;
  // The inverse kernel's grid: one CTA per (chunk, v-head), at most T / 64 + N chunks.
  if ((c.batch * c.seqlen / 64 + c.num_seqs) * c.heads_v > kMaxInt) return false;
  return tma_compatible(c.q) && tma_compatible(c.k) && tma_compatible(c.v);
}

void chunk_sm90(const ChunkCall& c, at::Tensor& o, at::Tensor& final_state) {
  const bool bf16 = c.q.scalar_type() == at::kBFloat16;
  if (c.rule == ChunkRule::kGatedDelta) {
    return bf16 ? launch<__nv_bfloat16, true>(c, o, final_state)
                : launch<__half, true>(c, o, final_state);
  }
  return bf16 ? launch<__nv_bfloat16, false>(c, o, final_state)
              : launch<__half, false>(c, o, final_state);
}

}  // namespace dsv4
