// One decode step of the gated delta rule (README: gated_delta_rule_decode) for T <= 4 tokens
// per sequence, K = V = 128: one CTA per (sequence, v-head); threads 2j and 2j + 1 own the two
// halves (64 rows each) of column j of the K x V fp32 state, kept in registers for the step
// (a whole column per thread spilled). Per token t:
//   S <- exp(g_t) S;  u_j = beta_t (v_tj - sum_k S_kj k_tk);  S_kj += k_tk u_j;
//   o_tj = scale sum_k S_kj q_tk.
// The state is read once and written once (a warp covers 16 consecutive columns of two rows);
// q and k go through shared memory, each l2-normalized there when asked.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "sm90/linear_decode/params.h"

namespace dsv4 {

constexpr int kDecodeDim = 128;      // K = V
constexpr int kDecodeHalf = kDecodeDim / 2;
constexpr int kDecodeThreads = 2 * kDecodeDim;
constexpr int kDecodeMaxTokens = 4;  // T

template <typename T>
__device__ __forceinline__ float decode_to_float(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(x);
  } else {
    return __half2float(x);
  }
}

template <typename T>
__device__ __forceinline__ T decode_from_float(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(x);
  } else {
    return __float2half_rn(x);
  }
}

// The sum over the CTA's threads (every thread gets it); `scratch` holds one float per warp.
__device__ __forceinline__ float decode_block_sum(float x, float* scratch) {
#pragma unroll
  for (int m = 16; m > 0; m /= 2) x += __shfl_xor_sync(0xffffffff, x, m);
  __syncthreads();  // scratch's last readers are done
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = x;
  __syncthreads();
  float sum = 0.f;
#pragma unroll
  for (int w = 0; w < kDecodeThreads / 32; ++w) sum += scratch[w];
  return sum;
}

template <typename Element, typename State>
__global__ void __launch_bounds__(kDecodeThreads)
    gated_delta_decode_kernel(const GatedDeltaDecodeParams p) {
  __shared__ float qs[kDecodeMaxTokens][kDecodeDim], ks[kDecodeMaxTokens][kDecodeDim];
  __shared__ float vs[kDecodeMaxTokens][kDecodeDim], gs[kDecodeMaxTokens], bs[kDecodeMaxTokens];
  __shared__ float scratch[kDecodeThreads / 32];
  const int hv = blockIdx.x % p.heads_v, b = blockIdx.x / p.heads_v;
  const int j = threadIdx.x / 2, half = threadIdx.x % 2;  // column j, rows 64 half + i
  const int h = hv / (p.heads_v / p.heads_qk);
  int64_t slot = b;
  if (p.state_indices != nullptr) {
    slot = p.indices_64 ? static_cast<const int64_t*>(p.state_indices)[b]
                        : static_cast<const int*>(p.state_indices)[b];
  }
  Element* o = static_cast<Element*>(p.o);
  const int64_t o_row = (int64_t(b) * p.tokens * p.heads_v + hv) * kDecodeDim + j;
  if (slot < 0 || slot >= p.num_states) {  // skipped: o = 0, the state untouched
    for (int t = 0; t < p.tokens && half == 0; ++t) {
      o[o_row + int64_t(t) * p.heads_v * kDecodeDim] = decode_from_float<Element>(0.f);
    }
    return;
  }
  // The state's column j: its loads go out first.
  State* col = static_cast<State*>(p.state) +
               ((slot * p.heads_v + hv) * kDecodeDim + half * kDecodeHalf) * kDecodeDim + j;
  float s[kDecodeHalf];
#pragma unroll
  for (int i = 0; i < kDecodeHalf; ++i) s[i] = decode_to_float(col[i * kDecodeDim]);
  // q and k of every token into shared memory (each thread one dim), normalized if asked and
  // rounded to their dtype, as the chunk op does; so do v, g and beta (indexed by the token:
  // registers indexed so would spill).
  const Element* q = static_cast<const Element*>(p.q);
  const Element* kp = static_cast<const Element*>(p.k);
  const Element* v = static_cast<const Element*>(p.v);
  const int d = threadIdx.x % kDecodeDim;  // threads d and d + 128 load dim d (the first keeps it)
#pragma unroll 1
  for (int t = 0; t < p.tokens; ++t) {
    float qv = decode_to_float(q[b * p.q_stride[0] + t * p.q_stride[1] + h * p.q_stride[2] + d]);
    float kv = decode_to_float(kp[b * p.k_stride[0] + t * p.k_stride[1] + h * p.k_stride[2] + d]);
    if (threadIdx.x >= kDecodeDim) qv = kv = 0.f;
    if (p.qk_l2norm) {
      qv = decode_to_float(decode_from_float<Element>(qv * rsqrtf(decode_block_sum(qv * qv, scratch) + 1e-6f)));
      kv = decode_to_float(decode_from_float<Element>(kv * rsqrtf(decode_block_sum(kv * kv, scratch) + 1e-6f)));
    }
    if (threadIdx.x < kDecodeDim) {
      qs[t][d] = qv;
      ks[t][d] = kv;
      vs[t][d] = decode_to_float(v[b * p.v_stride[0] + t * p.v_stride[1] + hv * p.v_stride[2] + d]);
    }
    if (threadIdx.x == 0) {
      const int64_t gi = (int64_t(b) * p.tokens + t) * p.heads_v + hv;
      gs[t] = p.g[gi];
      bs[t] = p.beta[gi];
    }
  }
  __syncthreads();
#pragma unroll 1
  for (int t = 0; t < p.tokens; ++t) {
    const float decay = expf(gs[t]);
    const float* kt = &ks[t][half * kDecodeHalf];
    const float* qt = &qs[t][half * kDecodeHalf];
    float w = 0.f;
#pragma unroll
    for (int i = 0; i < kDecodeHalf; ++i) {
      s[i] *= decay;
      w = fmaf(s[i], kt[i], w);
    }
    w += __shfl_xor_sync(0xffffffff, w, 1);  // the column's other half
    const float u = bs[t] * (vs[t][j] - w);
    float out = 0.f;
#pragma unroll
    for (int i = 0; i < kDecodeHalf; ++i) {
      s[i] = fmaf(kt[i], u, s[i]);
      out = fmaf(s[i], qt[i], out);
    }
    out += __shfl_xor_sync(0xffffffff, out, 1);
    if (half == 0) o[o_row + int64_t(t) * p.heads_v * kDecodeDim] = decode_from_float<Element>(p.scale * out);
  }
#pragma unroll
  for (int i = 0; i < kDecodeHalf; ++i) col[i * kDecodeDim] = decode_from_float<State>(s[i]);
}

}  // namespace dsv4
