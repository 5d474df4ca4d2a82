// The work-tile vocabulary of the head_dim-512 kernel, shared by its roles: which rows a work tile
// holds, which key tiles it visits, and the CTA's barrier parities across work tiles.
#pragma once

#include <cstdint>

#include "ptx/mbarrier.cuh"
#include "sm90/mqa512/params.h"
#include "sm90/shared/key_range.cuh"

namespace dsv4 {

// Work tile t -> its tokens, heads, KV head and split, and its sequence's rows and lengths.
// Dense: the query tiles of one (batch, KV head, head block) are consecutive, so CTAs running
// together share that KV head's keys in L2; the last query tile (the most keys under a causal
// mask) comes first. Varlen: the schedule's order (the costliest sequences first, each one's
// tiles together, the last first).
struct Mqa512WorkTile {
  int tok0, head0, kv_head, batch, split;
  int q_start, k_start;  // the sequence's first row of q/out and of kv (0 for dense)
  int c_start, seqlen_c;  // and its compressed rows: first row and count
  KeyShape shape;        // its lengths; 0 for an unused schedule slot (no rows, no keys)
};

__device__ __forceinline__ Mqa512WorkTile mqa512_decode_tile(const Mqa512Sm90Params& p, int t) {
  const int split = t % p.num_splits;  // a work tile's splits are neighbours
  t /= p.num_splits;
  Mqa512WorkTile w;
  w.split = split;
  w.q_start = w.k_start = w.c_start = 0;
  w.seqlen_c = p.seqlen_c;
  w.shape = {p.seqlen_q, p.seqlen_k, p.causal, p.window_left};
  int m_block = 0;  // varlen: the schedule slot's
  if (p.varlen_tiles == nullptr) {
    m_block = p.num_m_blocks - 1 - t % p.num_m_blocks;
    t /= p.num_m_blocks;
  }
  const int head_block = t % p.head_blocks;
  t /= p.head_blocks;
  w.kv_head = t % p.heads_kv;
  w.head0 = w.kv_head * p.group + head_block * p.tile_heads;
  t /= p.heads_kv;
  w.batch = t;  // varlen: the schedule slot
  if (p.varlen_tiles != nullptr) {
    const VarlenTile tile = p.varlen_tiles[t];
    m_block = tile.m_block;
    w.batch = 0;
    w.shape.seqlen_q = w.shape.seqlen_k = w.seqlen_c = 0;
    if (tile.batch >= 0) {
      const VarlenSequence seq = p.varlen_sequences[tile.batch];
      w.q_start = seq.q_start;
      w.k_start = seq.k_start;
      w.shape.seqlen_q = seq.seqlen_q;
      w.shape.seqlen_k = seq.seqlen_k;
      if (p.varlen_compressed != nullptr) {
        const VarlenRows c = p.varlen_compressed[tile.batch];
        w.c_start = c.start;
        w.seqlen_c = c.len;
      }
    }
  }
  w.tok0 = m_block * p.tile_tokens;
  return w;
}

// The key tiles a work tile visits: num_kv kv tiles from key kv_key0 on, then num_c compressed
// tiles (HCA: rows [0, 64 num_c); CSA: c_per_token tiles of listed slots for each of the tile's
// tokens in turn). The producer derives them (mqa512_key_segments) and publishes them with the
// work tile. The kv tiles start at the first visible key, not at a multiple of 64: a token's
// 128-key window is two tiles instead of three, and none of them needs a mask once the window is
// full.
struct Mqa512KeySegments {
  KeyTiles kv;  // pos_lo, pos_hi: the tile's first and last token positions
  int kv_key0;
  int num_kv, num_c;
  int c_per_token;  // CSA: the listed tiles each token of the tile walks
};

// What the producer publishes per work tile (the tile ring): the tile, its key segments
// rebased to its split's first key tile, and that split's key-tile count.
struct Mqa512TileInfo {
  Mqa512WorkTile w;
  Mqa512KeySegments seg;
  int n;
};

__device__ __forceinline__ int mqa512_closed_rows(const Mqa512Sm90Params& p,
                                                  const Mqa512WorkTile& w, int pos) {
  return min(w.seqlen_c, max(pos + 1, 0) / p.compress_ratio);
}

// CSA: the compressed row in slot `slot` of a token's list (`listed`, K entries), or -1 where
// it is not visible (past K, negative, or not below `closed` = min(Sc, (t + 1) / r)).
__device__ __forceinline__ int mqa512_listed_row(const int* listed, int topk_k, int closed,
                                                 int slot) {
  const int w = slot < topk_k ? listed[slot] : -1;
  return w >= 0 && w < closed ? w : -1;
}

// CSA: the listed tiles of work tile `work`, planned (p.list_tiles; an L2 hit, written just
// before the launch), or -1: every slot's.
__device__ __forceinline__ int mqa512_planned_list_tiles(const Mqa512Sm90Params& p, int work) {
  return p.list_tiles != nullptr && work < p.num_work ? p.list_tiles[work / p.num_splits] : -1;
}

// paged: p.paged, known at compile time (the kernel's instantiation); list_tiles: CSA's
// mqa512_planned_list_tiles.
__device__ __forceinline__ Mqa512KeySegments mqa512_key_segments(const Mqa512Sm90Params& p,
                                                                 const Mqa512WorkTile& w,
                                                                 int block_n, bool paged,
                                                                 int list_tiles) {
  Mqa512KeySegments k;
  k.kv = visible_key_tiles(w.shape, w.tok0, p.tile_tokens, block_n);
  k.kv_key0 = visible_keys(w.shape, k.kv.pos_lo).lo;
  const int kv_keys = visible_keys(w.shape, k.kv.pos_hi).hi - k.kv_key0;
  k.num_kv = p.use_kv && kv_keys > 0 ? (kv_keys + block_n - 1) / block_n : 0;
  k.c_per_token = 0;
  if (paged) {
    // Each of the tile's tokens walks its window list's tiles, then its compressed list's.
    k.c_per_token = p.page_list[0].tiles + p.page_list[1].tiles;
    k.num_c = k.c_per_token * max(k.kv.pos_hi - k.kv.pos_lo + 1, 0);
  } else if (p.compress_ratio == 0) {
    k.num_c = 0;
  } else if (p.topk != nullptr) {
    // The listed slots up to the last visible one (planned), 64 per tile, for each of the
    // tile's tokens in its sequence.
    const int tokens = max(k.kv.pos_hi - k.kv.pos_lo + 1, 0);
    k.c_per_token = list_tiles >= 0 ? list_tiles : (p.topk_k + block_n - 1) / block_n;
    k.num_c = k.c_per_token * tokens;
  } else {
    k.num_c = (mqa512_closed_rows(p, w, k.kv.pos_hi) + block_n - 1) / block_n;
  }
  return k;
}

// Whether the compressed tiles are gathered by the producer warps (CSA's listed rows, or a
// paged call's FP8 rows) rather than loaded by TMA: their validity comes in csa_slots.
__device__ __forceinline__ bool mqa512_gathers(const Mqa512Sm90Params& p) {
  return p.topk != nullptr || p.paged;
}

// A paged list's entry `slot` of one token (`listed`: its len entries), or -1 where its row is
// not read (at or past the token's `length`, negative, or past the cache).
__device__ __forceinline__ int mqa512_paged_slot(const int* listed, int len, int capacity,
                                                 int length, int slot) {
  const int s = slot < len ? listed[slot] : -1;  // not behind the length's load
  return slot < length && s >= 0 && s < capacity ? s : -1;
}

// Whether the kernel folds in the sinks, which then travel with Q (a split's rows leave them to
// the combine kernel; splits merged in a cluster fold them in after the merge).
__device__ __forceinline__ bool mqa512_sinks_with_q(const Mqa512Sm90Params& p) {
  return p.sinks != nullptr && (p.num_splits == 1 || p.split_merge > 1);
}

// A CTA's place in its loop over work tiles, in one register (the consumers are at their
// register budget): the work tile (bits 5 and up, so fewer than 2^26 work tiles; the plan
// checks) and the parities barriers are waited on with (only parities matter): bit s, the fills
// of stage s so far (s = 0, 1); bit 2, the Q loads; bits 3-4, a count of the CTA's work tiles:
// bit 3 (the tile's parity) picks its slot of the tile ring and its row-sum buffer, bit 4 is
// that slot's fill parity.
struct Mqa512Progress {
  uint32_t bits;
  __device__ __forceinline__ explicit Mqa512Progress(int work) : bits(uint32_t(work) << 5) {}
  __device__ __forceinline__ int work() const { return int(bits >> 5); }
  // The parity of the i-th fill of stage s from the start of the current work tile.
  __device__ __forceinline__ uint32_t stage(int s, int i) const { return ((bits >> s) + i) & 1; }
  __device__ __forceinline__ uint32_t q() const { return (bits >> 2) & 1; }
  __device__ __forceinline__ uint32_t slot() const { return (bits >> 3) & 1; }
  __device__ __forceinline__ uint32_t slot_phase() const { return (bits >> 4) & 1; }
  __device__ __forceinline__ void next_slot() { bits = (bits & ~0x18u) | ((bits + 8u) & 0x18u); }
  // After a work tile of n key tiles: stage 0 took (n + 1) / 2 of them, stage 1 n / 2.
  __device__ __forceinline__ void finish_keys(int n) {
    bits ^= (((n + 1) / 2) & 1) | (((n / 2) & 1) << 1) | (n > 0 ? 4u : 0u);
  }
  __device__ __forceinline__ void next_work(int stride) { bits += uint32_t(stride) << 5; }
};

// A consumer warp's copy of the work tile the producer published in the tile ring into its own
// tile_info[copy], 16 bytes per lane; each copying lane releases the ring slot itself.
// Storage: either kernel's shared storage.
template <int kCopyLanes, typename Storage>
__device__ __forceinline__ void mqa512_copy_tile_info(Storage& s, const Mqa512Progress& progress,
                                                      int copy, int lane) {
  const uint32_t slot = progress.slot();
  ptx::mbarrier_wait(ptx::smem_addr(&s.tile_full[slot]), progress.slot_phase());
  __syncwarp();  // the last work tile's readers of the copy are done
  if (lane < kCopyLanes) {
    reinterpret_cast<int4*>(&s.tile_info[copy][0])[lane] =
        reinterpret_cast<const int4*>(&s.tile_ring[slot][0])[lane];
    ptx::mbarrier_arrive(ptx::smem_addr(&s.tile_empty[slot]));
  }
  __syncwarp();
}

// The narrow form's key-tile ring (traits.h): the CTA's key tiles g = base + r (r: a work
// tile's tiles) go to stage g % 3 and barrier set g % 6, and belong to consumer and producer
// pair g % 2. Only g mod 12 matters: it gives the set and the parity of the set's fill.
struct Mqa512Ring {
  int base = 0;  // the tiles of the CTA's earlier work tiles, mod 12
  __device__ __forceinline__ int tile(int r) const { return (base + r) % 12; }
  __device__ __forceinline__ static int stage(int g) { return g % 3; }
  __device__ __forceinline__ static int set(int g) { return g % 6; }
  __device__ __forceinline__ static uint32_t full_parity(int g) { return uint32_t(g / 6); }
  // The set of tile g - 3 (the stage's previous tile) and the parity of its release, which the
  // producer of tile g waits for: 1 for the CTA's first three tiles, a parity that a fresh
  // barrier reads as passed.
  __device__ __forceinline__ static int previous_set(int g) { return (g + 3) % 6; }
  __device__ __forceinline__ static uint32_t previous_release_parity(int g) {
    return uint32_t(((g + 9) % 12) / 6);
  }
  // The first of a work tile's tiles that consumer or producer pair c takes.
  __device__ __forceinline__ int first_of(int c) const { return (c - base) & 1; }
  __device__ __forceinline__ void finish_keys(int n) { base = (base + n) % 12; }
};

}  // namespace dsv4
