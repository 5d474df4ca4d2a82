// The sm90 fmha family's launch, shared by its three translation units (launch_dense.cu,
// launch_varlen.cu, launch_d128_n128.cu, compiled in parallel): tensor maps from the tensors'
// real strides, the kernel parameters from the plan (plan.cpp), the varlen schedule and the
// split-KV combine.
#pragma once

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#include <algorithm>

#include "sm90/fmha/api.h"
#include "sm90/fmha/kernel.cuh"
#include "sm90/shared/host.h"
#include "sm90/shared/split_kv_combine.cuh"

namespace dsv4 {

template <typename Element, int kHeadDim, int kBlockN, bool kVarlen>
void launch(const FmhaProblem& c, const FmhaPlan& plan, at::Tensor& out, at::Tensor& lse) {
  using T = FmhaSm90Traits<Element, kHeadDim, kBlockN>;
  constexpr auto kernel = fmha_sm90_kernel<Element, kHeadDim, kBlockN, kVarlen>;
  TORCH_INTERNAL_ASSERT(plan.block_m == T::kBlockM && plan.block_n == T::kBlockN &&
                            (plan.grid != FmhaGrid::kDynamic || T::kPublishWorkTiles),
                        "fmha: the plan does not fit the kernel");
  allow_dynamic_smem<kernel>(c.q.get_device(), T::kSmemBytes);
  const CUtensorMap tq = make_tensor_map_bshd("fmha", c.q, "q", plan.pack_tokens, plan.pack_heads);
  const CUtensorMap tk = make_tensor_map_bshd("fmha", c.k, "k", T::kBlockN);
  const CUtensorMap tv = make_tensor_map_bshd("fmha", c.v, "v", T::kBlockN);

  FmhaSm90Params p;
  p.out = out.data_ptr();
  p.lse = lse.data_ptr<float>();
  p.sinks = c.sinks ? c.sinks->data_ptr<float>() : nullptr;
  p.batch = static_cast<int>(c.batch);
  p.seqlen_q = static_cast<int>(c.seqlen_q);
  p.seqlen_k = static_cast<int>(c.seqlen_k);
  p.heads_q = static_cast<int>(c.heads_q);
  p.group = static_cast<int>(c.heads_q / c.heads_kv);
  p.pack_tokens = plan.pack_tokens;
  p.pack_heads = plan.pack_heads;
  p.num_m_blocks = static_cast<int>(plan.num_m_blocks);
  p.scale_log2 = static_cast<float>(c.scale * 1.4426950408889634);
  p.causal = c.causal ? 1 : 0;
  p.window_left = static_cast<int>(c.window_left);
  p.section_units = plan.section_units;
  p.tile_counter = nullptr;
  p.varlen_tiles = nullptr;
  p.varlen_sequences = nullptr;
  p.num_splits = plan.num_splits;
  p.o_partial = p.lse_partial = nullptr;
  at::Tensor split_workspace;      // split-KV partials, alive until the combine is queued
  VarlenScheduleBuffers schedule;  // alive until the kernel is queued
  if constexpr (kVarlen) {
    schedule = build_varlen_schedule(*c.cu_seqlens_q, *c.cu_seqlens_k, c.q.size(1), c.k.size(1),
                                     T::kBlockM, T::kBlockN, c.causal, c.window_left, nullptr, 0,
                                     p.heads_q / p.section_units, p.section_units);
    p.batch = 1;
    p.seqlen_q = static_cast<int>(c.q.size(1));
    p.seqlen_k = static_cast<int>(c.k.size(1));
    p.varlen_tiles = schedule.tiles;
    p.varlen_sequences = schedule.sequences;
  } else if (p.num_splits > 1) {
    const int64_t rows = c.batch * c.seqlen_q * c.heads_q;
    split_workspace = split_kv_workspace(p.num_splits, rows, kHeadDim, c.q);
    p.o_partial = split_workspace.data_ptr<float>();
    p.lse_partial = p.o_partial + p.num_splits * rows * kHeadDim;
  }
  const int64_t num_work = plan.work_tiles * plan.num_splits;
  at::Tensor tile_counter;  // alive until the kernel is queued
  if (plan.grid == FmhaGrid::kDynamic && num_work > plan.ctas) {
    tile_counter = at::zeros({1}, c.q.options().dtype(at::kInt));
    p.tile_counter = tile_counter.data_ptr<int>();
  }
  p.num_work = static_cast<int>(num_work);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  kernel<<<dim3(static_cast<unsigned>(plan.ctas)), T::kThreads, T::kSmemBytes, stream>>>(tq, tk, tv, p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (p.num_splits > 1) {
    C10_CUDA_CHECK((launch_split_kv_combine<Element, kHeadDim>(p, out.data_ptr(),
                                                               lse.data_ptr<float>(), stream)));
  }
}

// The instantiations of each translation unit.
void run_fmha_dense(const FmhaProblem& c, const FmhaPlan& plan, at::Tensor& out, at::Tensor& lse);
void run_fmha_varlen(const FmhaProblem& c, const FmhaPlan& plan, at::Tensor& out, at::Tensor& lse);
void run_fmha_d128_n128(const FmhaProblem& c, const FmhaPlan& plan, at::Tensor& out,
                        at::Tensor& lse);

// Every head_dim and element type of one kind of call (dense or varlen) but head_dim 128 with
// 128 keys per tile.
template <bool kVarlen>
void dispatch(const FmhaProblem& c, const FmhaPlan& plan, at::Tensor& out, at::Tensor& lse) {
  const bool bf16 = c.q.scalar_type() == at::kBFloat16;
  switch (plan.head_dim) {
    case 64:
      return bf16 ? launch<__nv_bfloat16, 64, 128, kVarlen>(c, plan, out, lse)
                  : launch<__half, 64, 128, kVarlen>(c, plan, out, lse);
    case 128:
      if constexpr (!kVarlen) {
        if (plan.block_n == 176) {
          return bf16 ? launch<__nv_bfloat16, 128, 176, false>(c, plan, out, lse)
                      : launch<__half, 128, 176, false>(c, plan, out, lse);
        }
      }
      break;
    case 256:
      return bf16 ? launch<__nv_bfloat16, 256, 80, kVarlen>(c, plan, out, lse)
                  : launch<__half, 256, 80, kVarlen>(c, plan, out, lse);
  }
  TORCH_CHECK(false, "fmha: no sm90 kernel for head_dim ", plan.head_dim, " with ", plan.block_n,
              " keys per tile");
}

}  // namespace dsv4
