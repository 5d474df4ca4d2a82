// Where a chunk's work block and workspace row sit in the call (params.h's chunking), shared by
// the score and top-k kernels.
#pragma once

#include <cstdint>

#include "sm90/indexer/params.h"

namespace dsv4 {

// The chunk's local block `local` as a sequence and its first query; false past the call.
struct IndexerBlock {
  int batch, first_query;
};
__device__ __forceinline__ bool indexer_block(const IndexerParams& p, int local,
                                              IndexerBlock& blk) {
  const int g = p.chunk + local * p.num_chunks;
  if (local >= p.chunk_blocks || g >= p.total_blocks) return false;
  blk.batch = g / p.blocks_per_seq;
  blk.first_query = (g % p.blocks_per_seq) * p.queries_per_block;
  return true;
}

__device__ __forceinline__ int64_t indexer_position(const IndexerParams& p, int b, int s) {
  const int64_t at = b * p.pos_stride_b + s * p.pos_stride_s;
  return p.positions_64 ? static_cast<const int64_t*>(p.positions)[at]
                        : static_cast<const int32_t*>(p.positions)[at];
}

// The closed rows of a query at position `pos`: min(Sc, floor((pos + 1) / r)), at least 0.
__device__ __forceinline__ int indexer_visible_rows(int64_t pos, int compress_ratio, int seq_c) {
  const int64_t closed = pos + 1 < 0 ? 0 : (pos + 1) / compress_ratio;
  return static_cast<int>(closed < seq_c ? closed : seq_c);
}

}  // namespace dsv4
