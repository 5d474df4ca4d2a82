// Host side of the varlen work schedule: the buffers and the one-CTA build kernel's launch.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#include "sm90/shared/varlen_schedule.cuh"
#include "sm90/shared/host.h"

namespace dsv4 {

VarlenScheduleBuffers build_varlen_schedule(const at::Tensor& cu_seqlens_q,
                                            const at::Tensor& cu_seqlens_k, int64_t total_q,
                                            int64_t total_k, int tokens_per_tile,
                                            int keys_per_tile, bool causal, int64_t window_left,
                                            const at::Tensor* cu_seqlens_c, int64_t total_c,
                                            int head_sections, int heads_per_section) {
  static_assert(sizeof(VarlenSequence) == 16 && sizeof(VarlenTile) == 16 &&
                    sizeof(VarlenRows) == 8,
                "int32 layout");
  const int64_t batch = cu_seqlens_q.size(0) - 1;
  VarlenScheduleBuffers s;
  s.capacity = varlen_tile_capacity(total_q, batch, tokens_per_tile);
  // One int32 buffer: sequences (4 ints each, 16-byte aligned), tiles (4 ints), rows_c (2 ints,
  // with cu_seqlens_c), order, sorted_start.
  const int64_t tile_ints = 4 * s.capacity * head_sections;
  const int64_t c_ints = cu_seqlens_c != nullptr ? 2 * batch : 0;
  s.storage = at::empty({4 * batch + tile_ints + c_ints + 2 * batch},
                        cu_seqlens_q.options().dtype(at::kInt));
  int* base = s.storage.data_ptr<int>();
  VarlenScheduleParams p;
  p.cu_seqlens_q = cu_seqlens_q.data_ptr<int>();
  p.cu_seqlens_k = cu_seqlens_k.data_ptr<int>();
  p.batch = static_cast<int>(batch);
  p.total_q = static_cast<int>(total_q);
  p.total_k = static_cast<int>(total_k);
  p.tokens_per_tile = tokens_per_tile;
  p.keys_per_tile = keys_per_tile;
  p.causal = causal ? 1 : 0;
  p.window_left = static_cast<int>(window_left);
  p.capacity = static_cast<int>(s.capacity);
  p.head_sections = head_sections;
  p.heads_per_section = heads_per_section;
  p.sequences = reinterpret_cast<VarlenSequence*>(base);
  p.tiles = reinterpret_cast<VarlenTile*>(base + 4 * batch);
  p.cu_seqlens_c = cu_seqlens_c != nullptr ? cu_seqlens_c->data_ptr<int>() : nullptr;
  p.total_c = static_cast<int>(total_c);
  p.rows_c = cu_seqlens_c != nullptr
                 ? reinterpret_cast<VarlenRows*>(base + 4 * batch + tile_ints)
                 : nullptr;
  p.order = base + 4 * batch + tile_ints + c_ints;
  p.sorted_start = p.order + batch;
  s.sequences = p.sequences;
  s.tiles = p.tiles;
  s.rows_c = p.rows_c;
  varlen_schedule_kernel<<<1, kVarlenScheduleThreads, 0, at::cuda::getCurrentCUDAStream()>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return s;
}

VarlenSequencePlanBuffers build_varlen_sequence_plan(const at::Tensor& cu_seqlens, int64_t total,
                                                     int chunk) {
  const int64_t batch = cu_seqlens.size(0) - 1;
  VarlenSequencePlanBuffers s;
  // One int32 buffer: sequences (2 ints each, 8-byte aligned), chunk_start, order.
  s.storage = at::empty({2 * batch + (batch + 1) + batch}, cu_seqlens.options().dtype(at::kInt));
  int* base = s.storage.data_ptr<int>();
  VarlenSequencePlanParams p;
  p.cu_seqlens = cu_seqlens.data_ptr<int>();
  p.batch = static_cast<int>(batch);
  p.total = static_cast<int>(total);
  p.chunk = chunk;
  p.sequences = reinterpret_cast<VarlenRows*>(base);
  p.chunk_start = base + 2 * batch;
  p.order = base + 3 * batch + 1;
  s.sequences = p.sequences;
  s.chunk_start = p.chunk_start;
  s.order = p.order;
  varlen_sequence_plan_kernel<<<1, kVarlenScheduleThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
      p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return s;
}

}  // namespace dsv4
