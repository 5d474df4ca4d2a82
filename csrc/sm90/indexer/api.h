// The lightning indexer's sm90 kernels (score.cuh, topk.cuh), as the op unit calls them: the
// route (the kernels and their chunking, or why not) and the launch.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>

#include "sm90/indexer/params.h"
#include "sm90/shared/plan.h"

namespace dsv4 {

// A validated call (csrc/ops/indexer.cpp): dense q (B, Sq, H, D), k (B, Sc, D), weights
// (B, Sq, H), positions (B, Sq); varlen q (T, H, D), k (total_c, D) with cu_seqlens.
struct IndexerProblem {
  at::Tensor q, k, weights, positions;
  std::optional<at::Tensor> k_scale;
  std::optional<at::Tensor> cu_seqlens_q, cu_seqlens_k;  // int32 copies
  int64_t max_seqlen_q = 0, max_seqlen_k = 0;            // varlen: the longest sequences
  int64_t topk = 0, compress_ratio = 1;
  double scale = 0.0;
  bool varlen = false;
};

// dsv4_indexer_topk_paged's validated call (csrc/ops/indexer.cpp): q (B, N, H, 128), vLLM's paged
// FP8 indexer cache k_cache (num_blocks, P, 1, 132) uint8, weights (B, N, H), positions (B, N),
// block_table (B, max_blocks), context_lens (B,).
struct IndexerPagedProblem {
  at::Tensor q, k_cache, weights, positions, block_table, context_lens;
  int64_t topk = 0, compress_ratio = 1;
  double scale = 0.0;
};

struct IndexerPlan {
  // Per score CTA: kIndexerConsumers of kIndexerColumns / H queries (dense); columns / H that all
  // its consumers share (paged).
  int queries_per_block = 0;
  int columns = kIndexerColumns;  // the paged form's (query, head) columns: 64 or 128
  int blocks_per_seq = 0, total_blocks = 0;
  int chunk_blocks = 0, num_chunks = 0;
  // Chunk c's scores live in buffer c % buffers: with two, the buffers' chunks run on two
  // streams (launch.cu).
  int buffers = 1;
  int splits = 0;          // key splits of a block in the score grid
  int tiles_per_split = 0;  // the paged form's pages per score CTA (the dense form's is fixed)
  int64_t row_stride = 0;  // floats per workspace row
  int smem_keys = 0;       // keys a top-k CTA stages in shared memory
  bool warp_topk = false;  // short rows: the top-k takes a warp per query (topk.cuh)
  int64_t buffer_floats() const { return int64_t(chunk_blocks) * queries_per_block * row_stride; }
  int64_t workspace_bytes() const { return buffers * buffer_floats() * 4; }
};

Route<IndexerPlan> route_indexer(const IndexerProblem& problem, const DeviceFacts& device,
                                 const Overrides& overrides);
Route<IndexerPlan> route_indexer_paged(const IndexerPagedProblem& problem,
                                       const DeviceFacts& device, const Overrides& overrides);
std::string describe(const IndexerPlan& plan);

// Queues the kernels chunk by chunk on the current stream and, with two buffers, the second
// buffer's chunks on a side stream that the current stream waits for at the end.
// out (B, Sq, topk) or (T, topk) int32 contiguous.
void run_indexer(const IndexerProblem& problem, const IndexerPlan& plan, at::Tensor& out);
// out (B, N, topk) int32 contiguous.
void run_indexer_paged(const IndexerPagedProblem& problem, const IndexerPlan& plan,
                       at::Tensor& out);

}  // namespace dsv4
