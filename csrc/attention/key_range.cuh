// Key-range arithmetic shared by the sm90 attention kernels: which key tiles a tile of query
// rows can see, which of them straddle a boundary, and per-element visibility. Positions are
// bottom-right aligned: query token i sits at key position i + Sk - Sq.
#pragma once

namespace dsv4 {

struct KeyTiles {
  int first, end;      // key tiles [first, end) that some row can see
  int pos_lo, pos_hi;  // key positions of the first and last valid query tokens
};

// Query tokens [tok_lo, tok_lo + tokens) (clipped to Sq), keys in tiles of block_n.
__device__ __forceinline__ KeyTiles visible_key_tiles(int seqlen_q, int seqlen_k, int causal,
                                                      int window_left, int tok_lo, int tokens,
                                                      int block_n) {
  KeyTiles t;
  const int shift = seqlen_k - seqlen_q;
  t.pos_lo = tok_lo + shift;
  t.pos_hi = min(tok_lo + tokens, seqlen_q) - 1 + shift;
  const int key_lo = window_left >= 0 ? max(0, t.pos_lo - window_left) : 0;
  const int key_hi = causal ? min(seqlen_k, t.pos_hi + 1) : seqlen_k;
  t.first = key_lo / block_n;
  t.end = key_hi > key_lo ? (key_hi + block_n - 1) / block_n : t.first;
  return t;
}

// Whether the key tile starting at n0 holds a key that some row of `tiles` cannot see.
__device__ __forceinline__ bool key_tile_needs_mask(const KeyTiles& tiles, int n0, int block_n,
                                                    int seqlen_k, int causal, int window_left) {
  return n0 + block_n > seqlen_k || (causal && n0 + block_n - 1 > tiles.pos_lo) ||
         (window_left >= 0 && n0 < tiles.pos_hi - window_left);
}

__device__ __forceinline__ bool key_visible(int key, int pos, int seqlen_k, int causal,
                                            int window_left) {
  return key < seqlen_k && (!causal || key <= pos) && (window_left < 0 || key >= pos - window_left);
}

}  // namespace dsv4
