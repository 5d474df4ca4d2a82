// The split-KV combine kernel: one warp per output row merges the splits' partial rows by
// their lse (csrc/attention/split_kv.h says what they hold). Memory-bound; fp32 throughout.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "attention/split_kv.h"
#include "ptx/math.cuh"

namespace dsv4 {

constexpr int kSplitKvCombineWarps = 8;  // rows per 256-thread block

template <typename Element, int kHeadDim>
__global__ void __launch_bounds__(32 * kSplitKvCombineWarps)
    split_kv_combine_kernel(const SplitKvCombineParams p) {
  static_assert(kHeadDim % 64 == 0, "a lane owns whole float2 or float4 groups");
  // Each lane owns kVec groups of kWidth floats (float4, or float2 at head_dim 64).
  constexpr int kWidth = kHeadDim % 128 == 0 ? 4 : 2;
  constexpr int kVec = kHeadDim / (32 * kWidth);
  using Group = std::conditional_t<kWidth == 4, float4, float2>;
  const int row = blockIdx.x * kSplitKvCombineWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= p.rows) return;
  const int head = row % p.heads, token = (row / p.heads) % p.seqlen_q;
  const int batch = row / p.heads / p.seqlen_q;
  const float neg_inf = __int_as_float(0xff800000);

  float m = p.sinks != nullptr ? p.sinks[head] : neg_inf;
  for (int s = 0; s < p.splits; ++s) m = fmaxf(m, p.lse_partial[static_cast<size_t>(s) * p.rows + row]);
  float acc[kVec][kWidth];
#pragma unroll
  for (int v = 0; v < kVec; ++v) {
#pragma unroll
    for (int e = 0; e < kWidth; ++e) acc[v][e] = 0.f;
  }
  float z = 0.f, lse = neg_inf;
  if (m != neg_inf) {  // else nothing visible and no sink: out 0, lse -inf
    z = p.sinks != nullptr ? expf(p.sinks[head] - m) : 0.f;
    for (int s = 0; s < p.splits; ++s) {
      const float w = expf(p.lse_partial[static_cast<size_t>(s) * p.rows + row] - m);
      if (w == 0.f) continue;  // a split with no visible key (lse -inf)
      z += w;
      const Group* src = reinterpret_cast<const Group*>(
          p.o_partial + (static_cast<size_t>(s) * p.rows + row) * kHeadDim);
#pragma unroll
      for (int v = 0; v < kVec; ++v) {
        const Group x = src[lane + 32 * v];
        const float* xs = reinterpret_cast<const float*>(&x);
#pragma unroll
        for (int e = 0; e < kWidth; ++e) acc[v][e] = fmaf(w, xs[e], acc[v][e]);
      }
    }
    lse = m + logf(z);
  }
  const float inv = z > 0.f ? 1.f / z : 0.f;
  Element* out = static_cast<Element*>(p.out) + static_cast<size_t>(row) * kHeadDim;
#pragma unroll
  for (int v = 0; v < kVec; ++v) {
    Element* dst = out + kWidth * (lane + 32 * v);
    if constexpr (kWidth == 4) {
      *reinterpret_cast<uint2*>(dst) = make_uint2(ptx::pack2<Element>(acc[v][0] * inv, acc[v][1] * inv),
                                                  ptx::pack2<Element>(acc[v][2] * inv, acc[v][3] * inv));
    } else {
      *reinterpret_cast<uint32_t*>(dst) = ptx::pack2<Element>(acc[v][0] * inv, acc[v][1] * inv);
    }
  }
  if (lane == 0) p.lse[(static_cast<size_t>(batch) * p.heads + head) * p.seqlen_q + token] = lse;
}

// Queues the combine of a split attention kernel's partials (its parameter struct `p`: the
// partial buffers, sinks, num_splits and the (batch, seqlen_q, heads_q) rows) into out and lse.
// The caller checks the launch.
template <typename Element, int kHeadDim, typename KernelParams>
void launch_split_kv_combine(const KernelParams& p, void* out, float* lse, cudaStream_t stream) {
  SplitKvCombineParams c;
  c.o_partial = p.o_partial;
  c.lse_partial = p.lse_partial;
  c.out = out;
  c.lse = lse;
  c.sinks = p.sinks;
  c.splits = p.num_splits;
  c.rows = p.batch * p.seqlen_q * p.heads_q;
  c.heads = p.heads_q;
  c.seqlen_q = p.seqlen_q;
  const unsigned blocks =
      static_cast<unsigned>((c.rows + kSplitKvCombineWarps - 1) / kSplitKvCombineWarps);
  split_kv_combine_kernel<Element, kHeadDim><<<blocks, 32 * kSplitKvCombineWarps, 0, stream>>>(c);
}

}  // namespace dsv4
