// Plain parameters of the sm90 fmha kernel (no torch types; shared by launcher and kernel).
#pragma once

#include <cstdint>

#include "sm90/shared/varlen_schedule.h"

namespace dsv4 {

// A varlen call is indexed as one batch of total_q query rows (out (1, total_q, Hq, Dv), lse
// (1, Hq, total_q), q/k/v tensor maps over (1, total, H, D)); each work tile takes its
// sequence's rows and lengths from the schedule.
struct FmhaSm90Params {
  void* out;           // (B, Sq, Hq, Dv), contiguous, q's dtype
  float* lse;          // (B, Hq, Sq), contiguous
  const float* sinks;  // (Hq,) or nullptr
  int batch, seqlen_q, seqlen_k;  // varlen: 1, total_q, total_k
  int heads_q, group;  // group = Hq / Hkv; query head h reads KV head h / group
  // A work tile's kBlockM rows are pack_tokens query tokens of pack_heads query heads that
  // share one KV head: row r is token m_block * pack_tokens + r % pack_tokens of head
  // head0 + r / pack_tokens. Unpacked (varlen, and dense unless packed GQA pays):
  // pack_tokens = kBlockM, pack_heads = 1. Packed: pack_tokens * pack_heads = kBlockM.
  int pack_tokens, pack_heads;
  int num_m_blocks;    // dense: query tiles per (batch, head group), ceil(Sq / pack_tokens)
  int num_work;        // work tiles: dense num_m_blocks * (Hq / pack_heads) * B * num_splits,
                       // varlen tile slots * Hq
  // Split-KV (dense; csrc/sm90/shared/split_kv.h): num_splits > 1 cuts each work tile's key tiles
  // into that many ranges (work = tile * num_splits + split); each writes its rows to o_partial
  // [split][row][D] fp32 and lse_partial [split][row] (no sink), row = (b * Sq + t) * Hq + h,
  // and the combine kernel writes out and lse.
  int num_splits;
  const VarlenTile* varlen_tiles;          // nullptr: dense
  const VarlenSequence* varlen_sequences;
  float* o_partial;
  float* lse_partial;
  int* tile_counter;   // dynamic persistent grid (sm90/shared/tile_scheduler.cuh); nullptr: static
  // Work order, in sections whose K/V fit in L2 together. Dense: sections of section_units
  // (batch, head group) pairs, within one the last query tiles (under a causal mask the
  // costliest) first. Varlen: section_units query heads per schedule slot (VarlenTile::head0).
  int section_units;
  float scale_log2;    // scale * log2(e), > 0
  int causal;          // bottom-right aligned
  int window_left;     // < 0: no window
};
// Measured with ptxas: growing this struct past 128 bytes (one more 8-byte field) made the
// consumers spill 12-232 bytes in 5 of the 6 bf16 instantiations. Keep it within 128 bytes.
static_assert(sizeof(FmhaSm90Params) <= 128, "FmhaSm90Params beyond 128 bytes: see above");

}  // namespace dsv4
