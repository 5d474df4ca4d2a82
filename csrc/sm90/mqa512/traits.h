// The sm90a head_dim-512 shared-KV kernel (DeepSeek-V4's MQA, and GQA at head_dim 512): its
// numbers, shared storage, barriers and register split. The kernel is cut into a shell
// (kernel.cuh) and role functions: producer.cuh (work tiles, Q, key tiles by TMA or gather),
// consumer.cuh (the two consumer warpgroups' seesaw schedule) and epilogue.cuh; work.cuh holds
// the work-tile vocabulary they share.
//
// Each CTA walks 64-row work tiles: tile_tokens tokens x tile_heads query heads of one KV head
// (one token x 64 heads when there are 64 or more per KV head), so every key tile it loads
// serves all 64 rows. Q's TMA box is (64 dims, tile_tokens, tile_heads), so the rows land
// tokens innermost: row = head * tile_tokens + token.
// Roles (128 threads per warpgroup):
//   warpgroup 0     producers: each work tile decoded once, by thread 0, for everyone (the tile
//                   ring; the consumers only copy it); TMA loads of Q (once per work tile,
//                   thread 0) and of the key tiles (64 keys x 512, in two halves of 256 dims);
//                   warps 2s and 2s + 1 fill stage s, alternate 64-column blocks each. Each tile
//                   is read as K and V. CSA tiles have no TMA box: the warps gather their rows
//                   with 16-byte cp.async (zero-filled where an index is not visible), reading
//                   the token's list a stage ahead, and leave the tile's visible slots and
//                   its token in csa_slots for the consumer's mask. A work tile
//                   of several tokens (fewer than 64 heads) walks each token's list in turn;
//                   the other tokens' rows see none of those slots.
//   warpgroups 1-2  consumers 0 and 1. Consumer w owns O[:, 256w : 256w + 256] and computes
//                   S = Q K^T (all 512 dims) for the key tiles of stage w: the even tiles of a
//                   work tile for w = 0, the odd ones for w = 1. Each pair of tiles is one step
//                   of the softmax, in order: consumer 0 folds its S into the row max and
//                   publishes it; consumer 1 folds in its own (that is the pair's max) and
//                   publishes it; consumer 0 then rescales its P to that max. Each consumer adds
//                   both tiles' P V for its columns, the other's P from shared memory (consumer
//                   1's own P from registers; consumer 0's own through shared memory too, which
//                   keeps it under its register budget). While one consumer exponentiates, the
//                   other's wgmmas run (FlashMLA's "seesaw" schedule for sm90 MLA decoding), and
//                   each score is exponentiated once.
// Shared memory: Q [8][64 rows][64] and the two stages [2][8][64 keys][64], each [64][64] block
// one TMA box with the 128-byte swizzle that wgmma reads; the P tiles [3][64][64] in the same
// layout; the row maxima [2][64] and row sums [2][2][64] the consumers exchange; the rows' sinks
// [2][64], loaded with Q; the tile ring [2] and the CSA slot masks and tokens [2 stages].
//
// Barrier protocol (phase bits flip once per fill; Mqa512Progress carries them across work tiles):
//   q_full            producer arrive.expect_tx(64 KB) + TMA, and with sinks 32 more arrivals:
//                     warp 0's cp.async of the rows' sinks into sink[fill parity]
//                                                                   -> consumers wait
//   tile_full[t]      producer thread 0 wrote work tile t's Mqa512TileInfo into tile_ring[t]
//                     (t: the tile's parity in the CTA's sequence)     -> consumers wait
//   tile_empty[t]     the 6 lanes of each consumer warp that copied tile_ring[t] (48
//                     arrivals)                               -> producer, before writing it
//   q_empty           each consumer thread after its last QK^T of the work tile (consumer 1
//                     of a one-tile work tile at once)            -> producer, before next Q
//   kv_full[s][c]     one per 64-column block c of stage s, one arrival: lane 0's
//                     expect_tx(8 KB) with the block's TMA box, or, for a gather, lane 0's
//                     after a __syncwarp, every lane's cp.async.mbarrier.arrive holding the
//                     phase open until its copies land (the readers then fence the proxies),
//                     and for a paged gather either the same, its fp8 bytes staged in the
//                     block's upper half for the consumer to convert (kPagedStaged), or
//                     (kPaged) lane 0's after every lane waited for its copies,
//                     converted them and fenced the proxies, and the warp synced
//                     -> readers of that block (Q K^T starts on the first block that lands)
//   kv_empty[s][h]    half h of stage s is read by consumer s (QK^T) and consumer h (P V):
//                     128 arrivals when s == h (after consumer s's own P V), else 256
//                     (consumer s after its QK^T, consumer h after its P V with the other's P)
//                     -> producer, before refilling the half. Stage s's half s is loaded
//                     first: its consumer multiplies it first, and it is released first.
//   handoff[h]        one-way handoffs between the consumers, 128 arrivals (every thread of
//                     the sending consumer), waited on by the other consumer (Mqa512Handoff).
//                     kMax0Ready, kMax1Ready and kP0Ready complete once per pair, i.e. per fill
//                     of stage 0, kP1Ready once per fill of stage 1: they share those parities.
//                     kRowSums (256 arrivals, both wait) is double-buffered by work-tile parity.
//   paged_converted[s] kPagedStaged only: consumer s converts each block of
//                     its tile (fp8 to the tile's type, in place) before its Q K^T reads it,
//                     and thread 0 arrives once the other half (the one consumer 1 - s's P V
//                     reads) is converted -> consumer 1 - s, before that P V (it shares
//                     kv_full's parities)
//   merge_free        split_merge (a cluster of two CTAs, the splits of one work tile; this
//                     CTA's rank k): kThreads arrivals, every thread of the other CTA once it
//                     is done with its key stages (consumers: their last wgmma; producer: its
//                     copies landed), so they may take rows -> consumer 1 - k here, before it
//                     sends its columns there
//   merge_full        split_merge: 128 arrivals, the other CTA's consumer k after sending its
//                     columns -> consumer k here, before the merge (split_merge.cuh). Both
//                     complete once: one work tile per CTA.
//   named barrier kPOwn0Ready: consumer 0's 128 threads stored p_own0 (before its own P V)
//   named barrier kPagedBlockConverted + s: consumer s's 128 threads read a paged block's
//                     staged bytes, then wrote and fenced its converted rows
//   The pair order makes each reuse safe: a consumer writes row_max / p for pair i + 1 only
//   after the other has waited for its pair-i data.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "ptx/mbarrier.cuh"
#include "sm90/kv_cache/format.h"

namespace dsv4 {

template <typename Element>
struct Mqa512Sm90Traits {
  static constexpr int kHeadDim = 512;
  static constexpr int kBlockM = 64;   // packed rows per work tile
  static constexpr int kBlockN = 64;   // keys per tile
  static constexpr int kColBlocks = kHeadDim / 64;  // 128-byte swizzle atoms along head_dim
  static constexpr int kHalfBlocks = kColBlocks / 2;  // each consumer's half of head_dim
  static constexpr int kThreads = 384;
  static constexpr int kConsumerThreads = 256;
  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kBlockBytes = kBlockN * 64 * sizeof(Element);  // one TMA box
  static constexpr int kTileInfoInts = 24;  // >= sizeof(Mqa512TileInfo) / 4, a multiple of 4
  static constexpr int kTileCopyLanes = kTileInfoInts / 4;  // lanes copying a ring slot, 16 B each
  // setmaxnreg moves registers only within the CTA's launch allocation (168 per thread at 384
  // threads). The producer's CSA gather needs 56 (48 spill), which leaves the consumers 224.
  static constexpr uint32_t kProducerRegs = 56, kConsumerRegs = 224;
  static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= kThreads * 168,
                "register budget: the CTA's launch allocation");
  // The paged instantiation's producer converts FP8 rows: at 56 its fp16 build spilled its
  // tile-loop state; its consumers fit 216.
  static constexpr uint32_t kPagedProducerRegs = 72, kPagedConsumerRegs = 216;
  static_assert(128 * kPagedProducerRegs + kConsumerThreads * kPagedConsumerRegs <= kThreads * 168,
                "register budget: the CTA's launch allocation");

  struct alignas(1024) SharedStorage {
    Element q[kColBlocks][kBlockM][64];
    // [stage][column block][key][dim]: stage w holds the key tiles consumer w multiplies by Q
    // (w = 0 the even tiles of a work tile, w = 1 the odd ones).
    Element kv[2][kColBlocks][kBlockN][64];
    Element p[2][kBlockM][kBlockN];  // [w]: consumer w's P, for the other consumer's P V
    Element p_own0[kBlockM][kBlockN];  // consumer 0's P for its own P V (see the consumers)
    float row_max[2][kBlockM];       // [w]: the running max after consumer w's softmax step
    float row_scale[kBlockM];        // consumer 0's factor to the pair's max (see publish)
    // The work tiles the producer decoded (Mqa512TileInfo), by tile parity, and each consumer
    // warp's copy of its current one, kept here rather than in registers through the key loop.
    alignas(16) int tile_ring[2][kTileInfoInts];
    alignas(16) int tile_info[8][kTileInfoInts];
    float row_sum[2][2][kBlockM];    // [work-tile parity][w]: the row sums both consumers need
    float sink[2][kBlockM];          // [Q fill parity]: the rows' sinks, loaded with Q
    // [stage]: a CSA tile's visible slots (key rows 0-31, 32-63) and the token of the work tile
    // whose list it holds (one 16-byte read for the consumer's mask).
    alignas(16) uint32_t csa_slots[2][4];
    // Paged: [stage][producer warp of the stage][key row]: each gathered row's scale row (the
    // UE8M0 byte of each 64-dim tile), copied once a tile by each of the stage's warps (each
    // completes on its own blocks' barriers) and read by whoever converts the warp's blocks.
    alignas(8) uint8_t paged_scale[2][2][kBlockN][kKvScaleBytes];
    uint64_t q_full, q_empty;
    uint64_t kv_full[2][kColBlocks];  // [stage][64-column block]
    uint64_t kv_empty[2][2];          // [stage][half of head_dim]
    uint64_t handoff[5];              // [Mqa512Handoff]
    uint64_t tile_full[2], tile_empty[2];  // [tile parity]: the tile ring
    uint64_t paged_converted[2];           // [stage]: kPagedStaged only (traits' protocol)
    uint64_t merge_free, merge_full;       // split_merge only (traits' protocol)
  };
  static constexpr size_t kSmemBytes = sizeof(SharedStorage) + 1024;  // + alignment slack
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than an sm_90 block can have");
};

// The narrow form (narrow_consumer.cuh, mqa512_narrow_sm90_kernel): CSA at 16 or fewer query
// heads per KV head, where a 64-row work tile of several tokens would multiply every token's
// listed rows by the other tokens' rows too. A work tile is one token's heads, padded to 16, and
// the products are turned around, S^T = K Q^T and O^T += V^T P^T, so the heads are wgmma's N
// and no row of an MMA belongs to another token.
//   warpgroup 0     producers, as in the seesaw kernel (the same per-tile body): warps 2c and
//                   2c + 1 fill the key tiles g (the CTA's running tile count) with g % 2 == c.
//   warpgroups 1-2  consumer c takes the tiles g % 2 == c, each whole: S^T over all 512 dims,
//                   its own softmax, O^T over all 512 dims. At the end of the work tile the one
//                   that took the last tile adds the other's partial result to its own and
//                   stores the token; the other hands it over without waiting and goes on.
// Shared memory: Q [8][16 heads][64] (heads past the group stay zero), three key stages in a
// ring (tile g in stage g % 3), each consumer's P^T [16][64] (wgmma's B operand), and the
// handed-over max and sums. The partial O^T (32 KB of fp32) goes to the second half of the
// stage of the handing consumer's last tile, which it keeps instead of releasing.
// Barriers: tile g uses set g % 6, one per (stage, consumer), so a set's fills and releases
// alternate between one producer pair and one consumer (with one set per stage, a pair two
// fills ahead read the other consumer's parity as passed).
//   kv_full[set][cb]  as the seesaw kernel's, one arrival per 64-column block
//   kv_empty[set][h]  128 arrivals: the tile's consumer after its P V of half h (the merging
//                     consumer instead, for the half holding the other's partial O^T); the
//                     producer of tile g + 3 (the same stage) waits on tile g's set
//   partial_ready[b]  128 arrivals: the handing consumer wrote its max, sums and partial O^T
//                     (handoff k uses b = k % 2, as do partner_stats; the handing consumer can
//                     run one work tile ahead, not two: the next Q waits for the merger)
//   q_full, q_empty, tile_full, tile_empty: as the seesaw kernel's
template <typename Element>
struct Mqa512NarrowTraits {
  static constexpr int kHeadDim = 512;
  static constexpr int kBlockM = 16;  // query heads per work tile, padded: wgmma's N
  static constexpr int kBlockN = 64;
  static constexpr int kColBlocks = kHeadDim / 64;
  static constexpr int kHalfBlocks = kColBlocks / 2;
  static constexpr int kStages = 3, kSets = 6;
  static constexpr int kThreads = 384;
  static constexpr int kConsumerThreads = 256;
  static constexpr uint32_t kBlockBytes = kBlockN * 64 * sizeof(Element);
  static constexpr int kTileInfoInts = 24;
  static constexpr int kTileCopyLanes = kTileInfoInts / 4;
  static constexpr uint32_t kProducerRegs = 72, kConsumerRegs = 216;
  static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= kThreads * 168,
                "register budget: the CTA's launch allocation");

  struct alignas(1024) SharedStorage {
    Element q[kColBlocks][kBlockM][64];
    Element kv[kStages][kColBlocks][kBlockN][64];
    Element p[2][kBlockM][kBlockN];  // [consumer]: P^T, [head][key], 128-byte swizzled
    float head_max[2][4][kBlockM];   // [consumer][warp][head]: the tile's max per warp
    float partner_stats[2][5][kBlockM];  // [handoff parity]: max, then each warp's sums
    float own_sums[2][2][4][kBlockM];    // [consumer][parity][warp]: the merger's own sums
    alignas(16) int tile_ring[2][kTileInfoInts];
    alignas(16) int tile_info[8][kTileInfoInts];
    float sink[2][kBlockM];          // [Q fill parity]
    alignas(16) uint32_t csa_slots[kStages][4];
    uint64_t q_full, q_empty;
    uint64_t kv_full[kSets][kColBlocks];
    uint64_t kv_empty[kSets][2];
    uint64_t partial_ready[2];
    uint64_t tile_full[2], tile_empty[2];
  };
  static constexpr size_t kSmemBytes = sizeof(SharedStorage) + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than an sm_90 block can have");
};

template <typename Traits, typename Storage>
__device__ __forceinline__ void mqa512_narrow_init_barriers(Storage& s, bool sinks_with_q) {
  ptx::mbarrier_init(ptx::smem_addr(&s.q_full), sinks_with_q ? 1 + 32 : 1);
  ptx::mbarrier_init(ptx::smem_addr(&s.q_empty), Traits::kConsumerThreads);
  for (int set = 0; set < Traits::kSets; ++set) {
    for (int cb = 0; cb < Traits::kColBlocks; ++cb) {
      ptx::mbarrier_init(ptx::smem_addr(&s.kv_full[set][cb]), 1);
    }
    for (int half = 0; half < 2; ++half) {
      ptx::mbarrier_init(ptx::smem_addr(&s.kv_empty[set][half]), 128);
    }
  }
  for (uint32_t slot = 0; slot < 2; ++slot) {
    ptx::mbarrier_init(ptx::smem_addr(&s.tile_full[slot]), 1);
    ptx::mbarrier_init(ptx::smem_addr(&s.tile_empty[slot]), 8 * Traits::kTileCopyLanes);
    ptx::mbarrier_init(ptx::smem_addr(&s.partial_ready[slot]), 128);
  }
  ptx::fence_barrier_init();
}

// One-way handoffs between the two consumer warpgroups (mbarriers: s.handoff[h]).
enum Mqa512Handoff : int {
  kMax0Ready = 0,  // consumer 0 wrote its row max for this pair of key tiles
  kMax1Ready = 1,  // consumer 1 wrote the pair's row max
  kP0Ready = 2,    // consumer 0 stored its P, rescaled to the pair's max
  kP1Ready = 3,    // consumer 1 stored its P
  kRowSums = 4,    // both consumers stored their row sums (256 arrivals: a two-party barrier)
  kNumHandoffs = 5,
};
// Named barriers (0 is __syncthreads).
enum Mqa512Barrier : uint32_t {
  kPOwn0Ready = 1,  // consumer 0 only (128 threads): all of it stored p_own0
  kPagedBlockConverted = 2,  // the paged seesaw kernel, + consumer: see the protocol above
  // The narrow form, consumer c's 128 threads: 2 + c its warps' head maxima written, 4 + c its
  // P^T stored, 6 + c (when it merges) its warps' sums written, the other's partial read, its
  // rows staged.
  kNarrowMaxReady = 2,
  kNarrowPReady = 4,
  kNarrowSumsReady = 6,
};

// The arrival counts of every barrier above (thread 0, before the CTA's first __syncthreads).
// sinks_with_q: warp 0's 32 sink copies also arrive on q_full.
template <typename Traits, typename Storage>
__device__ __forceinline__ void mqa512_init_barriers(Storage& s, bool sinks_with_q,
                                                     bool split_merge) {
  ptx::mbarrier_init(ptx::smem_addr(&s.q_full), sinks_with_q ? 1 + 32 : 1);
  ptx::mbarrier_init(ptx::smem_addr(&s.q_empty), Traits::kConsumerThreads);
  for (int stage = 0; stage < 2; ++stage) {
    for (int cb = 0; cb < Traits::kColBlocks; ++cb) {
      ptx::mbarrier_init(ptx::smem_addr(&s.kv_full[stage][cb]), 1);
    }
    for (int half = 0; half < 2; ++half) {
      // Half h of stage w is read by consumer w (Q K^T) and by consumer h (P V).
      ptx::mbarrier_init(ptx::smem_addr(&s.kv_empty[stage][half]), stage == half ? 128 : 256);
    }
  }
  for (int h = 0; h < kNumHandoffs; ++h) {
    ptx::mbarrier_init(ptx::smem_addr(&s.handoff[h]), h == kRowSums ? 256 : 128);
  }
  for (uint32_t slot = 0; slot < 2; ++slot) {
    ptx::mbarrier_init(ptx::smem_addr(&s.tile_full[slot]), 1);
    ptx::mbarrier_init(ptx::smem_addr(&s.tile_empty[slot]), 8 * Traits::kTileCopyLanes);
  }
  if (split_merge) {
    ptx::mbarrier_init(ptx::smem_addr(&s.merge_free), Traits::kThreads);
    ptx::mbarrier_init(ptx::smem_addr(&s.merge_full), 128);
  }
  ptx::fence_barrier_init();
}

// Trace slots and points (csrc/sm90/shared/trace.cuh; compiled in only with -DDSV4_TRACE, by
// benchmarks/profile/mqa512_harness). Slots: consumer w is slot w, producer warp i slot 2 + i.
enum Mqa512TracePoint : int {
  // producer warps: waiting for half h of stage s (2s + h; the narrow form's three stages 0-5),
  // its TMA issued (70 + 2s + h)
  kTraceKvEmptyWait = 0,
  kTraceKvIssued = 70,
  kTraceQIssued = 8,
  kTraceQEmptyWait = 9,
  // paged producer warps: its copies of half h of stage s landed (50 + 2s + h), its blocks
  // converted and arrived (54 + 2s + h)
  kTracePagedLanded = 50,
  kTracePagedConverted = 54,
  // consumers: the work tile taken, Q landed
  kTraceTileStart = 1,
  kTraceQFull = 2,
  // consumer 0's pair step
  kTrace0Exp = 10,
  kTrace0MaxPublished = 11,
  kTrace0POwnStored = 12,
  kTrace0KvReleased = 13,
  kTrace0PairMax = 14,
  kTrace0PPublished = 15,
  kTrace0P1Ready = 16,
  kTrace0PvOtherIssued = 17,
  // either consumer's Q K^T of its own tile
  kTraceQkFirstHalf = 20,
  kTraceQkBetween = 21,
  kTraceQkSecondHalf = 22,
  kTraceQkDone = 23,
  // consumer 1's pair step
  kTrace1Start = 30,
  kTrace1Max0Ready = 31,
  kTrace1MaxPublished = 32,
  kTrace1PPublished = 33,
  kTrace1P0Ready = 35,
  kTrace1PvOtherIssued = 36,
  kTrace1OwnPvDone = 37,
  kTrace1KvReleased = 38,
  // the epilogue: row sums exchanged, rows stored; merging splits in a cluster, the other CTA's
  // stages free (the sender), the columns sent (the sender), the other CTA's columns in and
  // folded (the owner)
  kTraceRowSums = 40,
  kTraceStored = 41,
  kTraceMergeFree = 42,
  kTraceMergeSent = 43,
  kTraceMergeIn = 44,
  kTraceMergeFolded = 45,
  // the narrow form's consumers: the work tile taken, a key tile's first column block landed,
  // S^T done, P^T stored, P V done, the end of the work tile, the other's partial in (merger),
  // the token stored (merger)
  kTraceNarrowTake = 60,
  kTraceNarrowFirstBlock = 61,
  kTraceNarrowQkDone = 62,
  kTraceNarrowPReady = 63,
  kTraceNarrowPvDone = 64,
  kTraceNarrowEnd = 65,
  kTraceNarrowPartialIn = 66,
  kTraceNarrowStored = 67,
};

}  // namespace dsv4
