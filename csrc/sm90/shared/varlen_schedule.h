// The work schedule of a varlen attention call, built on the device by
// csrc/sm90/shared/varlen_schedule.cuh so that no host sync reads cu_seqlens. Host and device, no
// torch.
#pragma once

#include <cstdint>

namespace dsv4 {

// One sequence, clamped into the packed tensors: its first row and length on each side.
struct alignas(16) VarlenSequence {  // one 16-byte load
  int q_start, seqlen_q, k_start, seqlen_k;
};

// A third set of rows of one sequence (dsv4_attention's compressed KV), clamped likewise.
struct alignas(8) VarlenRows {
  int start, len;
};

// One query tile of one sequence, for a section of query heads that starts at head0 (fmha;
// 0 where a tile holds every head); batch < 0 marks the unused slots after the last tile.
struct alignas(16) VarlenTile {  // one 16-byte load
  int batch, m_block, head0;
};

struct VarlenScheduleParams {
  const int* cu_seqlens_q;  // (batch + 1,) int32, trusted: each read is clamped into
  const int* cu_seqlens_k;  // [0, total], so bad contents give wrong rows, never a stray access
  int batch, total_q, total_k;
  int tokens_per_tile, keys_per_tile;  // the kernel's query tile and key tile
  int causal, window_left;             // for each tile's cost: the key tiles it sees
  int capacity;                        // query tiles at most (varlen_tile_capacity)
  int head_sections, heads_per_section;  // each query tile once per section of query heads
  VarlenSequence* sequences;           // [batch]
  int* order;                          // [batch] scratch: the sequences, the costliest first
  int* sorted_start;                   // [batch] scratch: their first query tile in that order
  VarlenTile* tiles;                   // [capacity * head_sections], in the order above
  const int* cu_seqlens_c;             // nullptr, or a third set of rows (batch + 1,), trusted
  int total_c;
  VarlenRows* rows_c;                  // [batch] when cu_seqlens_c is given
};

// A varlen call whose CTAs each walk one whole sequence in fixed-size chunks (the chunked
// linear-attention ops): the clamped sequences, where each one's chunks start in the flat list
// of all chunks, and the sequences in the order to launch them, the most chunks first.
struct VarlenSequencePlanParams {
  const int* cu_seqlens;  // (batch + 1,) int32, trusted and clamped into [0, total]
  int batch, total, chunk;
  VarlenRows* sequences;  // [batch]: first row, length
  int* chunk_start;       // [batch + 1]: first chunk of each sequence, then the chunk total
  int* order;             // [batch]: every sequence once, the most chunks first
};

// An upper bound on the query tiles of all sequences, from shapes only:
// sum ceil(len / t) <= (total + batch (t - 1)) / t.
inline int64_t varlen_tile_capacity(int64_t total_q, int64_t batch, int tokens_per_tile) {
  return (total_q + batch * (tokens_per_tile - 1)) / tokens_per_tile;
}

}  // namespace dsv4
