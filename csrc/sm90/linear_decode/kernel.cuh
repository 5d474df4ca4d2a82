// One decode step of the gated delta rule (README: gated_delta_rule_decode) for T <= 4 tokens
// per sequence, K = V = 128: one CTA of 128 threads per (sequence, v-head); thread j owns column
// j of the K x V state block. Per token t (a_t = exp(g_t)):
//   S <- a_t S;  u_j = beta_t (v_tj - sum_k S_kj k_tk);  S_kj += k_tk u_j;  o_tj = scale q_t . S_j.
// All T tokens take two passes over the column, whatever T: the first reads it once for the dots
// k_t . S0_j and q_t . S0_j, from which (with the small Gram products k_t . k_s and q_t . k_s)
// every u_tj and o_tj follows in closed form; the second writes S_T = A_T S0 + sum_s c_s k_s u_s^T.
// The block (contiguous in the pool) arrives in four row chunks by bulk copies and leaves the same
// way, so the first pass starts on the first chunk and the write-back overlaps the second pass.
// A bf16 state is read and written in place in shared memory, the math in fp32, rounded once.
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
constexpr int kDecodeChunks = 4;     // row chunks of the state block, each its own copy
constexpr int kDecodeChunkRows = kDecodeDim / kDecodeChunks;

// Dynamic shared memory: the state block in its own dtype.
template <typename State>
constexpr int decode_smem_bytes() {
  return kDecodeStateFloats * int(sizeof(State));
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

// The tokens' vectors and scalars, staged in shared memory.
struct DecodeTokens {
  alignas(16) float q[kDecodeMaxTokens][kDecodeDim];
  alignas(16) float k[kDecodeMaxTokens][kDecodeDim];
  float v[kDecodeMaxTokens][kDecodeDim];
  float decay[kDecodeMaxTokens], beta[kDecodeMaxTokens];
  float kk[kDecodeMaxTokens][kDecodeMaxTokens];  // k_t . k_s
  float qk[kDecodeMaxTokens][kDecodeMaxTokens];  // q_t . k_s
};

// Warp t computes row t of the Gram products (s <= t; the diagonal of kk is not used).
__device__ __forceinline__ void decode_gram(DecodeTokens& tok, int tokens) {
  const int t = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (t >= tokens) return;
  const float4 q = reinterpret_cast<const float4*>(tok.q[t])[lane];
  const float4 k = reinterpret_cast<const float4*>(tok.k[t])[lane];
  for (int s = 0; s <= t; ++s) {
    const float4 ks = reinterpret_cast<const float4*>(tok.k[s])[lane];
    float dk = k.x * ks.x + k.y * ks.y + k.z * ks.z + k.w * ks.w;
    float dq = q.x * ks.x + q.y * ks.y + q.z * ks.z + q.w * ks.w;
#pragma unroll
    for (int m = 16; m > 0; m /= 2) {
      dk += __shfl_xor_sync(0xffffffff, dk, m);
      dq += __shfl_xor_sync(0xffffffff, dq, m);
    }
    if (lane == 0) {
      tok.kk[t][s] = dk;
      tok.qk[t][s] = dq;
    }
  }
}

// Column j through T tokens: the dots on the first pass, u and o in closed form, the update on
// the second pass with each chunk's write-back issued as soon as the CTA has written it.
template <int T, typename State>
__device__ __forceinline__ void decode_column(State* block, State* state, const DecodeTokens& tok,
                                              const uint64_t* chunk_full, float scale,
                                              float (&out)[kDecodeMaxTokens]) {
  const int j = threadIdx.x;
  float dk[T], dq[T];
#pragma unroll
  for (int t = 0; t < T; ++t) dk[t] = dq[t] = 0.f;
#pragma unroll 1
  for (int c = 0; c < kDecodeChunks; ++c) {
    ptx::mbarrier_wait(ptx::smem_addr(&chunk_full[c]), 0);
#pragma unroll 2
    for (int k = c * kDecodeChunkRows; k < (c + 1) * kDecodeChunkRows; k += 4) {
      float x[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) x[i] = ptx::to_float(block[(k + i) * kDecodeDim + j]);
#pragma unroll
      for (int t = 0; t < T; ++t) {
        const float4 kk = reinterpret_cast<const float4*>(tok.k[t])[k / 4];
        const float4 qq = reinterpret_cast<const float4*>(tok.q[t])[k / 4];
        dk[t] = fmaf(x[3], kk.w, fmaf(x[2], kk.z, fmaf(x[1], kk.y, fmaf(x[0], kk.x, dk[t]))));
        dq[t] = fmaf(x[3], qq.w, fmaf(x[2], qq.z, fmaf(x[1], qq.y, fmaf(x[0], qq.x, dq[t]))));
      }
    }
  }
  // decay_ts[t][s] = a_{s+1} ... a_t (the decay from after token s to token t), 1 when s = t;
  // cum[t] = a_0 ... a_t.
  float cum[T], decay_ts[T][T], u[T];
#pragma unroll
  for (int t = 0; t < T; ++t) {
    cum[t] = (t == 0 ? 1.f : cum[t - 1]) * tok.decay[t];
    decay_ts[t][t] = 1.f;
#pragma unroll
    for (int s = t - 1; s >= 0; --s) decay_ts[t][s] = decay_ts[t][s + 1] * tok.decay[s + 1];
  }
#pragma unroll
  for (int t = 0; t < T; ++t) {
    float w = cum[t] * dk[t];  // k_t . S_j after token t's decay
#pragma unroll
    for (int s = 0; s < t; ++s) w = fmaf(decay_ts[t][s] * tok.kk[t][s], u[s], w);
    u[t] = tok.beta[t] * (tok.v[t][j] - w);
    float o = cum[t] * dq[t];
#pragma unroll
    for (int s = 0; s <= t; ++s) o = fmaf(decay_ts[t][s] * tok.qk[t][s], u[s], o);
    out[t] = scale * o;
  }
  float c[T];
#pragma unroll
  for (int s = 0; s < T; ++s) c[s] = decay_ts[T - 1][s] * u[s];
  const float all_decay = cum[T - 1];
#pragma unroll 1
  for (int ch = 0; ch < kDecodeChunks; ++ch) {
#pragma unroll 2
    for (int k = ch * kDecodeChunkRows; k < (ch + 1) * kDecodeChunkRows; k += 4) {
      float x[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) x[i] = all_decay * ptx::to_float(block[(k + i) * kDecodeDim + j]);
#pragma unroll
      for (int s = 0; s < T; ++s) {
        const float4 kk = reinterpret_cast<const float4*>(tok.k[s])[k / 4];
        x[0] = fmaf(kk.x, c[s], x[0]);
        x[1] = fmaf(kk.y, c[s], x[1]);
        x[2] = fmaf(kk.z, c[s], x[2]);
        x[3] = fmaf(kk.w, c[s], x[3]);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) block[(k + i) * kDecodeDim + j] = ptx::from_float<State>(x[i]);
    }
    ptx::fence_proxy_async_smem();  // the bulk store reads what the threads wrote
    __syncthreads();
    if (j == 0) {
      constexpr uint32_t kChunk = kDecodeChunkRows * kDecodeDim;
      ptx::bulk_store(state + ch * kChunk, ptx::smem_addr(block + ch * kChunk),
                      kChunk * sizeof(State));
      ptx::bulk_commit_group();
    }
  }
}

// Sequence b's tokens into shared memory, thread j one dim: q and k of query/key head h
// (normalized if asked and rounded to their dtype, as the chunk op does), v of v-head hv, g as
// its decay and beta. Every token's loads are issued before the first is used: one round trip
// for any T.
template <typename Element>
__device__ __forceinline__ void decode_stage_tokens(const GatedDeltaDecodeParams& p, int b, int h,
                                                    int hv, DecodeTokens& tok, float* scratch) {
  const int j = threadIdx.x;
  const Element* q = static_cast<const Element*>(p.q);
  const Element* kp = static_cast<const Element*>(p.k);
  const Element* v = static_cast<const Element*>(p.v);
  float qv[kDecodeMaxTokens], kv[kDecodeMaxTokens], vv[kDecodeMaxTokens], gv[kDecodeMaxTokens],
      bv[kDecodeMaxTokens];
#pragma unroll
  for (int t = 0; t < kDecodeMaxTokens; ++t) {
    if (t < p.tokens) {
      qv[t] = ptx::to_float(q[b * p.q_stride[0] + t * p.q_stride[1] + h * p.q_stride[2] + j]);
      kv[t] = ptx::to_float(kp[b * p.k_stride[0] + t * p.k_stride[1] + h * p.k_stride[2] + j]);
      vv[t] = ptx::to_float(v[b * p.v_stride[0] + t * p.v_stride[1] + hv * p.v_stride[2] + j]);
      if (j == 0) {
        const int64_t gi = (int64_t(b) * p.tokens + t) * p.heads_v + hv;
        gv[t] = p.g[gi];
        bv[t] = p.beta[gi];
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kDecodeMaxTokens; ++t) {
    if (t < p.tokens) {
      if (p.qk_l2norm) {
        qv[t] = ptx::to_float(ptx::from_float<Element>(
            qv[t] * rsqrtf(decode_block_sum(qv[t] * qv[t], scratch) + 1e-6f)));
        kv[t] = ptx::to_float(ptx::from_float<Element>(
            kv[t] * rsqrtf(decode_block_sum(kv[t] * kv[t], scratch) + 1e-6f)));
      }
      tok.q[t][j] = qv[t];
      tok.k[t][j] = kv[t];
      tok.v[t][j] = vv[t];
      if (j == 0) {
        tok.decay[t] = expf(gv[t]);
        tok.beta[t] = bv[t];
      }
    }
  }
}

template <typename Element, typename State>
__global__ void __launch_bounds__(kDecodeDim)
    gated_delta_decode_kernel(const GatedDeltaDecodeParams p) {
  extern __shared__ __align__(128) uint8_t decode_smem[];
  State* block = reinterpret_cast<State*>(decode_smem);  // [k][j]
  __shared__ DecodeTokens tok;
  __shared__ float scratch[4];
  __shared__ alignas(8) uint64_t chunk_full[kDecodeChunks];
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
  if (j == 0) {
    constexpr uint32_t kChunk = kDecodeChunkRows * kDecodeDim;
    for (int c = 0; c < kDecodeChunks; ++c) ptx::mbarrier_init(ptx::smem_addr(&chunk_full[c]), 1);
    ptx::fence_barrier_init();
    for (int c = 0; c < kDecodeChunks; ++c) {
      const uint32_t full = ptx::smem_addr(&chunk_full[c]);
      ptx::mbarrier_arrive_expect_tx(full, kChunk * sizeof(State));
      ptx::bulk_load(ptx::smem_addr(block + c * kChunk), state + c * kChunk,
                     kChunk * sizeof(State), full);
    }
  }
  decode_stage_tokens<Element>(p, b, h, hv, tok, scratch);  // while the state lands
  __syncthreads();  // q, k, v, g, beta; the barriers' init
  decode_gram(tok, p.tokens);
  __syncthreads();
  float out[kDecodeMaxTokens];
  switch (p.tokens) {
    case 1: decode_column<1>(block, state, tok, chunk_full, p.scale, out); break;
    case 2: decode_column<2>(block, state, tok, chunk_full, p.scale, out); break;
    case 3: decode_column<3>(block, state, tok, chunk_full, p.scale, out); break;
    default: decode_column<4>(block, state, tok, chunk_full, p.scale, out); break;
  }
#pragma unroll
  for (int t = 0; t < kDecodeMaxTokens; ++t) {
    if (t < p.tokens) {
      o[o_row + int64_t(t) * p.heads_v * kDecodeDim] = ptx::from_float<Element>(out[t]);
    }
  }
  if (j == 0) ptx::bulk_wait_group_read<0>();  // the shared memory stays until the stores read it
}

}  // namespace dsv4
