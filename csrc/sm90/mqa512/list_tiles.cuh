// CSA: the listed tiles each work tile's tokens walk, planned before the kernel. A list padded
// with -1 past its last visible entry (a fresh prompt's early tokens: fewer closed rows than
// top-k) needs only the tiles up to that entry, as FlashMLA's topk_length gives it; the kernel's
// producer would pay a scan of the lists on its way into every work tile. One warp per work tile
// reads each token's list from the end, 32 entries at a time, until it meets a visible entry (a
// full list: one read).
#pragma once

#include "sm90/mqa512/work.cuh"

namespace dsv4 {

constexpr int kListTilesWarps = 4;

// tiles[t] for every work tile t (split 0 of each): max over its tokens of the tiles up to the
// last visible slot of the token's list (0 when none is visible). A template (kWarps =
// kListTilesWarps), so that every launch file may include it.
template <int kWarps>
__global__ void __launch_bounds__(32 * kWarps) mqa512_list_tiles_kernel(
    const __grid_constant__ Mqa512Sm90Params p, int* tiles, int block_n) {
  const int lane = threadIdx.x % 32;
  const int work = blockIdx.x * kWarps + threadIdx.x / 32;
  if (work * p.num_splits >= p.num_work) return;
  const Mqa512WorkTile w = mqa512_decode_tile(p, work * p.num_splits);
  const KeyTiles kt = visible_key_tiles(w.shape, w.tok0, p.tile_tokens, block_n);
  const int tokens = max(kt.pos_hi - kt.pos_lo + 1, 0);
  const int list_row0 = w.batch * p.seqlen_q + w.q_start + w.tok0;
  int most = 0;  // slots up to the last visible one, over the tokens
  for (int j = 0; j < tokens; ++j) {
    const int* listed = p.topk + static_cast<int64_t>(list_row0 + j) * p.topk_k;
    const int closed = mqa512_closed_rows(p, w, kt.pos_lo + j);
    // Slots [most, topk_k) can still raise it; walk them from the end.
    for (int hi = p.topk_k; hi > most; hi -= 32) {
      const int slot = hi - 1 - lane;
      const bool seen = slot >= most && mqa512_listed_row(listed, p.topk_k, closed, slot) >= 0;
      const uint32_t visible = __ballot_sync(0xffffffff, seen);
      if (visible != 0) {
        most = hi - (__ffs(visible) - 1);  // lane 0 holds the highest slot
        break;
      }
    }
  }
  if (lane == 0) tiles[work] = (most + block_n - 1) / block_n;
}

}  // namespace dsv4
