// The segment split's two small kernels (chunk_sm90.cu, launch_segmented), so a segmented call
// decides and combines on the device without a host sync or a chain of ATen kernels.
//
// Plan: a segment k >= 1 may start from S = 0 a few chunks early (a warm-up) when the state
// before that point provably fades: the chunk map S <- e^g (I - beta k k^T) S + ... has
// operator norm at most e^(g + log max(1, |1 - beta |k|^2|)), so if those exponents sum to
// <= -10 over the warm-up, the dropped history weighs at most e^-10 (4.5e-5) of its norm.
// A head takes warm-ups only if every segment has one within `max_warmup_chunks`; otherwise
// (no decay, g = 0 included) it takes the exact combine. The plan writes each segment's entry
// on its own, and the passes and the combine reduce them (segment_exact). Simple GLA is the
// case beta = 0.
//
// Combine: for the heads the plan leaves exact, S_(k+1) = A_k S_k + L_k in float64, with
// A_k the segment's state map M_k (delta rule) or the scalar e^(sum of g) (simple GLA).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "sm90/chunk/params.h"
#include "ptx/math.cuh"
#include "ptx/sync.cuh"

namespace dsv4 {

struct ChunkSegmentTraits {
  static constexpr int kChunk = 64;
  static constexpr int kDim = 128;
  static constexpr int kPlanThreads = 256;  // a warp per segment, strided
  static constexpr float kFadeLog = -10.f;  // natural log of the history's largest weight
  static constexpr int kCombineThreads = 256;
  static constexpr int kCombineCols = 8;    // state columns per combine CTA
  static constexpr int kMapLd = kDim + 1;   // fp32 row stride of M_k in shared memory
  static constexpr size_t kCombineSmemBytes = sizeof(float) * kDim * kMapLd;
};

template <typename T>
__device__ __forceinline__ T warp_sum(T x) {
#pragma unroll
  for (int d = 16; d > 0; d /= 2) x += __shfl_xor_sync(0xffffffff, x, d);
  return __shfl_sync(0xffffffff, x, 0);  // one value for the whole warp, whatever the order
}

// Whether (sequence b, v-head hv) takes the exact combine: some segment found no warm-up. By
// whole warps, a lane per segment.
__device__ __forceinline__ bool segment_exact(const int* warmup, int b, int segments, int heads_v,
                                              int hv) {
  bool none = false;
  const int* head = warmup + static_cast<int64_t>(b) * segments * heads_v + hv;
#pragma unroll 1
  for (int k = threadIdx.x % 32; k < segments; k += 32) none |= head[k * heads_v] < 0;
  return __any_sync(0xffffffff, none);
}

// The plan of `cta`'s segments_per_cta segments of one (sequence, v-head), by a CTA of
// kThreads threads: the plan kernel's body (every segment of a head per CTA), and the delta
// rule's inverse kernel runs it in CTAs of its own launch, a warp per segment (the plan then
// costs neither a launch nor time on the stream: measured 5-10 us as a kernel of its own; a
// warp walking four segments was the inverse launch's longest CTA at (1, 65536, 2, 8)).
template <typename Element, bool kDelta, int kThreads>
__device__ __forceinline__ void segment_plan(const ChunkSegmentPlanParams& p, unsigned cta) {
  using Tr = ChunkSegmentTraits;
  const int ctas_per_head = (p.segments + p.segments_per_cta - 1) / p.segments_per_cta;
  const int head = cta / ctas_per_head, hv = head % p.heads_v, b = head / p.heads_v;
  const int seg_begin = cta % ctas_per_head * p.segments_per_cta;
  const int seg_end = min(seg_begin + p.segments_per_cta, p.segments);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __shared__ int exact;  // GLA: some segment found no warm-up (its CTA covers the whole head)
  if (threadIdx.x == 0) exact = 0;
  __syncthreads();

  // log of the operator norm of token t's map (at most its gate; see the top of the file).
  auto log_norm = [&](int t) {
    const int64_t idx = (static_cast<int64_t>(b) * p.seqlen + t) * p.heads_v + hv;
    float f = p.g[idx];
    if constexpr (kDelta) {
      const Element* row = static_cast<const Element*>(p.k) + b * p.k_stride_b +
                           t * p.k_stride_t + (hv / p.group) * p.k_stride_h;
      float sq = 0.f;
#pragma unroll 4
      for (int part = 0; part < Tr::kDim / 8; ++part) {
        const uint4 raw = reinterpret_cast<const uint4*>(row)[part];
        const Element* x = reinterpret_cast<const Element*>(&raw);
#pragma unroll
        for (int e = 0; e < 8; ++e) sq = fmaf(ptx::to_float(x[e]), ptx::to_float(x[e]), sq);
      }
      // The in-kernel l2norm leaves |k|^2 = sq / (sq + 1e-6), then rounds k to 16 bits.
      if (p.qk_l2norm) sq = sq / (sq + 1e-6f) * 1.01f;
      f += __logf(fmaxf(1.f, fabsf(1.f - p.beta[idx] * sq)));
    }
    return f;
  };

  for (int seg = seg_begin + warp; seg < seg_end; seg += kThreads / 32) {
    const int first = seg * p.segment_len;
    const int64_t out = (static_cast<int64_t>(b) * p.segments + seg) * p.heads_v + hv;
    int warm = 0;  // segment 0 starts from the call's initial state
    if (seg > 0) {
      warm = -1;
      float fade = 0.f;
      for (int w = 1; w <= p.max_warmup_chunks && first - w * Tr::kChunk >= 0; ++w) {
        const int c0 = first - w * Tr::kChunk;
        fade += warp_sum(log_norm(c0 + lane) + log_norm(c0 + 32 + lane));
        if (fade <= Tr::kFadeLog) {  // NaN never passes
          warm = w;
          break;
        }
      }
      if (warm < 0 && lane == 0) exact = 1;
    }
    if (lane == 0) p.warmup[out] = warm;
  }
  if constexpr (!kDelta) {
    // Simple GLA's exact combine needs each segment's gate sum: the whole CTA per segment,
    // only for the heads that take it.
    __syncthreads();
    if (!exact) return;  // uniform: read after the barrier
    __shared__ double partial[kThreads / 32];
    for (int seg = 0; seg < p.segments; ++seg) {
      const int first = seg * p.segment_len, end = min(first + p.segment_len, p.seqlen);
      double sum = 0.0;
#pragma unroll 8
      for (int t = first + threadIdx.x; t < end; t += kThreads) {
        sum += p.g[(static_cast<int64_t>(b) * p.seqlen + t) * p.heads_v + hv];
      }
      sum = warp_sum(sum);
      if (lane == 0) partial[warp] = sum;
      __syncthreads();
      if (threadIdx.x == 0) {
        double total = 0.0;
        for (int w = 0; w < kThreads / 32; ++w) total += partial[w];
        p.gate_sum[(static_cast<int64_t>(b) * p.segments + seg) * p.heads_v + hv] = total;
      }
      __syncthreads();  // partial is reused by the next segment
    }
  }
}

template <typename Element, bool kDelta>
__global__ void __launch_bounds__(ChunkSegmentTraits::kPlanThreads)
    chunk_segment_plan_kernel(const ChunkSegmentPlanParams p) {
  ptx::griddep_launch_dependents();  // the state-only pass waits for this grid itself
  segment_plan<Element, kDelta, ChunkSegmentTraits::kPlanThreads>(p, blockIdx.x);
}

template <bool kDelta>
__global__ void __launch_bounds__(ChunkSegmentTraits::kCombineThreads)
    chunk_segment_combine_kernel(const ChunkSegmentCombineParams p) {
  using Tr = ChunkSegmentTraits;
  constexpr int kDim = Tr::kDim, kBlocks = kDim / Tr::kCombineCols;
  extern __shared__ float map_tile[];  // M_k, [kDim][kMapLd] (delta rule)
  __shared__ double state[kDim][Tr::kCombineCols];
  const int col0 = (blockIdx.x % kBlocks) * Tr::kCombineCols;
  const int hv = (blockIdx.x / kBlocks) % p.heads_v;
  const int b = blockIdx.x / kBlocks / p.heads_v;
  // This thread's 4 state entries: row `row`, columns col0 + cols .. + 3.
  const int row = threadIdx.x / 2, cols = (threadIdx.x % 2) * 4;
  auto matrix = [&](int seg) {  // segment seg's [128][128] state of this head
    return ((static_cast<int64_t>(b) * p.segments + seg) * p.heads_v + hv) * kDim * kDim;
  };
  auto entry = [&](int seg) { return matrix(seg) + row * kDim + col0 + cols; };
  // Launched programmatically behind the state-only pass, which wrote local and maps.
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();

  // A head with warm-ups starts its later segments from zero (uniform across the CTA), and
  // segment 0 reads the initial state itself, so such a head has nothing to do here.
  if (!segment_exact(p.warmup, b, p.segments, p.heads_v, hv)) return;
  // For the last pass, which reads only its own segment's entry: every segment of this head
  // starts from the combine's state.
  if (blockIdx.x % kBlocks == 0) {
    for (int seg = threadIdx.x; seg < p.segments; seg += Tr::kCombineThreads) {
      p.warmup[(static_cast<int64_t>(b) * p.segments + seg) * p.heads_v + hv] = -1;
    }
  }
  double s[4];
  const int64_t s0 = (static_cast<int64_t>(b) * p.heads_v + hv) * kDim * kDim + row * kDim + col0 + cols;
#pragma unroll
  for (int i = 0; i < 4; ++i) s[i] = p.initial_state != nullptr ? p.initial_state[s0 + i] : 0.0;

  for (int seg = 0; seg + 1 < p.segments; ++seg) {
    const int64_t at = entry(seg);
    if constexpr (kDelta) {
      const float4* m = reinterpret_cast<const float4*>(p.maps + matrix(seg));
      __syncthreads();  // the previous step's reads of map_tile and state are done
      for (int i = threadIdx.x; i < kDim * kDim / 4; i += Tr::kCombineThreads) {
        const float4 v = m[i];
        float* dst = map_tile + (i / (kDim / 4)) * Tr::kMapLd + (i % (kDim / 4)) * 4;
        dst[0] = v.x;
        dst[1] = v.y;
        dst[2] = v.z;
        dst[3] = v.w;
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) state[row][cols + i] = s[i];
      __syncthreads();
#pragma unroll
      for (int i = 0; i < 4; ++i) s[i] = p.local[at + i];
      for (int j = 0; j < kDim; ++j) {
        const double mj = map_tile[row * Tr::kMapLd + j];
#pragma unroll
        for (int i = 0; i < 4; ++i) s[i] = fma(mj, state[j][cols + i], s[i]);
      }
    } else {
      const double decay = exp(p.gate_sum[(static_cast<int64_t>(b) * p.segments + seg) * p.heads_v + hv]);
#pragma unroll
      for (int i = 0; i < 4; ++i) s[i] = fma(decay, s[i], static_cast<double>(p.local[at + i]));
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) p.start[entry(seg + 1) + i] = static_cast<float>(s[i]);
  }
}

}  // namespace dsv4
