// The chunk kernel's chain warpgroups (warpgroups 2 and 3: v-columns 0-63 and 64-127):
// everything that depends on S, the serial part. Each keeps its half of S^T (64 v-columns x 128
// key dims, fp32) in registers the whole walk:
//   X^T = S^T K^T and Y^T = S^T Q^T                (wgmma RS)
//   V_new^T = (beta (V - e^G X))^T T^T           (wgmma RS; GLA: V)
//   O^T = e^G Y^T + V_new^T P^T                  (wgmma RS)
//   S^T = e^G_last S^T + (w V_new)^T K,  w = e^(G_last - G)  (wgmma RS)
// then S^T is packed to 16 bits in registers as the next chunk's A operand, the next chunk's Y
// is issued, and O goes through the chain's staging tile (stmatrix) to HBM while Y runs: one TMA
// store by its thread 0 for a whole chunk, coalesced stores for a partial one (always the walk's
// last). A state-only pass (no o) skips Y, O and the prep's P, and so do the warm-up chunks a
// segment may walk before its first token.
// The state is kept transposed (S^T, v-columns as rows) so every product is a wgmma with M = 64
// v-columns and the chain's operands come from registers or from tiles as TMA wrote them.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "sm90/chunk/chain_io.cuh"
#include "sm90/chunk/tiles.cuh"
#include "sm90/chunk/traits.h"
#include "ptx/math.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/mma_sync.cuh"
#include "ptx/sync.cuh"
#include "ptx/tma.cuh"
#include "ptx/wgmma.cuh"

namespace dsv4 {

// S^T in 16 bits as the A operand of the next chunk's products: an accumulator's 8-column
// groups 2t and 2t + 1 are exactly k-step t's A fragment, so S never goes through shared memory.
template <typename Element>
__device__ __forceinline__ void pack_state(uint32_t (&sfrag)[8][4], const float (&sacc)[64]) {
#pragma unroll
  for (int j = 0; j < 16; ++j) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      sfrag[j / 2][2 * (j % 2) + i] =
          ptx::pack2<Element>(sacc[4 * j + 2 * i], sacc[4 * j + 2 * i + 1]);
    }
  }
}

// acc = S^T X^T over the 128 key dims, X a [K half][token][64] tile of the stage; committed.
template <typename Element>
__device__ __forceinline__ void state_times(float (&acc)[32], const uint32_t (&sfrag)[8][4],
                                            uint32_t x_base) {
  constexpr int kChunk = ChunkSm90Traits<Element>::kChunk;
#pragma unroll
  for (int cb = 0; cb < 2; ++cb) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint64_t db = ptx::smem_desc_sw128(x_base + cb * kChunk * 128 + kk * 32, 0, 1024);
      ptx::WgmmaRS<64, Element, 0>::run(acc, sfrag[4 * cb + kk], db, (cb | kk) != 0);
    }
  }
  ptx::wgmma_commit();
}

// X^T = S^T K^T and Y^T = S^T Q^T (v-column x token). Y is issued one chunk ahead, under the
// previous chunk's o staging, and stays in flight into the loop and across its back edge on
// every path (ptxas serializes the chain otherwise): the last chunk issues it once more on its
// own stage, which nobody refills, and a walk without chunks on stage 0, which nobody fills;
// those results are never read. X is issued at the top of its chunk (with both ahead beside
// o, the delta chain passes 192 registers and ptxas serializes its wgmmas, C7512).
template <typename Element>
__device__ __forceinline__ void issue_y(const ChunkContext& ctx, const ChainContext<Element>& ch,
                                        typename ChunkSm90Traits<Element>::SharedStorage& s,
                                        const uint32_t (&sfrag)[8][4], float (&yacc)[32], int cn) {
  constexpr int kStages = ChunkSm90Traits<Element>::kStages;
  const int st = cn % kStages;
  if (cn < ctx.num_chunks) {
    const uint32_t phase = (cn / kStages) & 1;
    ptx::mbarrier_wait(ptx::smem_addr(&s.full[st]), phase);
    if (ch.prep_rewrites_qk) ptx::mbarrier_wait(ptx::smem_addr(&s.prep_full[st]), phase);
  }
  ptx::wgmma_fence();
  // A state-only pass skips o's products (an empty group keeps the wait counts).
  if (writes_o(ctx, ch, cn)) {
    state_times<Element>(yacc, sfrag, ptx::smem_addr(&s.stage[st].q[0][0][0]));
  } else {
    ptx::wgmma_commit();
  }
}

// V^T in the accumulator layout (v-column x token) by ldmatrix.trans from the swizzled
// [token][v-column] tile: matrix m of step u is tokens 16 u + 8 (m >> 1) by v-columns
// 16 warp + 8 (m & 1), so pair (i, j) of the fragment (v-column frag_row + 8 i, tokens
// 8 j + frag_col + {0, 1}) is v_pairs[j / 2][i + 2 (j % 2)] (v_pair). Four instructions where
// 32 two-byte loads and their swizzle arithmetic sat on the chain.
template <typename Element>
__device__ __forceinline__ void load_v_transposed(const ChunkContext& ctx,
                                                  const ChainContext<Element>& ch,
                                                  const ChainChunk& k, uint32_t (&v_pairs)[4][4]) {
  using Tr = ChunkSm90Traits<Element>;
  auto& s = *reinterpret_cast<typename Tr::SharedStorage*>(smem_raw + smem_align_offset());
  const int m = ctx.lane / 8;
  // Token 16 u + t sits 2048 u bytes after token t (the swizzle reads its low three bits).
  const uint32_t v_row = ptx::smem_addr(&s.stage[k.st].v[ch.chain][0][0]) +
                         sw128_offset(8 * (m >> 1) + ctx.lane % 8, 16 * ctx.warp + 8 * (m & 1));
#pragma unroll
  for (int u = 0; u < 4; ++u) ptx::ldmatrix_x4_trans(v_pairs[u], v_row + 2048 * u);
}

// The two 16-bit V values of fragment pair (i, j) (load_v_transposed).
template <typename Element>
__device__ __forceinline__ const Element* v_pair(const uint32_t (&v_pairs)[4][4], int i, int j) {
  return reinterpret_cast<const Element*>(&v_pairs[j / 2][i + 2 * (j % 2)]);
}

// e^G of this thread's token pairs (8 j + frag_col + {0, 1}), read as pairs.
template <typename Element>
__device__ __forceinline__ void load_eg(float2 (&eg_pair)[8],
                                        const typename ChunkSm90Traits<Element>::Stage& S,
                                        const int& frag_col) {
#pragma unroll
  for (int j = 0; j < 8; ++j) eg_pair[j] = load_at<float2>(S.eg, 4 * (8 * j + frag_col));
}

// e^G Y^T and e^G_last S^T, in place; in the delta rule under V_new's product, where neither
// accumulator is in flight.
__device__ __forceinline__ void gate_y(float (&yacc)[32], const float2 (&eg_pair)[8]) {
#pragma unroll
  for (int i = 0; i < 32; ++i) ptx::fence_operand(yacc[i]);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      yacc[4 * j + 2 * i] *= eg_pair[j].x;
      yacc[4 * j + 2 * i + 1] *= eg_pair[j].y;
    }
  }
}

// e^G_last S^T, in place (see gate_y).
template <typename Element>
__device__ __forceinline__ void decay_state(float (&sacc)[64],
                                            const typename ChunkSm90Traits<Element>::Stage& S) {
  const float chunk_decay = S.eg[ChunkSm90Traits<Element>::kChunk - 1];
#pragma unroll
  for (int i = 0; i < 64; ++i) sacc[i] *= chunk_decay;
}

// Delta rule: V_new^T = (beta (V - e^G X))^T T^T, landed, with Y gated and S decayed under
// its product.
template <typename Element>
__device__ __forceinline__ void delta_v_new(const ChunkContext& ctx, const ChainChunk& k,
                                            const uint32_t (&v_pairs)[4][4], float (&xacc)[32],
                                            float (&yacc)[32], float (&sacc)[64],
                                            float (&vnew)[32]) {
  using Tr = ChunkSm90Traits<Element>;
  auto& s = *reinterpret_cast<typename Tr::SharedStorage*>(smem_raw + smem_align_offset());
  auto& S = s.stage[k.st];
  float2 eg_pair[8];  // e^G of this thread's token pairs
  // Y as well as X: with Y in flight, its A operand (S^T in 16 bits) would stay live beside
  // V_new's operands and accumulator, past 192 registers, and ptxas would serialize every
  // wgmma of the chain (C7512).
  ptx::wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < 32; ++i) ptx::fence_operand(xacc[i]);
  load_eg<Element>(eg_pair, S, ctx.frag_col);
  uint32_t xfrag[4][4];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float2 beta = load_at<float2>(S.beta, 4 * (8 * j + ctx.frag_col));
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const Element* v = v_pair<Element>(v_pairs, i, j);
      float x[2];
      x[0] = beta.x * (ptx::to_float(v[0]) - eg_pair[j].x * xacc[4 * j + 2 * i]);
      x[1] = beta.y * (ptx::to_float(v[1]) - eg_pair[j].y * xacc[4 * j + 2 * i + 1]);
      // A fragment of k-step j / 2: registers {rows r, r+8} x {cols 0-7, 8-15}.
      xfrag[j / 2][2 * (j % 2) + i] = ptx::pack2<Element>(x[0], x[1]);
    }
  }
  ptx::wgmma_fence();
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    const uint64_t db = ptx::smem_desc_sw128(ptx::smem_addr(&S.t[0][0]) + t * 32, 0, 1024);
    ptx::WgmmaRS<64, Element, 0>::run(vnew, xfrag[t], db, t != 0);
  }
  ptx::wgmma_commit();
  gate_y(yacc, eg_pair);  // Y landed with X
  decay_state<Element>(sacc, S);
  ptx::wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < 32; ++i) ptx::fence_operand(vnew[i]);
}

// GLA: V_new = V (zero past the chunk); then Y gated and S decayed once Y has landed.
template <typename Element>
__device__ __forceinline__ void gla_v_new(const ChunkContext& ctx, const ChainChunk& k,
                                          const uint32_t (&v_pairs)[4][4], float (&yacc)[32],
                                          float (&sacc)[64], float (&vnew)[32]) {
  using Tr = ChunkSm90Traits<Element>;
  auto& s = *reinterpret_cast<typename Tr::SharedStorage*>(smem_raw + smem_align_offset());
  auto& S = s.stage[k.st];
  float2 eg_pair[8];  // e^G of this thread's token pairs
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int cc = 0; cc < 2; ++cc) {
        const int token = 8 * j + ctx.frag_col + cc;
        vnew[4 * j + 2 * i + cc] =
            token < k.valid_rows ? ptx::to_float(v_pair<Element>(v_pairs, i, j)[cc]) : 0.f;
      }
    }
  }
  // (Before this wait, ptxas injects one: C7517.)
  ptx::wgmma_wait<0>();
  load_eg<Element>(eg_pair, S, ctx.frag_col);
  gate_y(yacc, eg_pair);
  decay_state<Element>(sacc, S);
}

// O^T = e^G Y^T + V_new^T P^T (where o is written);  S^T = e^G_last S^T + (w V_new)^T K.
// Landed.
template <typename Element>
__device__ __forceinline__ void update_o_and_state(const ChunkContext& ctx, const ChainChunk& k,
                                                   const float (&vnew)[32], float (&yacc)[32],
                                                   float (&sacc)[64]) {
  using Tr = ChunkSm90Traits<Element>;
  constexpr int kChunk = Tr::kChunk;
  auto& s = *reinterpret_cast<typename Tr::SharedStorage*>(smem_raw + smem_align_offset());
  auto& S = s.stage[k.st];
  uint32_t vfrag[4][4], wfrag[4][4];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float2 w_pair = load_at<float2>(S.w, 4 * (8 * j + ctx.frag_col));
    const float w[2] = {w_pair.x, w_pair.y};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int idx = 4 * j + 2 * i;
      vfrag[j / 2][2 * (j % 2) + i] = ptx::pack2<Element>(vnew[idx], vnew[idx + 1]);
      wfrag[j / 2][2 * (j % 2) + i] = ptx::pack2<Element>(vnew[idx] * w[0], vnew[idx + 1] * w[1]);
    }
  }
  ptx::wgmma_fence();
  if (k.write_o) {
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const uint64_t db = ptx::smem_desc_sw128(ptx::smem_addr(&S.p[0][0]) + t * 32, 0, 1024);
      ptx::WgmmaRS<64, Element, 0>::run(yacc, vfrag[t], db, 1);
    }
  }
  ptx::wgmma_commit();
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    // K as B (token x key dim) read MN-major: 16 tokens per k-step, the two key halves 8 KB apart.
    const uint64_t db = ptx::smem_desc_sw128(k.k_base + t * 16 * 128, kChunk * 128, 1024);
    ptx::WgmmaRS<128, Element, 1>::run(sacc, wfrag[t], db, 1);
  }
  ptx::wgmma_commit();
  ptx::wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < 32; ++i) ptx::fence_operand(yacc[i]);
#pragma unroll
  for (int i = 0; i < 64; ++i) ptx::fence_operand(sacc[i]);
}

// Chunk c of the walk: X, V_new, O and the next S, then O to HBM while the next Y runs.
template <typename Element, bool kDelta>
__device__ __forceinline__ void chain_chunk(const ChunkContext& ctx,
                                            const ChainContext<Element>& ch,
                                            const CUtensorMap& tmap_o, const int& c,
                                            float (&sacc)[64], uint32_t (&sfrag)[8][4],
                                            float (&xacc)[32], float (&yacc)[32]) {
  using Tr = ChunkSm90Traits<Element>;
  constexpr int kChunk = Tr::kChunk, kStages = Tr::kStages;
  auto& s = *reinterpret_cast<typename Tr::SharedStorage*>(smem_raw + smem_align_offset());
  const ChainChunk k{c,
                     writes_o(ctx, ch, c),
                     c % kStages,
                     static_cast<uint32_t>((c / kStages) & 1),
                     min(kChunk, ctx.len - c * kChunk),
                     ptx::smem_addr(&s.stage[c % kStages].k[0][0][0])};
  if constexpr (kDelta) {
    ptx::wgmma_fence();
    state_times<Element>(xacc, sfrag, k.k_base);  // q and k have landed (issue_y waited)
  }
  if (!ch.prep_rewrites_qk) ptx::mbarrier_wait(ptx::smem_addr(&s.prep_full[k.st]), k.phase);

  uint32_t v_pairs[4][4];
  load_v_transposed<Element>(ctx, ch, k, v_pairs);
  float vnew[32];  // V_new^T
  if constexpr (kDelta) {
    delta_v_new<Element>(ctx, k, v_pairs, xacc, yacc, sacc, vnew);
  } else {
    gla_v_new<Element>(ctx, k, v_pairs, yacc, sacc, vnew);
  }

  update_o_and_state<Element>(ctx, k, vnew, yacc, sacc);
  ptx::mbarrier_arrive(ptx::smem_addr(&s.empty[k.st]));  // last read of this stage

  pack_state<Element>(sfrag, sacc);
  uint32_t o_pack[8][2];  // yacc is the next chunk's accumulator from here on
  pack_o<Element>(ctx, yacc, o_pack);
  issue_y<Element>(ctx, ch, s, sfrag, yacc, min(c + 1, ctx.num_chunks - 1));

  store_o<Element>(ctx, ch, tmap_o, k, o_pack);
}

// After the walk: the repeated Y retired, the stores complete, S to the final state.
template <typename Element>
__device__ __forceinline__ void finish_chain(const ChunkContext& ctx,
                                             const ChainContext<Element>& ch,
                                             const float (&sacc)[64]) {
  ptx::wgmma_wait<0>();  // the last chunk's repeated Y (unused)
  if (ctx.tid == 0) ptx::bulk_wait_group<0>();  // the last stores complete before the CTA exits
  store_final_state(ctx, ch, sacc);
}

}  // namespace dsv4
