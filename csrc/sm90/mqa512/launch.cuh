// The head_dim-512 family's launch: tensor maps from the tensors' real strides, the kernel
// parameters from the plan, the varlen schedule, and the split-KV combine. Each instantiation
// group has its own translation unit (launch.cu, launch_paged.cu), so they compile in parallel.
#pragma once

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#include "sm90/mqa512/api.h"
#include "sm90/mqa512/kernel.cuh"
#include "sm90/mqa512/list_tiles.cuh"
#include "sm90/shared/host.h"
#include "sm90/shared/queue_kernel.h"
#include "sm90/shared/split_kv_combine.cuh"

namespace dsv4 {

template <typename Element, Mqa512Keys kKeys>
void mqa512_launch(const Mqa512Problem& pr, const Mqa512Plan& plan, at::Tensor& out, at::Tensor& lse) {
  using T = Mqa512Sm90Traits<Element>;
  static_assert(T::kBlockM == kMqa512Rows && T::kBlockN == kMqa512KeysPerTile, "plan.h's numbers");
  constexpr auto kernel = mqa512_sm90_kernel<Element, kKeys>;
  const Mqa512Shape& s = pr.shape;
  const char* op = pr.op;
  Mqa512Sm90Params p = mqa512_params(s, plan);
  p.out = out.data_ptr();
  p.lse = lse.data_ptr<float>();
  p.sinks = pr.sinks ? pr.sinks->data_ptr<float>() : nullptr;
  at::Tensor topk;  // kept alive until the launch
  if (s.topk_k > 0) {
    topk = pr.topk->contiguous();
    p.topk = topk.data_ptr<int>();
    p.compressed = pr.compressed.data_ptr();
    p.c_batch_stride = s.varlen ? 0 : pr.compressed.stride(0);
    p.c_row_stride = pr.compressed.stride(1);
  }
  at::Tensor paged_slots[2], paged_lengths[2];  // contiguous where needed, alive until the launch
  for (int i = 0; i < pr.num_paged; ++i) {
    const Mqa512Problem::PagedList& l = pr.paged[i];
    Mqa512PagedList& d = p.page_list[i];
    paged_slots[i] = l.slots.contiguous();
    d.base = static_cast<const uint8_t*>(l.cache.data_ptr());
    d.slots = paged_slots[i].data_ptr<int>();
    if (l.lengths) paged_lengths[i] = l.lengths->contiguous();
    d.lengths = l.lengths ? paged_lengths[i].data_ptr<int>() : nullptr;
    d.block_stride = l.cache.stride(0);
    d.len = static_cast<int>(l.slots.size(1));
    d.tiles = (d.len + kMqa512KeysPerTile - 1) / kMqa512KeysPerTile;
    d.page_shift = 0;
    while ((int64_t{1} << d.page_shift) < l.cache.size(1)) ++d.page_shift;
    d.capacity = static_cast<int>(l.cache.size(0) * l.cache.size(1));
  }
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  VarlenScheduleBuffers schedule;  // alive until the kernel is queued
  if (s.varlen) {
    schedule = build_varlen_schedule(
        *pr.cu_seqlens_q, *pr.cu_seqlens_k, s.seqlen_q, s.seqlen_k, plan.tile_tokens,
        kMqa512KeysPerTile, s.causal, s.window_left,
        s.compress_ratio > 0 ? &*pr.cu_seqlens_c : nullptr, s.compress_ratio > 0 ? s.seqlen_c : 0);
    p.varlen_tiles = schedule.tiles;
    p.varlen_sequences = schedule.sequences;
    p.varlen_compressed = schedule.rows_c;
  }
  at::Tensor split_workspace;  // split-KV partials, alive until the combine is queued
  if (p.num_splits > 1 && !plan.cluster_merge) {
    const int64_t rows = int64_t(p.batch) * p.seqlen_q * p.heads_q;
    split_workspace = split_kv_workspace(p.num_splits, rows, T::kHeadDim, pr.q);
    p.o_partial = split_workspace.data_ptr<float>();
    p.lse_partial = p.o_partial + p.num_splits * rows * T::kHeadDim;
  }
  const CUtensorMap tq = make_tensor_map_bshd(op, pr.q, "q", p.tile_tokens, p.tile_heads);
  // A paged call has no kv tensor: the q map stands in for the kv maps, never read.
  const CUtensorMap tkv = pr.num_paged > 0 ? tq : make_tensor_map_bshd(op, pr.kv, "kv", T::kBlockN);
  const CUtensorMap tc = s.compress_ratio > 0 && s.topk_k == 0
                             ? make_tensor_map_bshd(op, pr.compressed, "compressed_kv", T::kBlockN)
                             : tkv;  // not read without HCA rows
  at::Tensor list_tiles;  // CSA lists longer than a tile: the tiles each work tile walks
  if (s.topk_k > T::kBlockN && plan.tiles > 0) {
    list_tiles = at::empty({plan.tiles}, pr.q.options().dtype(at::kInt));
    p.list_tiles = list_tiles.data_ptr<int>();
    const auto ctas = static_cast<unsigned>((plan.tiles + kListTilesWarps - 1) / kListTilesWarps);
    mqa512_list_tiles_kernel<kListTilesWarps><<<ctas, 32 * kListTilesWarps, 0, stream>>>(
        p, list_tiles.data_ptr<int>(), T::kBlockN);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  if constexpr (kKeys == Mqa512Keys::kGathered) {
    if (plan.narrow_heads > 0) {
      using N = Mqa512NarrowTraits<Element>;
      static_assert(N::kBlockM == kMqa512NarrowHeads && N::kBlockN == kMqa512KeysPerTile,
                    "plan.h's numbers");
      constexpr auto narrow = mqa512_narrow_sm90_kernel<Element>;
      allow_dynamic_smem<narrow>(pr.q.get_device(), N::kSmemBytes);
      narrow<<<static_cast<unsigned>(plan.grid), N::kThreads, N::kSmemBytes, stream>>>(tq, tkv, tc,
                                                                                          p);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      return;  // no split-KV
    }
  }
  allow_dynamic_smem<kernel>(pr.q.get_device(), T::kSmemBytes);
  // Queued by programmatic dependent launch behind whatever kernel came before (every thread
  // waits before it touches global memory); the splits of a call that merge in clusters run as
  // one cluster each, and no combine follows.
  QueueOptions queue{true};
  if (plan.cluster_merge) queue.cluster = static_cast<unsigned>(plan.num_splits);
  C10_CUDA_CHECK(queue_kernel(kernel, dim3(static_cast<unsigned>(plan.grid)), dim3(T::kThreads),
                              T::kSmemBytes, stream, queue, tq, tkv, tc, p));
  if (p.num_splits > 1 && !plan.cluster_merge) {
    C10_CUDA_CHECK((launch_split_kv_combine<Element, T::kHeadDim>(
        p, out.data_ptr(), lse.data_ptr<float>(), stream, p.lse_with_sink != 0)));
  }
}

// The paged instantiations (launch_paged.cu).
void run_mqa512_paged(const Mqa512Problem& problem, const Mqa512Plan& plan, at::Tensor& out,
                      at::Tensor& lse);

// Runs `run(Element{})` with the call's element type.
template <typename Run>
void mqa512_with_element(const Mqa512Problem& problem, Run&& run) {
  if (problem.q.scalar_type() == at::kBFloat16) {
    run(__nv_bfloat16{});
  } else {
    run(__half{});
  }
}

}  // namespace dsv4
