// Split-KV for attention kernels whose work tiles cannot fill the GPU (decode, short queries):
// the plan (how many splits) and the combine kernel's parameters. Host and device, no torch.
#pragma once

#include <algorithm>
#include <cstdint>

namespace dsv4 {

// Splits of each work tile's key range: enough that the work tiles times the splits fill the
// SMs once (one CTA per SM at these kernels' shared memory), with at least
// min_tiles_per_split key tiles in each split. 1 when the work tiles fill the SMs already.
// The plan reads shapes only: no host sync.
inline int split_kv_count(int64_t work_tiles, int64_t max_key_tiles, int num_sms,
                          int64_t min_tiles_per_split = 2, int64_t max_splits = 64) {
  if (work_tiles <= 0 || work_tiles * 2 > num_sms) return 1;
  const int64_t by_sms = num_sms / work_tiles;
  const int64_t by_keys = max_key_tiles / min_tiles_per_split;
  return static_cast<int>(std::max<int64_t>(1, std::min({by_sms, by_keys, max_splits})));
}

// The splits a plan takes: split_kv_count, or `forced` (DSV4_SPLIT_KV, when > 0) capped by the
// key tiles.
inline int split_kv_splits(int64_t work_tiles, int64_t max_key_tiles, int num_sms, int forced) {
  if (forced > 0) {
    return static_cast<int>(std::clamp<int64_t>(forced, 1, std::max<int64_t>(max_key_tiles, 1)));
  }
  return split_kv_count(work_tiles, max_key_tiles, num_sms);
}

// A bound on the key tiles of one work tile (the split-KV plan's input, shapes only): every key
// tile of a sequence of seqlen_k keys, or with a window only those the window of a tile of
// `tokens` query tokens reaches.
inline int64_t split_kv_max_key_tiles(int64_t seqlen_k, int64_t window_left, int64_t tokens,
                                      int64_t keys_per_tile) {
  const int64_t all = (seqlen_k + keys_per_tile - 1) / keys_per_tile;
  if (window_left < 0) return all;
  return std::min(all, (window_left + tokens + keys_per_tile - 1) / keys_per_tile + 1);
}

// Each split leaves its rows normalised by its own softmax sum (no sink) and that sum's lse;
// the combine weights them by exp(lse_split - lse), folds the sink in once, and writes the
// output and lse (with the sink, or the keys' alone).
struct SplitKvCombineParams {
  const float* o_partial;    // [splits][rows][head_dim]; rows in (batch, token, head) order
  const float* lse_partial;  // [splits][rows], natural log; -inf for a split that saw no key
  void* out;                 // [rows][head_dim], contiguous, the output dtype
  float* lse;                // (B, Hq, Sq): row (b, t, h) -> (b * Hq + h) * Sq + t
  const float* sinks;        // (Hq,) or nullptr
  int splits, rows, heads, seqlen_q;
  int lse_with_sink;         // 1: lse includes the sink; 0: the keys' lse alone
};

}  // namespace dsv4
