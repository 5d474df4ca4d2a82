// merge_attn_states in one pass over HBM: each thread merges 16-byte chunks (or elements when
// the tensors' strides or alignment do not allow vectors) of an output row from its two
// (out, lse) states. The arithmetic is the ATen composition's (csrc/fmha/merge.cpp), step for
// step and without contraction, so both paths agree: lse = logaddexp(lse_a, lse_b); the weights
// are exp(lse_x - lse), with lse taken as 0 where it is -inf (both sides empty: out 0).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "ptx/math.cuh"

namespace dsv4 {

constexpr int kMergeStatesThreads = 256;

// Rows are (b, t, h): dense out (B, T, H, Dv) with lse (B, H, T); varlen (T, H, Dv) with lse
// (H, T) as B = 1. out and lse are written contiguous; the inputs may be strided views whose
// last dim is contiguous.
struct MergeStatesParams {
  const void* out_a;
  const void* out_b;
  const float* lse_a;
  const float* lse_b;
  void* out;
  float* lse;
  int batch, tokens, heads, head_dim;
  long long a_stride[3], b_stride[3];    // out_a, out_b: element strides of b, t, h
  long long la_stride[3], lb_stride[3];  // lse_a, lse_b: element strides of b, t, h
};

namespace merge_detail {

template <typename Element>
__device__ __forceinline__ float load_float(Element x) {
  if constexpr (std::is_same_v<Element, float>) {
    return x;
  } else {
    return ptx::to_float(x);
  }
}

template <typename Element>
__device__ __forceinline__ Element store_float(float x) {
  if constexpr (std::is_same_v<Element, float>) {
    return x;
  } else {
    return ptx::from_float<Element>(x);
  }
}

template <typename Element, int kVec>
struct alignas(sizeof(Element) * kVec) Chunk {
  Element v[kVec];
};

// torch's logaddexp for floats.
__device__ __forceinline__ float logaddexp(float a, float b) {
  if (isinf(a) && a == b) return a;
  const float m = fmaxf(a, b);
  return __fadd_rn(m, log1pf(expf(-fabsf(__fsub_rn(a, b)))));
}

}  // namespace merge_detail

// Each thread merges kPerThread chunks of one row, threads_per_row apart so that a warp's loads
// stay contiguous: the row's lse and weights are computed once per kPerThread chunks, and the
// loads of all of them are in flight together.
template <typename Element, int kVec, int kPerThread>
__global__ void __launch_bounds__(kMergeStatesThreads)
    merge_states_kernel(const MergeStatesParams p) {
  using namespace merge_detail;
  using ChunkT = Chunk<Element, kVec>;
  const unsigned threads_per_row = p.head_dim / (kVec * kPerThread);
  const unsigned total = unsigned(p.batch) * p.tokens * p.heads * threads_per_row;  // < 2^31
  const float neg_inf = __int_as_float(0xff800000);
  for (unsigned c = blockIdx.x * blockDim.x + threadIdx.x; c < total; c += gridDim.x * blockDim.x) {
    const unsigned row = c / threads_per_row, first = c - row * threads_per_row;
    const unsigned h = row % p.heads, bt = row / p.heads;
    const unsigned t = bt % p.tokens, b = bt / p.tokens;
    const float la = p.lse_a[b * p.la_stride[0] + t * p.la_stride[1] + h * p.la_stride[2]];
    const float lb = p.lse_b[b * p.lb_stride[0] + t * p.lb_stride[1] + h * p.lb_stride[2]];
    const Element* row_a = static_cast<const Element*>(p.out_a) + b * p.a_stride[0] +
                           t * p.a_stride[1] + h * p.a_stride[2];
    const Element* row_b = static_cast<const Element*>(p.out_b) + b * p.b_stride[0] +
                           t * p.b_stride[1] + h * p.b_stride[2];
    ChunkT xa[kPerThread], xb[kPerThread];
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const unsigned col = (first + k * threads_per_row) * kVec;
      xa[k] = *reinterpret_cast<const ChunkT*>(row_a + col);
      xb[k] = *reinterpret_cast<const ChunkT*>(row_b + col);
    }
    const float lse = logaddexp(la, lb);
    const float shift = lse == neg_inf ? 0.f : lse;
    const float wa = expf(__fsub_rn(la, shift)), wb = expf(__fsub_rn(lb, shift));
    Element* row_out = static_cast<Element*>(p.out) + size_t(row) * p.head_dim;
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      ChunkT y;
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        y.v[i] = store_float<Element>(__fadd_rn(__fmul_rn(load_float(xa[k].v[i]), wa),
                                                __fmul_rn(load_float(xb[k].v[i]), wb)));
      }
      *reinterpret_cast<ChunkT*>(row_out + (first + k * threads_per_row) * kVec) = y;
    }
    if (first == 0) p.lse[(size_t(b) * p.heads + h) * p.tokens + t] = lse;
  }
}

}  // namespace dsv4
