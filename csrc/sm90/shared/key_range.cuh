// Key-range arithmetic shared by the sm90 attention kernels: which key tiles a tile of query
// rows can see, which of them straddle a boundary, and per-element visibility. Positions are
// bottom-right aligned: query token i sits at key position i + Sk - Sq. `Params` is anything
// with seqlen_q, seqlen_k, causal and window_left (< 0: no window): a kernel's parameter struct
// for a dense call (taken by reference, the fields stay in parameter space), or a KeyShape
// holding one varlen sequence's lengths.
#pragma once

namespace dsv4 {

struct KeyShape {
  int seqlen_q, seqlen_k, causal, window_left;
};

struct KeyTiles {
  int first, end;      // key tiles [first, end) that some row can see
  int pos_lo, pos_hi;  // key positions of the first and last valid query tokens
};

// The keys [lo, hi) the query at key position `pos` can see (none when hi <= lo). Keys only
// move forward with the position, so rows [pos_lo, pos_hi] together see
// [visible_keys(pos_lo).lo, visible_keys(pos_hi).hi).
struct KeySpan {
  int lo, hi;
};

template <typename Params>
__device__ __forceinline__ KeySpan visible_keys(const Params& p, int pos) {
  return {p.window_left >= 0 ? max(0, pos - p.window_left) : 0,
          p.causal ? min(p.seqlen_k, pos + 1) : p.seqlen_k};
}

// Query tokens [tok_lo, tok_lo + tokens) (clipped to Sq), keys in tiles of block_n.
template <typename Params>
__device__ __forceinline__ KeyTiles visible_key_tiles(const Params& p, int tok_lo, int tokens,
                                                      int block_n) {
  KeyTiles t;
  const int shift = p.seqlen_k - p.seqlen_q;
  t.pos_lo = tok_lo + shift;
  t.pos_hi = min(tok_lo + tokens, p.seqlen_q) - 1 + shift;
  const int key_lo = visible_keys(p, t.pos_lo).lo, key_hi = visible_keys(p, t.pos_hi).hi;
  t.first = key_lo / block_n;
  t.end = key_hi > key_lo ? (key_hi + block_n - 1) / block_n : t.first;
  return t;
}

// Whether the key tile starting at n0 holds a key that some row of `tiles` cannot see.
template <typename Params>
__device__ __forceinline__ bool key_tile_needs_mask(const Params& p, const KeyTiles& tiles, int n0,
                                                    int block_n) {
  return n0 + block_n > p.seqlen_k || (p.causal && n0 + block_n - 1 > tiles.pos_lo) ||
         (p.window_left >= 0 && n0 < tiles.pos_hi - p.window_left);
}

// The key tiles of `tiles` that need no mask (key_tile_needs_mask false) as [lo, hi) tile
// indices within [tiles.first, tiles.end]: every key of such a tile lies below the first key
// the first row cannot see (causal, past Sk) and at or above the keys the last row's window
// drops.
template <typename Params>
__device__ __forceinline__ KeySpan mask_free_key_tiles(const Params& p, const KeyTiles& tiles,
                                                       int block_n) {
  const int seen_by_all_hi = p.causal ? min(p.seqlen_k, tiles.pos_lo + 1) : p.seqlen_k;
  const int seen_by_all_lo = p.window_left >= 0 ? tiles.pos_hi - p.window_left : 0;
  const int lo_tile = seen_by_all_lo > 0 ? (seen_by_all_lo + block_n - 1) / block_n : 0;
  const int hi_tile = seen_by_all_hi > 0 ? seen_by_all_hi / block_n : 0;
  const int lo = min(max(tiles.first, lo_tile), tiles.end);
  return {lo, max(lo, min(tiles.end, hi_tile))};
}

// Split-KV (csrc/sm90/shared/split_kv.h): the tiles [begin, end) of a work tile's num_tiles key
// tiles that split `split` of num_splits visits; equal ranges, the last ones possibly empty.
struct SplitRange {
  int begin, end;
};

__device__ __forceinline__ SplitRange split_key_range(int num_tiles, int split, int num_splits) {
  const int per = (num_tiles + num_splits - 1) / num_splits;
  const int begin = min(split * per, num_tiles);
  return {begin, min(begin + per, num_tiles)};
}

}  // namespace dsv4
