// Plain parameters of the sm90 head_dim-512 shared-KV kernel (no torch types; shared by the
// launcher and the kernel).
#pragma once

#include <cstdint>

#include "sm90/shared/host_device.h"
#include "sm90/shared/varlen_schedule.h"

namespace dsv4 {

// Where a call's key tiles come from; the kernel is compiled once for each.
// - kTma: the kv and HCA rows by TMA boxes (dense calls, sliding and HCA layers).
// - kGathered: CSA's listed rows too, by a cp.async gather (the window rows by TMA). A gather's
//   refill takes longer after a release than a box, so consumer 0 frees its half of stage 0
//   before handing its P over rather than after (consumer.cuh).
// - kPaged: every row from a paged FP8 cache (dsv4_attention_paged), gathered by the producer
//   warps, which also convert each block before it arrives; its own instantiation keeps the
//   FP8 conversion's registers off the other calls.
// - kPagedStaged: the same gather, but a block arrives as its staged fp8 bytes and the stage's
//   consumer converts it (unsplit decode steps, plan.h: the producer's copies alone reach a
//   tile sooner). A runtime switch between the two cost both about 3% (harness).
enum class Mqa512Keys : int { kTma, kGathered, kPaged, kPagedStaged };
DSV4_HOST_DEVICE constexpr bool mqa512_paged_keys(Mqa512Keys k) {
  return k == Mqa512Keys::kPaged || k == Mqa512Keys::kPagedStaged;
}

// One slot list of a paged call (dsv4_attention_paged) over a paged FP8 cache
// (sm90/kv_cache/format.h): token t's entries are slots[t * len ...], entry j's row read iff
// j < lengths[t] (no lengths: every entry) and 0 <= slot < capacity.
struct Mqa512PagedList {
  const uint8_t* base;     // block 0 of the cache; nullptr: no such list
  const int* slots;        // (T, len) int32, contiguous
  const int* lengths;      // (T,) int32, or nullptr
  long long block_stride;  // bytes between blocks
  int len, tiles;          // entries per token, and their 64-slot tiles
  int page_shift;          // P = 2^page_shift rows per block
  int capacity;            // num_blocks * P
};

// A varlen call is indexed as one batch of total_q query rows (out (1, total_q, Hq, 512), lse
// (1, Hq, total_q), tensor maps over (1, total, H, 512)); each work tile takes its sequence's
// rows and lengths from the schedule (csrc/sm90/shared/varlen_schedule.h).
struct Mqa512Sm90Params {
  void* out;           // (B, Sq, Hq, 512), contiguous, q's dtype
  float* lse;          // (B, Hq, Sq), contiguous
  const float* sinks;  // (Hq,) or nullptr
  int batch, seqlen_q, seqlen_k;  // varlen: 1, total_q, total_k
  int heads_q, heads_kv;
  int group;           // Hq / Hkv: query head h reads KV head h / group
  // A 64-row tile packs tile_tokens tokens x tile_heads query heads of one KV head
  // (row = head * tile_tokens + token); head_blocks tiles cover a group's heads. A paged decode
  // tile below 64 heads holds one token's heads, the rows past them padding (plan.h).
  int tile_tokens, tile_heads, head_blocks;
  int num_m_blocks;    // dense: ceil(Sq / tile_tokens); varlen: the schedule's slots
  int num_work;        // num_m_blocks * head_blocks * heads_kv * batch * num_splits
  const VarlenTile* varlen_tiles;  // nullptr: dense
  const VarlenSequence* varlen_sequences;
  const VarlenRows* varlen_compressed;  // varlen dsv4_attention: each sequence's compressed rows
  float scale_log2;    // scale * log2(e), > 0
  // Segment 1, the rows of kv: the keys visible_keys(causal, window_left) gives each row (fmha;
  // dsv4_attention's window W is causal with window_left W - 1). use_kv = 0: no kv keys.
  int use_kv;
  int causal;          // bottom-right aligned
  int window_left;     // < 0: no window
  // Segment 2 (dsv4_attention HCA), the rows of compressed_kv, (B, seqlen_c, 1, 512): row w is
  // visible to the query at position t iff w < min(seqlen_c, (t + 1) / compress_ratio). Varlen:
  // (1, total_c, 1, 512), each sequence's rows from the schedule.
  int compress_ratio;  // 0: no compressed rows
  int seqlen_c;
  // CSA instead of HCA: only the rows listed in topk (B, Sq, topk_k) int32, contiguous, that are
  // closed are visible; they are gathered from `compressed` (row w of batch b at
  // compressed + b * c_batch_stride + w * c_row_stride elements; c_row_stride bytes < 2^32).
  const int* topk;     // nullptr: HCA (every closed row)
  int topk_k;
  // CSA: per work tile (its index / num_splits), the listed tiles each of its tokens walks, up
  // to the last visible slot of the longest list (list_tiles.cuh); nullptr: ceil(topk_k / 64).
  const int* list_tiles;
  const void* compressed;
  long long c_batch_stride, c_row_stride;
  // Split-KV (csrc/sm90/shared/split_kv.h): num_splits > 1 cuts each work tile's key tiles into
  // that many ranges; each writes its rows to o_partial [split][row][512] fp32 and lse_partial
  // [split][row] (no sink), row = (batch * Sq + token) * Hq + head, and the combine kernel
  // writes out and lse.
  int num_splits;
  float* o_partial;
  float* lse_partial;
  // split_merge = 2 instead (num_splits 2): each work tile's two splits run as one cluster of
  // two CTAs, one work tile a CTA, and merge their rows through distributed shared memory
  // (split_merge.cuh): no partials, no combine kernel. 0: the partials and the combine.
  int split_merge;
  // Paged (dsv4_attention_paged): one batch of T = seqlen_q tokens with no kv rows (use_kv 0)
  // and no compressed tensor; each token's keys are the rows of its window list, then of its
  // compressed list (page_list[0], [1]), 64 slots per tile, gathered from the FP8 pages and
  // dequantized in the kernel (the CSA machinery: csa_slots carries each tile's mask).
  int paged;
  Mqa512PagedList page_list[2];
  int lse_with_sink;  // 1: lse includes the sink (fmha, dsv4_attention); 0: the keys' only
};

}  // namespace dsv4
