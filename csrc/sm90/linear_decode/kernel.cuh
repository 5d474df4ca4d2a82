// One decode step of the gated delta rule (README: gated_delta_rule_decode) for T <= 4 tokens
// per sequence, K = V = 128: one CTA of 128 threads per (sequence, v-head). The K x V state
// block (contiguous in the pool) arrives in shared memory by one bulk copy and leaves by one, so
// a few CTAs per SM (three for an fp32 state) keep their copies in flight while others compute;
// thread j owns column j. The state is held in fp32 (a bf16 state is widened on arrival and
// rounded once on the way out, as the reference path does). Per token t:
//   S <- exp(g_t) S;  u_j = beta_t (v_tj - sum_k S_kj k_tk);  S_kj += k_tk u_j;
//   o_tj = scale sum_k S_kj q_tk.
// q and k go through shared memory, each l2-normalized there when asked.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "ptx/math.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/sync.cuh"
#include "ptx/tma.cuh"
#include "sm90/linear_decode/params.h"

namespace dsv4 {

constexpr int kDecodeDim = 128;      // K = V, and the CTA's threads
constexpr int kDecodeMaxTokens = 4;  // T
constexpr int kDecodeStateFloats = kDecodeDim * kDecodeDim;

// Dynamic shared memory: the fp32 working state, and for a bf16 state its staging copy.
template <typename State>
constexpr int decode_smem_bytes() {
  return kDecodeStateFloats * (4 + (std::is_same_v<State, float> ? 0 : int(sizeof(State))));
}

// The sum over the CTA's 128 threads (every thread gets it); `scratch` holds 4 floats.
__device__ __forceinline__ float decode_block_sum(float x, float* scratch) {
#pragma unroll
  for (int m = 16; m > 0; m /= 2) x += __shfl_xor_sync(0xffffffff, x, m);
  __syncthreads();  // scratch's last readers are done
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = x;
  __syncthreads();
  return scratch[0] + scratch[1] + scratch[2] + scratch[3];
}

template <typename Element, typename State>
__global__ void __launch_bounds__(kDecodeDim) gated_delta_decode_kernel(const GatedDeltaDecodeParams p) {
  extern __shared__ __align__(128) uint8_t decode_smem[];
  float* S = reinterpret_cast<float*>(decode_smem);  // [k][j]
  State* staged = std::is_same_v<State, float>
                      ? reinterpret_cast<State*>(S)
                      : reinterpret_cast<State*>(decode_smem + kDecodeStateFloats * 4);
  __shared__ alignas(16) float qs[kDecodeMaxTokens][kDecodeDim];
  __shared__ alignas(16) float ks[kDecodeMaxTokens][kDecodeDim];
  __shared__ float vs[kDecodeMaxTokens][kDecodeDim], gs[kDecodeMaxTokens], bs[kDecodeMaxTokens];
  __shared__ float scratch[4];
  __shared__ alignas(8) uint64_t state_full;
  const int hv = blockIdx.x % p.heads_v, b = blockIdx.x / p.heads_v, j = threadIdx.x;
  const int h = hv / (p.heads_v / p.heads_qk);
  int64_t slot = b;
  if (p.state_indices != nullptr) {
    slot = p.indices_64 ? static_cast<const int64_t*>(p.state_indices)[b]
                        : static_cast<const int*>(p.state_indices)[b];
  }
  Element* o = static_cast<Element*>(p.o);
  const int64_t o_row = (int64_t(b) * p.tokens * p.heads_v + hv) * kDecodeDim + j;
  if (slot < 0 || slot >= p.num_states) {  // skipped: o = 0, the state untouched
    for (int t = 0; t < p.tokens; ++t) {
      o[o_row + int64_t(t) * p.heads_v * kDecodeDim] = ptx::from_float<Element>(0.f);
    }
    return;
  }
  State* state = static_cast<State*>(p.state) + (slot * p.heads_v + hv) * kDecodeStateFloats;
  constexpr uint32_t kStateBytes = kDecodeStateFloats * sizeof(State);
  const uint32_t full = ptx::smem_addr(&state_full);
  if (j == 0) {
    ptx::mbarrier_init(full, 1);
    ptx::fence_barrier_init();
    ptx::mbarrier_arrive_expect_tx(full, kStateBytes);
    ptx::bulk_load(ptx::smem_addr(staged), state, kStateBytes, full);
  }
  // While the state lands: q and k of every token into shared memory (each thread one dim),
  // normalized if asked and rounded to their dtype, as the chunk op does; v, g and beta too.
  const Element* q = static_cast<const Element*>(p.q);
  const Element* kp = static_cast<const Element*>(p.k);
  const Element* v = static_cast<const Element*>(p.v);
#pragma unroll 1
  for (int t = 0; t < p.tokens; ++t) {
    float qv = ptx::to_float(q[b * p.q_stride[0] + t * p.q_stride[1] + h * p.q_stride[2] + j]);
    float kv = ptx::to_float(kp[b * p.k_stride[0] + t * p.k_stride[1] + h * p.k_stride[2] + j]);
    if (p.qk_l2norm) {
      qv = ptx::to_float(ptx::from_float<Element>(qv * rsqrtf(decode_block_sum(qv * qv, scratch) + 1e-6f)));
      kv = ptx::to_float(ptx::from_float<Element>(kv * rsqrtf(decode_block_sum(kv * kv, scratch) + 1e-6f)));
    }
    qs[t][j] = qv;
    ks[t][j] = kv;
    vs[t][j] = ptx::to_float(v[b * p.v_stride[0] + t * p.v_stride[1] + hv * p.v_stride[2] + j]);
    if (j == 0) {
      const int64_t gi = (int64_t(b) * p.tokens + t) * p.heads_v + hv;
      gs[t] = p.g[gi];
      bs[t] = p.beta[gi];
    }
  }
  __syncthreads();  // q, k, v, g, beta; the barrier's init
  ptx::mbarrier_wait(full, 0);
  if constexpr (!std::is_same_v<State, float>) {  // widen the staged state (column j: own data)
#pragma unroll 8
    for (int k = 0; k < kDecodeDim; ++k) S[k * kDecodeDim + j] = ptx::to_float(staged[k * kDecodeDim + j]);
  }
#pragma unroll 1
  for (int t = 0; t < p.tokens; ++t) {
    const float decay = expf(gs[t]);
    // k and q four at a time (one broadcast 16-byte read each), the column one value at a time.
    const float4* k4 = reinterpret_cast<const float4*>(ks[t]);
    const float4* q4 = reinterpret_cast<const float4*>(qs[t]);
    float w = 0.f;
#pragma unroll 4
    for (int k = 0; k < kDecodeDim; k += 4) {
      const float4 kk = k4[k / 4];
      const float* col = S + k * kDecodeDim + j;
      w = fmaf(col[0], kk.x, w);
      w = fmaf(col[kDecodeDim], kk.y, w);
      w = fmaf(col[2 * kDecodeDim], kk.z, w);
      w = fmaf(col[3 * kDecodeDim], kk.w, w);
    }
    const float u = bs[t] * (vs[t][j] - decay * w);
    float out = 0.f;
#pragma unroll 4
    for (int k = 0; k < kDecodeDim; k += 4) {
      const float4 kk = k4[k / 4], qq = q4[k / 4];
      float* col = S + k * kDecodeDim + j;
      const float x0 = fmaf(col[0], decay, kk.x * u), x1 = fmaf(col[kDecodeDim], decay, kk.y * u);
      const float x2 = fmaf(col[2 * kDecodeDim], decay, kk.z * u);
      const float x3 = fmaf(col[3 * kDecodeDim], decay, kk.w * u);
      col[0] = x0;
      col[kDecodeDim] = x1;
      col[2 * kDecodeDim] = x2;
      col[3 * kDecodeDim] = x3;
      out = fmaf(x0, qq.x, fmaf(x1, qq.y, fmaf(x2, qq.z, fmaf(x3, qq.w, out))));
    }
    o[o_row + int64_t(t) * p.heads_v * kDecodeDim] = ptx::from_float<Element>(p.scale * out);
  }
  if constexpr (!std::is_same_v<State, float>) {
#pragma unroll 8
    for (int k = 0; k < kDecodeDim; ++k) staged[k * kDecodeDim + j] = ptx::from_float<State>(S[k * kDecodeDim + j]);
  }
  ptx::fence_proxy_async_smem();  // the bulk store reads what the threads wrote
  __syncthreads();
  if (j == 0) {
    ptx::bulk_store(state, ptx::smem_addr(staged), kStateBytes);
    ptx::bulk_commit_group();
    ptx::bulk_wait_group_read<0>();  // the shared memory stays until the store has read it
  }
}

}  // namespace dsv4
