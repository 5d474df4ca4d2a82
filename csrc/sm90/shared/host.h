// Host helpers shared by the sm90 launchers: device facts, TMA eligibility and tensor-map
// encoding through the driver entry point (no libcuda link needed). CUDA builds only.
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <cuda.h>
#include <cuda_runtime.h>

#include <mutex>
#include <utility>

#include "sm90/shared/queue_kernel.h"
#include "sm90/shared/varlen_schedule.h"

namespace dsv4 {

struct DeviceInfo {
  bool is_sm90 = false;
  int num_sms = 0;
};

// Queried once per device.
const DeviceInfo& device_info(int device);

// queue_kernel (queue_kernel.h), its launch checked.
template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                   cudaStream_t stream, bool follows_previous, Args&&... args) {
  C10_CUDA_CHECK(queue_kernel(kernel, grid, block, smem, stream, follows_previous,
                              std::forward<Args>(args)...));
}

// Raises kKernel's dynamic shared-memory limit to `bytes` on `device` (the current device),
// once per kernel and device: the attribute is per function and device, and setting it on
// every call cost host time on every launch (decode steps are launch-bound).
template <auto kKernel>
void allow_dynamic_smem(int device, int bytes) {
  constexpr int kMaxDevices = 64;  // as device_info
  static std::once_flag flags[kMaxDevices];
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "dsv4: CUDA device index must be in [0, ",
              kMaxDevices, ") (got ", device, ")");
  std::call_once(flags[device], [bytes] {
    C10_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        bytes));
  });
}

// The split-KV partials (sm90/shared/split_kv.h) in one fp32 buffer on `like`'s device, one
// allocation per call: o_partial [splits][rows][head_dim], then lse_partial [splits][rows].
inline at::Tensor split_kv_workspace(int64_t splits, int64_t rows, int64_t head_dim,
                                     const at::Tensor& like) {
  return at::empty({splits * rows * (head_dim + 1)}, like.options().dtype(at::kFloat));
}

// Tensor map over a 4-D (B, S, H, D) tensor with its real strides, coordinates (d, s, h, b)
// innermost first; box (one 128-byte atom: 64 16-bit or 128 FP8 elements, box_rows, box_heads,
// 1) written with the 128-byte swizzle that wgmma reads, as box_heads x box_rows rows of 128
// bytes (rows innermost). `op` and `name`
// go into the error message if the driver refuses the encoding.
CUtensorMap make_tensor_map_bshd(const char* op, const at::Tensor& t, const char* name,
                                 uint32_t box_rows, uint32_t box_heads = 1);

// A varlen call's work schedule (csrc/sm90/shared/varlen_schedule.h), built by a one-CTA kernel
// queued on the current stream: no host sync. `storage` owns the buffers; keep it alive until
// the kernel that reads them is queued.
struct VarlenScheduleBuffers {
  at::Tensor storage;
  const VarlenSequence* sequences = nullptr;
  const VarlenTile* tiles = nullptr;
  const VarlenRows* rows_c = nullptr;  // with cu_seqlens_c
  int64_t capacity = 0;  // query tiles at most; tiles has capacity * head_sections slots
};
// cu_seqlens_c (optional, int32 like the others): a third set of rows per sequence.
// head_sections: each query tile is listed once per section of heads_per_section query heads
// (fmha; the default lists it once, for kernels whose tiles hold every head).
VarlenScheduleBuffers build_varlen_schedule(const at::Tensor& cu_seqlens_q,
                                            const at::Tensor& cu_seqlens_k, int64_t total_q,
                                            int64_t total_k, int tokens_per_tile,
                                            int keys_per_tile, bool causal, int64_t window_left,
                                            const at::Tensor* cu_seqlens_c = nullptr,
                                            int64_t total_c = 0, int head_sections = 1,
                                            int heads_per_section = 0);

// A varlen call's per-sequence plan (VarlenSequencePlanParams), built like the schedule above.
struct VarlenSequencePlanBuffers {
  at::Tensor storage;
  const VarlenRows* sequences = nullptr;
  const int* chunk_start = nullptr;  // [batch + 1]
  const int* order = nullptr;        // [batch]
};
VarlenSequencePlanBuffers build_varlen_sequence_plan(const at::Tensor& cu_seqlens, int64_t total,
                                                     int chunk);

}  // namespace dsv4
