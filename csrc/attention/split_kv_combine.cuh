// The split-KV combine kernel: one warp per output row merges the splits' partial rows by
// their lse (csrc/attention/split_kv.h says what they hold). Memory-bound; fp32 throughout.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "attention/split_kv.h"
#include "ptx/math.cuh"

namespace dsv4 {

constexpr int kSplitKvCombineWarps = 8;  // rows per 256-thread block

template <typename Element, int kHeadDim>
__global__ void __launch_bounds__(32 * kSplitKvCombineWarps)
    split_kv_combine_kernel(const SplitKvCombineParams p) {
  static_assert(kHeadDim % 128 == 0, "a lane owns whole float4 groups");
  constexpr int kVec = kHeadDim / 128;  // float4s per lane
  const int row = blockIdx.x * kSplitKvCombineWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= p.rows) return;
  const int head = row % p.heads, token = (row / p.heads) % p.seqlen_q;
  const int batch = row / p.heads / p.seqlen_q;
  const float neg_inf = __int_as_float(0xff800000);

  float m = p.sinks != nullptr ? p.sinks[head] : neg_inf;
  for (int s = 0; s < p.splits; ++s) m = fmaxf(m, p.lse_partial[static_cast<size_t>(s) * p.rows + row]);
  float4 acc[kVec];
#pragma unroll
  for (int v = 0; v < kVec; ++v) acc[v] = make_float4(0.f, 0.f, 0.f, 0.f);
  float z = 0.f, lse = neg_inf;
  if (m != neg_inf) {  // else nothing visible and no sink: out 0, lse -inf
    z = p.sinks != nullptr ? expf(p.sinks[head] - m) : 0.f;
    for (int s = 0; s < p.splits; ++s) {
      const float w = expf(p.lse_partial[static_cast<size_t>(s) * p.rows + row] - m);
      if (w == 0.f) continue;  // a split with no visible key (lse -inf)
      z += w;
      const float4* src = reinterpret_cast<const float4*>(
          p.o_partial + (static_cast<size_t>(s) * p.rows + row) * kHeadDim);
#pragma unroll
      for (int v = 0; v < kVec; ++v) {
        const float4 x = src[lane + 32 * v];
        acc[v].x = fmaf(w, x.x, acc[v].x);
        acc[v].y = fmaf(w, x.y, acc[v].y);
        acc[v].z = fmaf(w, x.z, acc[v].z);
        acc[v].w = fmaf(w, x.w, acc[v].w);
      }
    }
    lse = m + logf(z);
  }
  const float inv = z > 0.f ? 1.f / z : 0.f;
  Element* out = static_cast<Element*>(p.out) + static_cast<size_t>(row) * kHeadDim;
#pragma unroll
  for (int v = 0; v < kVec; ++v) {
    const uint2 packed = make_uint2(ptx::pack2<Element>(acc[v].x * inv, acc[v].y * inv),
                                    ptx::pack2<Element>(acc[v].z * inv, acc[v].w * inv));
    *reinterpret_cast<uint2*>(out + 4 * (lane + 32 * v)) = packed;
  }
  if (lane == 0) p.lse[(static_cast<size_t>(batch) * p.heads + head) * p.seqlen_q + token] = lse;
}

}  // namespace dsv4
