// The split-KV combine kernel: one warp per output row merges the splits' partial rows by
// their lse (csrc/sm90/shared/split_kv.h says what they hold). Memory-bound; fp32 throughout.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "sm90/shared/queue_kernel.h"
#include "sm90/shared/split_kv.h"
#include "ptx/math.cuh"
#include "ptx/sync.cuh"

namespace dsv4 {

constexpr int kSplitKvCombineWarps = 8;  // rows per 256-thread block

// (At least one block per SM: without that bound ptxas held the head_dim-64 instance to 32
// registers, and it spilled.)
template <typename Element, int kHeadDim>
__global__ void __launch_bounds__(32 * kSplitKvCombineWarps, 1)
    split_kv_combine_kernel(const SplitKvCombineParams p) {
  static_assert(kHeadDim % 64 == 0, "a lane owns whole float2 or float4 groups");
  // Each lane owns kVec groups of kWidth floats (float4, or float2 at head_dim 64).
  constexpr int kWidth = kHeadDim % 128 == 0 ? 4 : 2;
  constexpr int kVec = kHeadDim / (32 * kWidth);
  using Group = std::conditional_t<kWidth == 4, float4, float2>;
  constexpr int kSplitsInFlight = kVec == 1 ? 16 : 4;  // partial rows loaded at once
  // Launched to follow the split kernel (its CTAs resident as the split kernel's leave SMs):
  // the partials are complete and visible only after this wait.
  ptx::griddep_wait();
  const int row = blockIdx.x * kSplitKvCombineWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= p.rows) return;
  const int head = row % p.heads, token = (row / p.heads) % p.seqlen_q;
  const int batch = row / p.heads / p.seqlen_q;
  const float neg_inf = __int_as_float(0xff800000);

  // The splits' lse are read in parallel (lane l holds splits l, l + 32, ...) and their
  // weights broadcast from there, and the partial rows' loads are unrolled: a decode call has
  // few rows, so this kernel's time is its chain of global-load latencies, not bandwidth.
  const float* lse_row = p.lse_partial + row;
  float m = neg_inf;  // the splits' largest lse
  for (int s = lane; s < p.splits; s += 32) m = fmaxf(m, lse_row[static_cast<size_t>(s) * p.rows]);
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, offset));
  }
  float acc[kVec][kWidth];
#pragma unroll
  for (int v = 0; v < kVec; ++v) {
#pragma unroll
    for (int e = 0; e < kWidth; ++e) acc[v][e] = 0.f;
  }
  float z = 0.f, lse_keys = neg_inf;
  if (m != neg_inf) {  // else no split saw a key
    float z_lane = 0.f;
    for (int s0 = 0; s0 < p.splits; s0 += 32) {
      const int count = min(32, p.splits - s0);
      const float w_lane =
          lane < count ? expf(lse_row[static_cast<size_t>(s0 + lane) * p.rows] - m) : 0.f;
      z_lane += w_lane;
#pragma unroll kSplitsInFlight
      for (int j = 0; j < count; ++j) {
        const float w = __shfl_sync(0xffffffff, w_lane, j);
        const Group* src = reinterpret_cast<const Group*>(
            p.o_partial + (static_cast<size_t>(s0 + j) * p.rows + row) * kHeadDim);
#pragma unroll
        for (int v = 0; v < kVec; ++v) {
          const Group x = src[lane + 32 * v];
          float xs[4] = {x.x, x.y, 0.f, 0.f};
          if constexpr (kWidth == 4) xs[2] = x.z, xs[3] = x.w;
          // A split with no visible key (w = 0) is skipped, whatever its partial row holds.
#pragma unroll
          for (int e = 0; e < kWidth; ++e) acc[v][e] = w != 0.f ? fmaf(w, xs[e], acc[v][e]) : acc[v][e];
        }
      }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
      z_lane += __shfl_xor_sync(0xffffffff, z_lane, offset);
    }
    z = z_lane;
    lse_keys = m + logf(z);
  }
  // The sink joins the denominator once: lse = logaddexp(lse_keys, sink), and the keys keep
  // exp(lse_keys - lse) of the weight (0 for a sink of +inf; out 0, lse -inf with no key and
  // no sink).
  float lse = lse_keys, keep = 1.f;
  if (p.sinks != nullptr) {
    const float sink = p.sinks[head], top = fmaxf(lse_keys, sink);
    if (top == -neg_inf) {
      lse = top;
    } else if (top != neg_inf) {
      lse = top + logf(expf(lse_keys - top) + expf(sink - top));
    }
    keep = expf(lse_keys - lse);
  }
  const float inv = z > 0.f ? keep / z : 0.f;
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
  if (lane == 0) {
    p.lse[(static_cast<size_t>(batch) * p.heads + head) * p.seqlen_q + token] =
        p.lse_with_sink ? lse : lse_keys;
  }
}

// Queues the combine of a split attention kernel's partials (its parameter struct `p`: the
// partial buffers, sinks, num_splits and the (batch, seqlen_q, heads_q) rows) into out and lse
// (lse_with_sink false: the keys' lse alone).
// Queued by programmatic dependent launch behind the split kernel, which triggers it at its
// start (ptx::griddep_launch_dependents). Returns the launch's error.
template <typename Element, int kHeadDim, typename KernelParams>
cudaError_t launch_split_kv_combine(const KernelParams& p, void* out, float* lse,
                                    cudaStream_t stream, bool lse_with_sink = true) {
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
  c.lse_with_sink = lse_with_sink ? 1 : 0;
  const unsigned blocks =
      static_cast<unsigned>((c.rows + kSplitKvCombineWarps - 1) / kSplitKvCombineWarps);
  return queue_kernel(split_kv_combine_kernel<Element, kHeadDim>, dim3(blocks),
                      dim3(32 * kSplitKvCombineWarps), 0, stream, true, c);
}

}  // namespace dsv4
