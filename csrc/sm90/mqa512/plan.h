// The head_dim-512 family's launch plan from shapes alone (no torch, no tensors): the query-head
// packing, the work tiles, split-KV and the grid, and the kernel parameters they give. The
// family's api (api.cpp) adds what needs the tensors (strides, alignment); the torch-free
// harness (benchmarks/profile/mqa512_harness) plans through these same functions.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "sm90/mqa512/params.h"
#include "sm90/shared/overrides.h"
#include "sm90/shared/split_kv.h"
#include "sm90/shared/varlen_schedule.h"

namespace dsv4 {

constexpr int kMqa512Rows = 64;          // packed query rows per work tile (the traits' kBlockM)
constexpr int kMqa512KeysPerTile = 64;   // the traits' kBlockN
constexpr int64_t kMqa512MaxWork = int64_t(1) << 26;  // Mqa512Progress: 27 bits of work index
// The narrow form (traits.h: Mqa512NarrowTraits) takes CSA at this many query heads per KV head
// or fewer, where its one-token work tiles need no split-KV and the lists are long enough to
// pay for its start and end of work tile. Harness, H200, S 8k at 64k context, narrow vs 64-row
// tiles (ms): Hq 8, K 256 0.631 vs 0.587, K 288 0.708 vs 0.705, K 320 0.700 vs 0.710; Hq 16,
// K 256 0.638 vs 0.664, K 288 0.718 vs 0.789; at one head the 64-row tiles cannot take CSA.
constexpr int kMqa512NarrowHeads = 16;
constexpr int kMqa512NarrowMinTopk = 288;

// A call as the kernel sees it. Varlen calls are one batch of packed rows: seqlen_q and
// seqlen_k are then total_q and total_k, and batch the number of sequences.
struct Mqa512Shape {
  int64_t batch = 0, seqlen_q = 0, seqlen_k = 0, heads_q = 0, heads_kv = 1;
  bool varlen = false;
  int64_t longest_k = 0;  // the longest sequence's keys (dense: seqlen_k), for the split-KV plan
  double scale = 0.0;
  // The rows of kv each query sees: fmha's causal / window_left visibility; use_kv = false: none.
  bool use_kv = true, causal = false;
  int64_t window_left = -1;
  // The compressed rows (dsv4_attention): compress_ratio 0 for none; seqlen_c is Sc (dense) or
  // total_c (varlen); topk_k > 0: CSA (each query's listed rows), else HCA (every closed row).
  int64_t compress_ratio = 0, seqlen_c = 0, topk_k = 0;
  // A bound on the compressed rows one query sees, for the split-KV plan (HCA varlen: the
  // longest kv sequence over compress_ratio).
  int64_t max_compressed_rows = 0;
  // Paged (dsv4_attention_paged; batch 1, seqlen_q = seqlen_k = T, no kv rows): the key tiles of
  // each token's two slot lists together; 0: not paged.
  int64_t paged_tiles = 0;
};

struct Mqa512Plan {
  int tile_tokens = 0, tile_heads = 0, head_blocks = 0;  // a work tile: tokens x heads of one KV head
  int64_t num_m_blocks = 0;  // query tiles per (batch, head block); varlen: schedule slots
  int64_t tiles = 0;         // work tiles before the split
  int num_splits = 1;
  bool persistent = true;    // one CTA per SM walks the work tiles; else one CTA per work tile
  int64_t grid = 0;          // CTAs
  Mqa512Keys keys = Mqa512Keys::kTma;  // the kernel's instantiation (params.h)
  int narrow_heads = 0;      // kMqa512NarrowHeads: the narrow form (one token's heads a tile)
  bool cluster_merge = false;  // the splits merge in a cluster (params.h: split_merge)
};

// A split call's two splits merge in a cluster of two CTAs (split_merge.cuh) where each CTA
// holds one work tile's split (work <= grid). Graphed paged decode steps, B = 64, Hq 64 (H200,
// the producer converting): CSA top-512 44.6 -> 32.6 us, top-1024 62.5 -> 52.7, HCA 32.1 ->
// 23.7. Clusters of four and eight lost to the combine at the same split count even where
// they all fit at once (B = 8 top-512, eight splits: 17.4 -> 24.3 us; docs/mqa512.md, "Tried
// and dropped").
inline bool mqa512_cluster_merge_fits(const Mqa512Plan& plan) {
  return plan.num_splits == 2 && plan.tiles * 2 <= plan.grid;
}

// Paged calls of at most this many work tiles a CTA (decode steps) have the consumers convert
// the FP8 blocks (Mqa512Keys::kPagedStaged): there the consumers wait for blocks most of the
// time, and the producer's copies alone reach a tile sooner. Longer walks (prefill) keep the
// producer converting, so the consumers' chain stays short. (Graphed steps, H200, producer ->
// consumers: merged in clusters, B = 64 Hq 64 top-512 32.6 -> 30.4 us; with the combine, B = 8
// top-512 18.2 -> 17.6, HCA 17.3 -> 17.0, B = 32 top-512 28.8 -> 27.9. Only B = 64 split in two
// lost with the combine, 44.2 -> 46.8, and that call merges in clusters: docs/mqa512.md.)
constexpr int64_t kMqa512PagedConsumerConvertsWork = 2;

// Why the kernel cannot take a call of this shape, or nullptr (the packing, the work-tile
// index's range, int row indices).
inline const char* mqa512_shape_unsupported(const Mqa512Shape& s) {
  if (!(s.scale > 0.0)) return "scale <= 0 (the kernel takes the max before scaling)";
  if (s.batch < 1 || s.seqlen_q < 1 || s.seqlen_k < 1 || s.heads_q < 1 || s.heads_kv < 1) {
    return "an empty q or kv";
  }
  const int64_t group = s.heads_q / s.heads_kv;
  if (group % kMqa512Rows != 0 && kMqa512Rows % group != 0) {
    return "query heads per KV head neither divide 64 nor are a multiple of 64";
  }
  constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
  if (s.varlen && (s.seqlen_q > kMaxInt / 2 || s.seqlen_k > kMaxInt / 2 ||
                   s.seqlen_c > kMaxInt / 2)) {
    return "2^30 or more packed rows";
  }
  if (s.seqlen_k > kMaxInt - s.seqlen_q) return "2^31 or more query and key positions";
  return nullptr;
}

// The launch decisions for a supported shape on a device of num_sms SMs.
inline Mqa512Plan mqa512_plan_launch(const Mqa512Shape& s, int num_sms, const Overrides& o) {
  Mqa512Plan plan;
  const int64_t group = s.heads_q / s.heads_kv;
  plan.tile_heads = static_cast<int>(std::min<int64_t>(group, kMqa512Rows));
  plan.tile_tokens = kMqa512Rows / plan.tile_heads;
  // A paged decode step below 64 heads takes one token a tile, its rows past the heads padding
  // (loaded as zeros, never stored), where those tiles fill the SMs at most once: a tile of
  // several tokens walks each token's lists in turn, so packing saves no reads there, and one
  // token a tile halves the splits (Hq 32: two, merged in a cluster, instead of four).
  if (s.paged_tiles > 0 && group < kMqa512Rows && s.seqlen_q * s.heads_kv <= num_sms) {
    plan.tile_tokens = 1;
  }
  plan.head_blocks = static_cast<int>(group / plan.tile_heads);
  plan.num_m_blocks = s.varlen ? varlen_tile_capacity(s.seqlen_q, s.batch, plan.tile_tokens)
                               : (s.seqlen_q + plan.tile_tokens - 1) / plan.tile_tokens;
  plan.tiles = plan.num_m_blocks * plan.head_blocks * s.heads_kv * (s.varlen ? 1 : s.batch);
  // Split-KV where the work tiles are few, planned from a bound on one tile's key tiles: the
  // window's (a token's 128-key window is two or three tiles) and the compressed rows'.
  int64_t max_key_tiles =
      s.use_kv ? split_kv_max_key_tiles(s.longest_k, s.window_left, kMqa512KeysPerTile,
                                        kMqa512KeysPerTile)
               : 0;
  if (s.paged_tiles > 0) max_key_tiles = s.paged_tiles * plan.tile_tokens;  // each token's lists
  if (s.compress_ratio > 0) {
    const int64_t rows = s.topk_k > 0 ? s.topk_k : s.max_compressed_rows;
    // CSA: each of a work tile's tokens walks its own list.
    max_key_tiles += (rows + kMqa512KeysPerTile - 1) / kMqa512KeysPerTile *
                     (s.topk_k > 0 ? plan.tile_tokens : 1);
  }
  // The narrow form: one token a tile, no split-KV (taken where none would be planned and the
  // lists are long or the group is one head, or wherever DSV4_MQA512_NARROW=1 allows it).
  const bool narrow_fits = s.topk_k > 0 && s.paged_tiles == 0 && group <= kMqa512NarrowHeads;
  const bool narrow_pays = s.topk_k >= kMqa512NarrowMinTopk || group == 1;
  if (narrow_fits && (o.mqa512_narrow == 1 || (o.mqa512_narrow == -1 && narrow_pays))) {
    const int64_t m_blocks = s.varlen ? varlen_tile_capacity(s.seqlen_q, s.batch, 1) : s.seqlen_q;
    const int64_t tiles = m_blocks * s.heads_kv * (s.varlen ? 1 : s.batch);
    const int64_t key_tiles =
        (s.use_kv ? split_kv_max_key_tiles(s.longest_k, s.window_left, 1, kMqa512KeysPerTile) : 0) +
        (s.topk_k + kMqa512KeysPerTile - 1) / kMqa512KeysPerTile;
    if (o.mqa512_narrow == 1 || split_kv_splits(tiles, key_tiles, num_sms, o.split_kv) == 1) {
      plan.tile_heads = static_cast<int>(group);
      plan.tile_tokens = 1;
      plan.head_blocks = 1;
      plan.num_m_blocks = m_blocks;
      plan.tiles = tiles;
      plan.num_splits = 1;
      plan.persistent = true;
      plan.grid = std::min<int64_t>(tiles, num_sms);
      plan.keys = Mqa512Keys::kGathered;
      plan.narrow_heads = kMqa512NarrowHeads;
      return plan;
    }
  }
  const int splits = split_kv_splits(plan.tiles, max_key_tiles, num_sms, o.split_kv);
  // A forced count stays within the work-tile bound.
  plan.num_splits = static_cast<int>(
      std::min<int64_t>(splits, (kMqa512MaxWork - 1) / std::max<int64_t>(plan.tiles, 1)));
  // A persistent grid (one CTA per SM, stride over the work tiles, the costliest first) loads a
  // tile's Q during the previous tile's last P V: causal fmha S = 4k Hq = 64 1.5-3% faster than
  // one CTA per work tile; dsv4_attention's short window-bounded tiles gain most (sliding
  // S = 8k Hq = 128 1.91 -> 1.72 ms).
  plan.persistent = !o.mqa512_per_tile_grid;
  const int64_t work = plan.tiles * plan.num_splits;
  plan.grid = plan.persistent ? std::min<int64_t>(work, num_sms) : work;
  plan.cluster_merge = o.mqa512_split_merge != 0 && mqa512_cluster_merge_fits(plan);
  const bool consumers_convert = o.mqa512_paged_convert == -1
                                     ? work <= kMqa512PagedConsumerConvertsWork * plan.grid
                                     : o.mqa512_paged_convert == 1;
  plan.keys = s.paged_tiles > 0 ? (consumers_convert ? Mqa512Keys::kPagedStaged : Mqa512Keys::kPaged)
              : s.topk_k > 0    ? Mqa512Keys::kGathered
                                : Mqa512Keys::kTma;
  return plan;
}

// The kernel parameters a plan gives, every field but the pointers (out, lse, sinks, topk,
// compressed, the varlen schedule and the split-KV partials, which the launcher sets).
inline Mqa512Sm90Params mqa512_params(const Mqa512Shape& s, const Mqa512Plan& plan) {
  Mqa512Sm90Params p{};
  p.batch = s.varlen ? 1 : static_cast<int>(s.batch);
  p.seqlen_q = static_cast<int>(s.seqlen_q);
  p.seqlen_k = static_cast<int>(s.seqlen_k);
  p.heads_q = static_cast<int>(s.heads_q);
  p.heads_kv = static_cast<int>(s.heads_kv);
  p.group = static_cast<int>(s.heads_q / s.heads_kv);
  p.tile_heads = plan.tile_heads;
  p.tile_tokens = plan.tile_tokens;
  p.head_blocks = plan.head_blocks;
  p.num_m_blocks = static_cast<int>(plan.num_m_blocks);
  p.num_work = static_cast<int>(plan.tiles * plan.num_splits);
  p.scale_log2 = static_cast<float>(s.scale * 1.4426950408889634);
  p.use_kv = s.use_kv ? 1 : 0;
  p.causal = s.causal ? 1 : 0;
  p.window_left = static_cast<int>(s.window_left);
  p.compress_ratio = static_cast<int>(s.compress_ratio);
  p.seqlen_c = static_cast<int>(s.seqlen_c);
  p.topk_k = static_cast<int>(s.topk_k);
  p.num_splits = plan.num_splits;
  p.split_merge = plan.cluster_merge ? plan.num_splits : 0;
  p.paged = s.paged_tiles > 0 ? 1 : 0;
  p.lse_with_sink = p.paged ? 0 : 1;  // dsv4_attention_paged's lse leaves the sink out
  return p;
}

}  // namespace dsv4
