// The sm90 fmha kernel's work tiles: the query rows that work index t covers. The producer and
// the consumers decode every tile themselves (kernel.cuh).
#pragma once

#include "sm90/shared/key_range.cuh"
#include "sm90/fmha/params.h"

namespace dsv4 {

// Work tile t: a query tile of one (sequence, head group), with that sequence's rows and
// lengths. Dense: sections of FmhaSm90Params::section_units (batch, head group) units whose
// K/V fit in L2 together, so the CTAs running at the same time share them; within a section
// the last query tiles (the ones that see the most keys under a causal mask) come first, the
// section's units innermost. Varlen: the schedule's order (varlen_schedule.cuh: the costliest
// sequences first, each one's tiles section by section), a section's heads consecutive.
// Packed GQA (dense, FmhaSm90Params::pack_heads > 1): a tile's rows are pack_tokens tokens of
// pack_heads query heads of one KV head, so decode and short queries read each K/V tile once
// for the whole group instead of once per query head.
// Dense calls take the lengths from the parameters, by reference (key_range.cuh): a copy
// would hold registers through the mainloop, which the D = 64 and 128 consumers do not have.
struct WorkTile {
  int m_block, head0, batch;  // head0: the tile's first query head; batch: the index into the
                              // tensors' batch dim (0 for varlen)
  int split;                  // dense split-KV: which range of the key tiles (0 without)
  int q_start, k_start;       // the sequence's first row of q/out and of k/v (0 for dense)
  KeyShape shape;             // varlen: its lengths; 0 for an unused schedule slot
};

template <bool kVarlen>
__device__ __forceinline__ WorkTile decode_tile(const FmhaSm90Params& p, int t) {
  if constexpr (kVarlen) {
    const unsigned section_heads = p.section_units;
    const VarlenTile tile = p.varlen_tiles[unsigned(t) / section_heads];
    WorkTile w{tile.m_block, tile.head0 + int(unsigned(t) % section_heads), 0, 0, 0, 0,
               {0, 0, p.causal, p.window_left}};
    if (tile.batch >= 0) {
      const VarlenSequence seq = p.varlen_sequences[tile.batch];
      w.q_start = seq.q_start;
      w.k_start = seq.k_start;
      w.shape.seqlen_q = seq.seqlen_q;
      w.shape.seqlen_k = seq.seqlen_k;
    }
    return w;
  } else {
    // Unsigned: each division is shorter and needs fewer registers (the producer has 24).
    const unsigned num_splits = p.num_splits, num_m_blocks = p.num_m_blocks;
    const unsigned section_units = p.section_units;
    const unsigned head_groups = unsigned(p.heads_q) / unsigned(p.pack_heads);
    unsigned u = t;
    const unsigned split = u % num_splits;  // a work tile's splits are neighbours
    u /= num_splits;
    // Sections of section_units (batch, head group) units, the last query tiles first.
    const unsigned section = u / (num_m_blocks * section_units);
    const unsigned in_section = u - section * (num_m_blocks * section_units);
    const unsigned first_unit = section * section_units;
    const unsigned units = min(section_units, head_groups * unsigned(p.batch) - first_unit);
    const unsigned unit = first_unit + in_section % units;
    return {int(num_m_blocks - 1 - in_section / units), int(unit % head_groups) * p.pack_heads,
            int(unit / head_groups), int(split), 0, 0, {}};
  }
}

// Query tokens per work tile (FmhaSm90Params::pack_tokens; varlen tiles are never packed).
template <bool kVarlen, int kBlockM>
__device__ __forceinline__ int tile_tokens(const FmhaSm90Params& p) {
  return kVarlen ? kBlockM : p.pack_tokens;
}

// The key tiles a work tile's split visits, with the row facts of the whole tile (its mask).
__device__ __forceinline__ KeyTiles split_tiles(KeyTiles tiles, int split, int num_splits) {
  const SplitRange r = split_key_range(tiles.end - tiles.first, split, num_splits);
  tiles.end = tiles.first + r.end;
  tiles.first += r.begin;
  return tiles;
}

}  // namespace dsv4
