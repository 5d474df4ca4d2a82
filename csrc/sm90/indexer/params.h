// The lightning indexer's kernels (score.cuh, topk.cuh): plain parameters, no torch.
//
// A call is cut into work blocks of queries_per_block consecutive queries of one sequence
// (block g: sequence g / blocks_per_seq). The blocks run in chunks: chunk c holds blocks
// c, c + num_chunks, c + 2 num_chunks, ... (interleaved, so each chunk mixes early and late
// positions and its work stays even), and its scores live in one fp32 workspace of
// chunk_blocks * queries_per_block rows of row_stride floats, reused by every chunk.
#pragma once

#include <algorithm>
#include <cstdint>

namespace dsv4 {

// The scores' workspace (api.cpp's plan; the top-k harness plans with it too): one buffer where
// the whole call fits the budget, else two buffers of half, each holding a chunk of at most
// 65535 work blocks of block_bytes.
constexpr int64_t kIndexerWorkspaceBudget = int64_t(60) << 20;
struct IndexerChunks {
  int buffers, num_chunks, chunk_blocks;
};
inline IndexerChunks indexer_chunks(int64_t total_blocks, int64_t block_bytes) {
  IndexerChunks c;
  c.buffers = total_blocks * block_bytes <= kIndexerWorkspaceBudget ? 1 : 2;
  const int64_t fit = std::max<int64_t>(
      1, std::min<int64_t>(kIndexerWorkspaceBudget / c.buffers / block_bytes, 65535));
  c.num_chunks = static_cast<int>((total_blocks + fit - 1) / fit);
  c.buffers = std::min(c.buffers, c.num_chunks);
  c.chunk_blocks = static_cast<int>((total_blocks + c.num_chunks - 1) / c.num_chunks);
  return c;
}

constexpr int kIndexerMaxTopk = 2048;       // the top-k CTA's list (topk.cuh)
constexpr int kIndexerKeyCapacity = 32768;  // keys a top-k CTA stages: 128 KB
// Calls whose rows stage at most this many keys (32 KB) fit three top-k CTAs an SM by shared
// memory, and take the CTA bounded to registers for three (topk.cuh).
constexpr int kIndexerThreeCtaKeys = 8192;
// Rows at most this long, with topk at most kIndexerWarpTopkMax, take a warp per query (topk.cuh).
constexpr int kIndexerWarpTopkRows = 2048;
constexpr int kIndexerWarpTopkMax = 512;
constexpr int kIndexerTilesPerSplit = 32;   // 64-row key tiles per score CTA: 2048 rows
// A score CTA's consumer warpgroups, each with kIndexerColumns (query, head) columns: a block
// holds kIndexerConsumers * kIndexerColumns / H queries, and H is at most kIndexerColumns.
constexpr int kIndexerConsumers = 4;
constexpr int kIndexerColumns = 128;

// vLLM's paged FP8 indexer cache: block i at base + i block_stride holds kIndexerPageRows rows of
// 128 float8_e4m3 values (128 bytes each), then their fp32 scales; request b's page j is block
// block_table[b table_stride + j] (trusted, clamped into [0, num_blocks)).
constexpr int kIndexerPageRows = 64;  // a page is one 64-row key tile
struct IndexerPagedCache {
  const uint8_t* base;
  int64_t block_stride;  // bytes
  int num_blocks;
  const void* block_table;
  bool table_64;         // int64 entries (else int32)
  int64_t table_stride;  // entries per request
  int tiles_per_split;   // pages per score CTA (at most 32: one warp reads their block ids)
};

// Tensors are seen as (Bv, Sv, ...) views: dense calls have Bv = B sequences of Sv = Sq queries
// and Sc rows; varlen calls one view (Bv = 1) of T queries and total_c rows, in which sequence b
// starts at cu_seqlens_q[b] and cu_seqlens_k[b].
struct IndexerParams {
  const float* weights;       // (B, Sq, H) or (T, H) fp32, contiguous
  float weight_scale;         // |scale|, folded into the weights as they are loaded
  const void* positions;      // (B, Sq) or (T,) int32 / int64
  bool positions_64;
  int64_t pos_stride_b, pos_stride_s;  // elements
  const float* k_scale;       // (B, Sc) or (total_c,) fp32 row scales, or nullptr (all 1)
  int64_t k_scale_stride_b, k_scale_stride_s;
  float sign;                 // the scale's sign: ReLU(scale x) = |scale| ReLU(sign x)
  float* scores;              // the chunk's workspace
  int64_t row_stride;         // floats per workspace row: Sc rounded up to a key tile
  int32_t* out;               // (B, Sq, topk) or (T, topk) int32 contiguous
  const int* cu_seqlens_q;    // varlen: (B + 1,) int32, trusted (reads clamped into the
  const int* cu_seqlens_k;    // tensors); nullptr for dense calls
  const int* context_lens;    // dense: (B,) int32 rows per sequence (clamped to seq_c), or nullptr
  int total_q, total_c;       // varlen: T and total_c
  int seq_q, seq_c;           // dense: Sq and Sc; varlen: the longest sequences (max_seqlen_*)
  int heads, topk, compress_ratio;
  int head_levels;            // log2(heads / 8): the head sum's tree depth per query
  int queries_per_block;      // per score CTA (api.h's IndexerPlan)
  int blocks_per_seq, total_blocks, num_chunks, chunk_blocks;
  int chunk;                  // this launch's chunk
  int smem_keys;              // keys a top-k CTA stages in shared memory
  IndexerPagedCache paged;    // dsv4_indexer_topk_paged's cache (paged_score.cuh)
};

}  // namespace dsv4
