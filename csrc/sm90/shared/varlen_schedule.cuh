// Builds a varlen call's work schedule (csrc/sm90/shared/varlen_schedule.h) in one CTA on the
// device: the clamped sequences, then every query tile of every sequence once per section of
// query heads. The sequences go the costliest first (by the key tiles their last query tile
// sees: under a causal mask, their costliest tile), so the long tails of long sequences start
// first and the cheap tiles of short ones end the call. Within a sequence come its head
// sections, and within a section the last query tile first; a tile's heads are consecutive work
// tiles. So the CTAs running at the same time work on one sequence's K/V, which stays in L2
// (ordering all tiles by cost alone had them reading a dozen sequences' K/V at once from HBM).
// Ties between sequences land in atomic order, which moves no result (each tile is computed
// alone).
#pragma once

#include "sm90/shared/key_range.cuh"
#include "sm90/shared/varlen_schedule.h"
#include "sm90/shared/varlen_device.cuh"

namespace dsv4 {

__global__ void __launch_bounds__(kVarlenScheduleThreads, 1)
    varlen_schedule_kernel(const VarlenScheduleParams p) {
  using namespace varlen_detail;
  static_assert(kVarlenScheduleThreads == 32 * 32, "block_exclusive_scan: 32 warps");
  __shared__ int bucket_next[kVarlenCostBuckets];
  __shared__ int warp_sums[32];
  const int tid = threadIdx.x;
  auto query_tiles = [&](const VarlenSequence& s) {
    return (s.seqlen_q + p.tokens_per_tile - 1) / p.tokens_per_tile;
  };

  // 1. Sequences clamped into the tensors.
  for (int b = tid; b < p.batch; b += kVarlenScheduleThreads) {
    const int q0 = clamp_row(p.cu_seqlens_q[b], 0, p.total_q);
    const int q1 = clamp_row(p.cu_seqlens_q[b + 1], q0, p.total_q);
    const int k0 = clamp_row(p.cu_seqlens_k[b], 0, p.total_k);
    const int k1 = clamp_row(p.cu_seqlens_k[b + 1], k0, p.total_k);
    p.sequences[b] = {q0, q1 - q0, k0, k1 - k0};
    if (p.cu_seqlens_c != nullptr) {
      const int c0 = clamp_row(p.cu_seqlens_c[b], 0, p.total_c);
      p.rows_c[b] = {c0, clamp_row(p.cu_seqlens_c[b + 1], c0, p.total_c) - c0};
    }
  }
  __syncthreads();  // each sequence is read by other threads below

  // 2. The sequences, the costliest first.
  sort_most_first(
      p.batch,
      [&](int b) {
        const VarlenSequence s = p.sequences[b];
        const int last = query_tiles(s) - 1;
        if (last < 0) return 0;
        const KeyShape shape{s.seqlen_q, s.seqlen_k, p.causal, p.window_left};
        const KeyTiles t = visible_key_tiles(shape, last * p.tokens_per_tile, p.tokens_per_tile,
                                             p.keys_per_tile);
        return t.end - t.first;
      },
      bucket_next, warp_sums, p.order);

  // 3. Each sequence's first query tile in that order.
  int num_tiles = 0;
  for (int base = 0; base < p.batch; base += kVarlenScheduleThreads) {
    const int i = base + tid;
    const int tiles = i < p.batch ? query_tiles(p.sequences[p.order[i]]) : 0;
    int chunk_tiles;
    const int before = block_exclusive_scan(tiles, chunk_tiles, warp_sums);
    if (i < p.batch) p.sorted_start[i] = num_tiles + before;
    num_tiles += chunk_tiles;
  }
  const int n = min(num_tiles, p.capacity);  // more only with cu_seqlens past their bounds
  __syncthreads();  // sorted_start is read by other threads below

  // 4. Every (query tile, head section): sequence i's entries are [sorted_start[i] * sections,
  // (sorted_start[i] + tiles) * sections), section-major, the last query tile first. Then the
  // unused slots.
  const int sections = p.head_sections;
  for (int e = tid; e < n * sections; e += kVarlenScheduleThreads) {
    const int i = sequence_of(p.sorted_start, p.batch, e / sections);
    const int b = p.order[i];
    const int tiles = query_tiles(p.sequences[b]);
    const int local = e - p.sorted_start[i] * sections;
    const int section = local / tiles;
    p.tiles[e] = {b, tiles - 1 - (local - section * tiles), section * p.heads_per_section};
  }
  for (int e = n * sections + tid; e < p.capacity * sections; e += kVarlenScheduleThreads) {
    p.tiles[e] = {-1, 0, 0};
  }
}

// Builds a VarlenSequencePlanParams plan in one CTA: the sequences, the prefix sum of their
// chunk counts, and the sequences sorted by chunk count, most first (empty ones last; ties in
// atomic order, which moves no result: each sequence is computed alone).
__global__ void __launch_bounds__(kVarlenScheduleThreads, 1)
    varlen_sequence_plan_kernel(const VarlenSequencePlanParams p) {
  using namespace varlen_detail;
  __shared__ int bucket_next[kVarlenCostBuckets];
  __shared__ int warp_sums[32];
  const int tid = threadIdx.x;
  auto chunks_of = [&](const VarlenRows& s) { return (s.len + p.chunk - 1) / p.chunk; };

  int num_chunks = 0;
  for (int base = 0; base < p.batch; base += kVarlenScheduleThreads) {
    const int b = base + tid;
    int chunks = 0;
    if (b < p.batch) {
      const int s0 = clamp_row(p.cu_seqlens[b], 0, p.total);
      const int s1 = clamp_row(p.cu_seqlens[b + 1], s0, p.total);
      p.sequences[b] = {s0, s1 - s0};
      chunks = chunks_of(p.sequences[b]);
    }
    int step_chunks;
    const int before = block_exclusive_scan(chunks, step_chunks, warp_sums);
    if (b < p.batch) p.chunk_start[b] = num_chunks + before;
    num_chunks += step_chunks;
  }
  if (tid == 0) p.chunk_start[p.batch] = num_chunks;
  __syncthreads();  // each sequence is read by other threads below

  sort_most_first(
      p.batch, [&](int b) { return chunks_of(p.sequences[b]); }, bucket_next, warp_sums,
      p.order);
}

}  // namespace dsv4
