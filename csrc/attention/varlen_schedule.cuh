// Builds a varlen call's work schedule (csrc/attention/varlen_schedule.h) in one CTA on the
// device: the clamped sequences, then every (sequence, query tile) ordered by the key tiles it
// sees, most first. Sorting by cost is the longest-processing-time rule: with one CTA per work
// tile launched in order, the long tails of long sequences start first instead of last.
// A counting sort into cost buckets orders the tiles; ties land in atomic order, which moves
// no result (each tile is computed alone).
#pragma once

#include "attention/key_range.cuh"
#include "attention/varlen_schedule.h"
#include "attention/varlen_device.cuh"

namespace dsv4 {

__global__ void __launch_bounds__(kVarlenScheduleThreads, 1)
    varlen_schedule_kernel(const VarlenScheduleParams p) {
  using namespace varlen_detail;
  static_assert(kVarlenScheduleThreads == 32 * 32, "block_exclusive_scan: 32 warps");
  __shared__ int bucket_next[kVarlenCostBuckets];  // tile count, then next free slot
  __shared__ int warp_sums[32];
  const int tid = threadIdx.x;
  for (int i = tid; i < kVarlenCostBuckets; i += kVarlenScheduleThreads) bucket_next[i] = 0;

  // 1. Sequences clamped into the tensors, and each one's first tile.
  int num_tiles = 0;
  for (int base = 0; base < p.batch; base += kVarlenScheduleThreads) {
    const int b = base + tid;
    int tiles = 0;
    if (b < p.batch) {
      const int q0 = clamp_row(p.cu_seqlens_q[b], 0, p.total_q);
      const int q1 = clamp_row(p.cu_seqlens_q[b + 1], q0, p.total_q);
      const int k0 = clamp_row(p.cu_seqlens_k[b], 0, p.total_k);
      const int k1 = clamp_row(p.cu_seqlens_k[b + 1], k0, p.total_k);
      p.sequences[b] = {q0, q1 - q0, k0, k1 - k0};
      if (p.cu_seqlens_c != nullptr) {
        const int c0 = clamp_row(p.cu_seqlens_c[b], 0, p.total_c);
        p.rows_c[b] = {c0, clamp_row(p.cu_seqlens_c[b + 1], c0, p.total_c) - c0};
      }
      tiles = (q1 - q0 + p.tokens_per_tile - 1) / p.tokens_per_tile;
    }
    int chunk_tiles;
    const int before = block_exclusive_scan(tiles, chunk_tiles, warp_sums);
    if (b < p.batch) p.tile_start[b] = num_tiles + before;
    num_tiles += chunk_tiles;
  }
  const int n = min(num_tiles, p.capacity);  // more only with cu_seqlens past their bounds
  __syncthreads();  // sequences and tile_start, written above, are read by other threads

  auto cost_bucket = [&](int i, int& b, int& m_block) {
    b = sequence_of(p.tile_start, p.batch, i);
    m_block = i - p.tile_start[b];
    const VarlenSequence s = p.sequences[b];
    const KeyShape shape{s.seqlen_q, s.seqlen_k, p.causal, p.window_left};
    const KeyTiles t =
        visible_key_tiles(shape, m_block * p.tokens_per_tile, p.tokens_per_tile, p.keys_per_tile);
    return min(t.end - t.first, kVarlenCostBuckets - 1);
  };

  // 2. Tiles per cost bucket.
  for (int i = tid; i < n; i += kVarlenScheduleThreads) {
    int b, m_block;
    atomicAdd(&bucket_next[cost_bucket(i, b, m_block)], 1);
  }
  __syncthreads();

  // 3. Each bucket's first slot, the costliest bucket first.
  buckets_to_first_slots(bucket_next, warp_sums);
  __syncthreads();

  // 4. Place every tile, and mark the unused slots.
  for (int i = tid; i < n; i += kVarlenScheduleThreads) {
    int b, m_block;
    const int slot = atomicAdd(&bucket_next[cost_bucket(i, b, m_block)], 1);
    p.tiles[slot] = {b, m_block};
  }
  for (int i = n + tid; i < p.capacity; i += kVarlenScheduleThreads) p.tiles[i] = {-1, 0};
}

// Builds a VarlenSequencePlanParams plan in one CTA: the sequences, the prefix sum of their
// chunk counts, and a counting sort of the sequences by chunk count, most first (empty ones
// last; ties in atomic order, which moves no result: each sequence is computed alone).
__global__ void __launch_bounds__(kVarlenScheduleThreads, 1)
    varlen_sequence_plan_kernel(const VarlenSequencePlanParams p) {
  using namespace varlen_detail;
  __shared__ int bucket_next[kVarlenCostBuckets];  // sequence count, then next free slot
  __shared__ int warp_sums[32];
  const int tid = threadIdx.x;
  for (int i = tid; i < kVarlenCostBuckets; i += kVarlenScheduleThreads) bucket_next[i] = 0;
  __syncthreads();

  int num_chunks = 0;
  for (int base = 0; base < p.batch; base += kVarlenScheduleThreads) {
    const int b = base + tid;
    int chunks = 0;
    if (b < p.batch) {
      const int s0 = clamp_row(p.cu_seqlens[b], 0, p.total);
      const int s1 = clamp_row(p.cu_seqlens[b + 1], s0, p.total);
      p.sequences[b] = {s0, s1 - s0};
      chunks = (s1 - s0 + p.chunk - 1) / p.chunk;
      atomicAdd(&bucket_next[min(chunks, kVarlenCostBuckets - 1)], 1);
    }
    int step_chunks;
    const int before = block_exclusive_scan(chunks, step_chunks, warp_sums);
    if (b < p.batch) p.chunk_start[b] = num_chunks + before;
    num_chunks += step_chunks;
  }
  if (tid == 0) p.chunk_start[p.batch] = num_chunks;
  __syncthreads();  // the bucket counts

  buckets_to_first_slots(bucket_next, warp_sums);  // the most chunks first
  __syncthreads();
  for (int b = tid; b < p.batch; b += kVarlenScheduleThreads) {
    const int chunks = (p.sequences[b].len + p.chunk - 1) / p.chunk;  // this thread wrote it
    p.order[atomicAdd(&bucket_next[min(chunks, kVarlenCostBuckets - 1)], 1)] = b;
  }
}

}  // namespace dsv4
