// Where a chunk's work block and workspace row sit in the call (params.h's chunking), shared by
// the score and top-k kernels.
#pragma once

#include <cstdint>

#include "sm90/indexer/params.h"

namespace dsv4 {

// A work block: queries [first_query, first_query + queries_per_block) of one sequence, and
// where that sequence sits in the (Bv, Sv, ...) views (params.h).
struct IndexerBlock {
  int batch;         // the view's batch coordinate: the sequence (dense) or 0 (varlen)
  int first_query;   // within the sequence
  int seq_q, seq_c;  // the sequence's queries and closed-row bound (varlen: clamped)
  int q0, k0;        // the sequence's first query and first row along Sv (0 when dense)
  int64_t token0;    // its first query's row in weights and out
};

// The chunk's local block `local`; false past the call or past its sequence's queries.
__device__ __forceinline__ bool indexer_block(const IndexerParams& p, int local,
                                              IndexerBlock& blk) {
  const int g = p.chunk + local * p.num_chunks;
  if (local >= p.chunk_blocks || g >= p.total_blocks) return false;
  const int seq = g / p.blocks_per_seq;
  blk.first_query = (g % p.blocks_per_seq) * p.queries_per_block;
  if (p.cu_seqlens_q == nullptr) {
    blk.batch = seq;
    blk.seq_q = p.seq_q;
    blk.seq_c = p.context_lens == nullptr ? p.seq_c : min(max(p.context_lens[seq], 0), p.seq_c);
    blk.q0 = blk.k0 = 0;
    blk.token0 = static_cast<int64_t>(seq) * p.seq_q;
    return true;
  }
  // Trusted contents, clamped so that bad ones give wrong rows, never a stray access; a
  // sequence longer than max_seqlen_* keeps its first max_seqlen_* queries and rows.
  const int q_start = min(max(p.cu_seqlens_q[seq], 0), p.total_q);
  const int q_end = min(max(p.cu_seqlens_q[seq + 1], q_start), p.total_q);
  const int k_start = min(max(p.cu_seqlens_k[seq], 0), p.total_c);
  const int k_end = min(max(p.cu_seqlens_k[seq + 1], k_start), p.total_c);
  blk.batch = 0;
  blk.seq_q = min(q_end - q_start, p.seq_q);
  blk.seq_c = min(k_end - k_start, p.seq_c);
  blk.q0 = blk.token0 = q_start;
  blk.k0 = k_start;
  return blk.first_query < blk.seq_q;
}

// The absolute position of query s of the block's sequence.
__device__ __forceinline__ int64_t indexer_position(const IndexerParams& p,
                                                   const IndexerBlock& blk, int s) {
  const int64_t at = blk.batch * p.pos_stride_b + (blk.q0 + s) * p.pos_stride_s;
  return p.positions_64 ? static_cast<const int64_t*>(p.positions)[at]
                        : static_cast<const int32_t*>(p.positions)[at];
}

// The closed rows of a query at position `pos`: min(Sc, floor((pos + 1) / r)), at least 0.
__device__ __forceinline__ int indexer_visible_rows(int64_t pos, int compress_ratio, int seq_c) {
  const int64_t closed = pos + 1 < 0 ? 0 : (pos + 1) / compress_ratio;
  return static_cast<int>(closed < seq_c ? closed : seq_c);
}

// The most closed rows of any query of the block, for every lane of the calling warp.
__device__ __forceinline__ int indexer_block_visible(const IndexerParams& p,
                                                     const IndexerBlock& blk, int lane) {
  int visible = 0;
  for (int i = lane; i < p.queries_per_block; i += 32) {
    const int q = blk.first_query + i;
    if (q < blk.seq_q) {
      visible = max(visible, indexer_visible_rows(indexer_position(p, blk, q), p.compress_ratio,
                                                  blk.seq_c));
    }
  }
  return __reduce_max_sync(0xffffffffu, visible);
}

}  // namespace dsv4
