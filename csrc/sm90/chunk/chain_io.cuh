// The chain warpgroups' contexts (chain.cuh) and their traffic with HBM: S in at the walk's
// start and out at its end, O out per chunk.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "sm90/chunk/tiles.cuh"
#include "sm90/chunk/traits.h"
#include "ptx/math.cuh"
#include "ptx/mma_sync.cuh"
#include "ptx/sync.cuh"
#include "ptx/tma.cuh"

namespace dsv4 {

// What a chain thread reads besides ChunkContext (by reference, as ChunkContext).
template <typename Element>
struct ChainContext {
  int chain, v0;         // this chain, and its first v-column (chain * kBlockV)
  uint32_t barrier;      // its named barrier: ChunkBarrier::kChain + chain
  int64_t state_offset;  // the work item's state in a [work items][HV][128][128] tensor
  Element* out;          // o, or nullptr (a state-only pass)
  // X and Y read only the loaded q and k, so they wait for the prep only when it normalizes
  // q and k in place.
  bool prep_rewrites_qk;
};

// One chunk of a chain's walk: what its steps read besides the contexts.
struct ChainChunk {
  int c;
  bool write_o;
  int st;
  uint32_t phase;
  int valid_rows;   // tokens of the chunk in the walk
  uint32_t k_base;  // the stage's k tile
};

// S^T (64 v-columns x 128 key dims): sacc[4j + 2i + c] = S[key 8j + frag_col + c][v0 + row],
// at the walk's start: I for a state map; otherwise zeros after warm-ups, and without them a
// later segment of a head from the combine's state, a sequence or its first segment from the
// call's initial state (zeros where there is none).
template <typename Element>
__device__ __forceinline__ void load_start_state(const ChunkContext& ctx,
                                                 const ChainContext<Element>& ch,
                                                 float (&sacc)[64]) {
  const ChunkSm90Params& p = ctx.p;
  const bool later_segment = p.segment_start != nullptr && ctx.n % p.segments != 0;
  const float* start_state = later_segment ? p.segment_start : p.initial_state;
  const int64_t start_offset =
      later_segment ? ch.state_offset
                    : (static_cast<int64_t>(ctx.n / p.segments) * p.heads_v + ctx.hv) * 128 * 128;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int cc = 0; cc < 2; ++cc) {
        const int key = 8 * j + ctx.frag_col + cc, col = ch.v0 + ctx.frag_row + 8 * i;
        if (ctx.state_map) {
          sacc[4 * j + 2 * i + cc] = key == col ? 1.f : 0.f;
        } else {
          sacc[4 * j + 2 * i + cc] = start_state != nullptr && ctx.warm == 0
                                         ? start_state[start_offset + key * 128 + col]
                                         : 0.f;
        }
      }
    }
  }
}

// No o: a state-only pass or a warm-up chunk (intra-sequence split).
template <typename Element>
__device__ __forceinline__ bool writes_o(const ChunkContext& ctx, const ChainContext<Element>& ch,
                                         int c) {
  return ch.out != nullptr && c >= ctx.warm;
}

// O^T * scale in 16 bits: o_pack[j][i] is the pair at rows 8 i, columns 8 j + frag_col, of this
// thread's fragment.
template <typename Element>
__device__ __forceinline__ void pack_o(const ChunkContext& ctx, const float (&yacc)[32],
                                       uint32_t (&o_pack)[8][2]) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      o_pack[j][i] = ptx::pack2<Element>(yacc[4 * j + 2 * i] * ctx.p.scale,
                                         yacc[4 * j + 2 * i + 1] * ctx.p.scale);
    }
  }
}

// The chunk's O^T through this chain's staging tile to HBM; every chain thread enters.
template <typename Element>
__device__ __forceinline__ void store_o(const ChunkContext& ctx, const ChainContext<Element>& ch,
                                        const CUtensorMap& tmap_o, const ChainChunk& k,
                                        const uint32_t (&o_pack)[8][2]) {
  using Tr = ChunkSm90Traits<Element>;
  constexpr int kChunk = Tr::kChunk;
  auto& s = *reinterpret_cast<typename Tr::SharedStorage*>(smem_raw + smem_align_offset());
  Element* stage_o = &s.o_stage[ch.chain][0][0];
  if (k.write_o) {
    // Chunk c - 1's TMA store has read the tile (a partial chunk's readers are the walk's
    // last, so none is left).
    if (ctx.tid == 0) ptx::bulk_wait_group_read<0>();
    ptx::named_barrier_sync(ch.barrier, 128);
    // O^T's 8 x 8 blocks, transposed by stmatrix into the [token][v-column] tile. Matrix m of
    // step j: v-columns 8 (m & 1) of this warp's 16, tokens 8 (j + (m >> 1)); lane 8 m + k
    // addresses its token row k. Token 8 j + t sits 1024 j bytes after token t (the swizzle
    // reads only the token's low three bits), so one address serves every step.
    const int m = ctx.lane / 8;
    const uint32_t o_row = ptx::smem_addr(stage_o) +
                           sw128_offset(8 * (m >> 1) + ctx.lane % 8, 16 * ctx.warp + 8 * (m & 1));
#pragma unroll
    for (int j = 0; j < 8; j += 2) {
      ptx::stmatrix_x4_trans(o_row + 1024 * j,
                             {o_pack[j][0], o_pack[j][1], o_pack[j + 1][0], o_pack[j + 1][1]});
    }
    ptx::fence_proxy_async_smem();  // read by the TMA store
  }
  ptx::named_barrier_sync(ch.barrier, 128);  // o_stage written
  if (k.write_o && k.valid_rows == kChunk) {
    // Off the chain: the TMA unit drains the tile while the next chunk's products run.
    if (ctx.tid == 0) {
      ptx::tma_store_4d(&tmap_o, ptx::smem_addr(stage_o), ch.v0, ctx.tma_row0 + k.c * kChunk,
                        ctx.hv, ctx.tma_batch);
      ptx::bulk_commit_group();
    }
  } else if (k.write_o) {
    // A partial chunk: only its own rows (a box would also write the next sequence's).
    // 64 tokens x 128 bytes, 16 bytes per thread per step.
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int idx = ctx.tid + 128 * u, token = idx / 8, part = idx % 8;
      if (token < k.valid_rows) {
        const uint4 val = load_at<uint4>(stage_o, token * 128 + (((part ^ token) & 7) << 4));
        const int64_t row = ctx.row_base + k.c * kChunk + token;
        *reinterpret_cast<uint4*>(ch.out + (row * ctx.p.heads_v + ctx.hv) * 128 + ch.v0 +
                                  part * 8) = val;
      }
    }
  }
}

// S at the walk's end into the final state, where one is asked for (with the segment split's
// last pass, by each sequence's last segment only, at its sequence's index).
template <typename Element>
__device__ __forceinline__ void store_final_state(const ChunkContext& ctx,
                                                  const ChainContext<Element>& ch,
                                                  const float (&sacc)[64]) {
  const ChunkSm90Params& p = ctx.p;
  if (ctx.final_state != nullptr &&
      (!p.final_per_sequence || ctx.n % p.segments == p.segments - 1)) {
    const int64_t final_offset =
        p.final_per_sequence
            ? (static_cast<int64_t>(ctx.n / p.segments) * p.heads_v + ctx.hv) * 128 * 128
            : ch.state_offset;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
#pragma unroll
        for (int cc = 0; cc < 2; ++cc) {
          const int key = 8 * j + ctx.frag_col + cc, col = ch.v0 + ctx.frag_row + 8 * i;
          ctx.final_state[final_offset + key * 128 + col] = sacc[4 * j + 2 * i + cc];
        }
      }
    }
  }
}

}  // namespace dsv4
