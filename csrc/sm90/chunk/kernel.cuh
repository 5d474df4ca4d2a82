// sm90a forward of chunk_gated_delta_rule and chunk_simple_gla (K = V = 128, 64-token chunks):
// the kernel's shell. Its tiles, barriers and register split: traits.h.
//
// One CTA owns one (sequence or segment of one, v-head) and walks its chunks in order; each of
// its two chain warpgroups keeps half of the state S (128 x 64 of 128 x 128, fp32) in registers
// the whole way, and one prep warpgroup serves both. The only intermediate in HBM is the delta
// rule's per-chunk T_u, from the parallel inverse kernel (every chunk's, or with kFused the odd
// chunks' only: the prep solves the even ones itself).
// Roles (128 threads per warpgroup), each a loop here over the walk's chunks:
//   warpgroup 0, warp 0  producer (producer.cuh): TMA loads of q, k, v and the delta rule's
//                        T_u; cp.async of g and beta
//   warpgroup 1          prep (prep.cuh): everything that does not depend on S, up to two
//                        chunks ahead: G, P, the delta rule's T; the l2norm of q and k; with
//                        kFused the even chunks' T_u
//   warpgroups 2, 3      chains (chain.cuh, chain_io.cuh), v-columns 0-63 and 64-127:
//                        everything that depends on S (the serial part); o's stores
// What a loop carries from chunk to chunk (the prep's P accumulator, the chains' S, its 16-bit
// copy and the X and Y accumulators) is declared here, in the kernel, as in the one-body kernel
// this was cut from: declared in a role function, the same code reaches ptxas with its
// registers in another order, and the SASS differs.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "sm90/chunk/chain.cuh"
#include "sm90/chunk/params.h"
#include "sm90/chunk/prep.cuh"
#include "sm90/chunk/producer.cuh"
#include "sm90/chunk/segments.cuh"
#include "sm90/chunk/traits.h"
#include "ptx/mbarrier.cuh"
#include "ptx/sync.cuh"

namespace dsv4 {

// kFused (delta rule only): the prep solves the ungated inverse of every even chunk itself (K K^T
// by wgmma, invert_unit_lower_64 over its four warps) and loads the inverse kernel's T_u only
// for the odd ones. Where HBM sets the pace (a grid of more than one wave), this halves the
// inverse kernel's bytes (its read of k, T_u's round trip) while the prep, ~4,000 cycles longer
// on a solved chunk, stays within the period on average: solving every chunk made the prep the
// limit (measured: no faster than the split form).
template <typename Element, bool kDelta, bool kFused = false>
__global__ void __launch_bounds__(ChunkSm90Traits<Element>::kThreads, 1)
    chunk_sm90_kernel(const __grid_constant__ CUtensorMap tmap_q,
                      const __grid_constant__ CUtensorMap tmap_k,
                      const __grid_constant__ CUtensorMap tmap_v,
                      const __grid_constant__ CUtensorMap tmap_o, const ChunkSm90Params p) {
  using Tr = ChunkSm90Traits<Element>;
  constexpr int kChunk = Tr::kChunk, kStages = Tr::kStages;

  auto& s = *reinterpret_cast<typename Tr::SharedStorage*>(smem_raw + smem_align_offset());

  // This CTA's (work item n: a sequence or a segment, v-head hv). Varlen sequences go in the
  // plan's order, the longest first.
  // Launched programmatically behind the op's previous kernel (launch_kernel): nothing it
  // writes is read before this wait. The next kernel, the op's as well, may then be queued.
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();

  // The delta rule's two state-only passes share one launch: the grid's second half walks the
  // state maps (S = I, v taken as zeros) into p.state_maps.
  const bool state_map = p.state_maps != nullptr && blockIdx.x >= gridDim.x / 2;
  float* const final_state = state_map ? p.state_maps : p.final_state;
  const int work = state_map ? blockIdx.x - gridDim.x / 2 : blockIdx.x;
  const int hv = work % p.heads_v;
  int n = work / p.heads_v;
  int len, tma_row0, tma_batch;
  int64_t row_base;  // row of the sequence's first token in the (B * T) token rows
  if (p.sequences != nullptr) {
    n = p.order[n];
    const VarlenRows seq = p.sequences[n];
    len = seq.len;
    tma_row0 = seq.start;
    tma_batch = 0;
    row_base = seq.start;
  } else {  // sequence b, or its segment k when the call is cut into segments
    const int b = n / p.walked_segments, k = n % p.walked_segments;
    n = b * p.segments + k;
    tma_row0 = k * p.segment_len;
    len = min(p.segment_len, p.seqlen - tma_row0);
    tma_batch = b;
    row_base = static_cast<int64_t>(b) * p.seqlen + tma_row0;
  }
  // Segment split: a state-only pass skips heads that start from warm-ups; the last pass walks
  // `warm` chunks before the sequence from S = 0 and writes o only from the sequence's start.
  int warm = 0;
  if (p.warmup != nullptr) {
    // A state-only pass reads every segment's entry (segment_exact); the last pass its own,
    // which the combine set to -1 in an exact head.
    int plan;
    if (p.o != nullptr) {
      plan = p.warmup[static_cast<int64_t>(n) * p.heads_v + hv];
    } else {
      plan = segment_exact(p.warmup, n / p.segments, p.segments, p.heads_v, hv) ? -1 : 0;
    }
    if (p.o == nullptr && plan >= 0) return;  // whole CTA, before any barrier
    warm = max(plan, 0);
    len += warm * kChunk;
    tma_row0 -= warm * kChunk;
    row_base -= warm * kChunk;
  }
  const int num_chunks = (len + kChunk - 1) / kChunk;
  const int head_qk = hv / p.group;

  if (threadIdx.x == 0) init_chunk_barriers<Element>();
  if (state_map) {  // v is never loaded: its tiles stay zero
    for (int i = threadIdx.x; i < kStages * int(sizeof(s.stage[0].v) / 16);
         i += Tr::kThreads) {
      reinterpret_cast<uint4*>(&s.stage[i % kStages].v[0][0][0])[i / kStages] =
          make_uint4(0, 0, 0, 0);
    }
  }
  __syncthreads();

  const int warpgroup = threadIdx.x / 128;
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  // The fragment's row and column are set below, where the one-body kernel computed them.
  ChunkContext ctx{p,         state_map, final_state, hv,         n,       len, tma_row0,
                   tma_batch, row_base,  warm,        num_chunks, head_qk, tid, warp, lane};

  if (warpgroup == 0) {  // producer: one warp
    ptx::setmaxnreg_dec<Tr::kProducerRegs>();
    if (warp != 0) return;
    const Element* t_u_chunk = nullptr;  // the delta rule's T_u slot of the chunk to load
    start_producer<Element, kDelta>(ctx, tmap_q, tmap_k, tmap_v, t_u_chunk);
    for (int c = 0; c < num_chunks; ++c) {
      load_chunk<Element, kDelta, kFused>(ctx, c, tmap_q, tmap_k, tmap_v, t_u_chunk);
    }
    return;
  }
  ctx.frag_row = warp * 16 + lane / 4;
  ctx.frag_col = 2 * (lane % 4);
  if (warpgroup == 1) {  // prep
    ptx::setmaxnreg_dec<Tr::kPrepRegs>();
    for (int c = 0; c < num_chunks; ++c) {
      float pacc[32];  // P (token x token)
      prep_chunk<Element, kDelta, kFused>(ctx, c, pacc);
    }
    return;
  }

  // chains
  ptx::setmaxnreg_inc<Tr::kChainRegs>();
  // This chain's v-columns; broadcast from lane 0, which ptxas treats as warp-uniform.
  const int chain = __shfl_sync(0xffffffff, warpgroup - 2, 0);
  const ChainContext<Element> ch{chain,
                                 chain * Tr::kBlockV,
                                 static_cast<uint32_t>(ChunkBarrier::kChain) + chain,
                                 (static_cast<int64_t>(n) * p.heads_v + hv) * 128 * 128,
                                 static_cast<Element*>(p.o),
                                 kDelta && p.qk_l2norm};
  float sacc[64];            // S^T, fp32
  uint32_t sfrag[8][4];      // S^T in 16 bits, the A operand of X and Y
  float xacc[32], yacc[32];  // X^T, Y^T (v-column x token)
  load_start_state(ctx, ch, sacc);
  pack_state<Element>(sfrag, sacc);
  issue_y<Element>(ctx, ch, s, sfrag, yacc, 0);
  for (int c = 0; c < num_chunks; ++c) {
    chain_chunk<Element, kDelta>(ctx, ch, tmap_o, c, sacc, sfrag, xacc, yacc);
  }
  finish_chain(ctx, ch, sacc);
}

}  // namespace dsv4
