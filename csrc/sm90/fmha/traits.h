// The sm90 fmha kernel's compile-time shape (tile sizes, the register split, shared memory) and
// the barriers that order its roles (kernel.cuh).
//
// Barrier protocol (phase bits flip once per pass over the ring):
//   q_full          producer arrive.expect_tx(Q bytes) + TMA     -> consumers wait
//                   kPublishWorkTiles: the producer writes the round's work-tile index first,
//                   and a tile that sees no key, or the index past the last that ends the
//                   loop, takes a round too, with a plain arrive (the consumers read the index)
//   q_empty         all consumer threads arrive after their last QK^T of a work tile (at
//                   once for a tile that sees no key)            -> producer waits before the
//                                                                   next index and Q
//   k_full[s]       producer arrive.expect_tx(tile bytes) + TMA  -> consumers wait before QK^T
//                   (in the steady state only consumer warpgroup 0: the others take their
//                   turn after it, as in FlashAttention-3)
//   k_empty[s]      one lane per consumer warp arrives after QK^T -> producer waits before reuse
//   v_full[s]       as k_full, for V                             -> consumers wait before PV
//   v_empty[s]      one lane per consumer warp arrives after PV  -> producer waits before reuse
// The producer waits on empty barriers with the opposite parity, so its first pass never
// blocks; it runs up to kStages tiles ahead, overlapping the loads of tile j+1 with compute on
// tile j. Both roles count ring positions (kv_iter) and Q rounds (q_round) across work tiles;
// a work tile that sees no key loads nothing, and its consumers write the empty rows.
// Named barriers (FmhaNamedBarrier): the consumer warpgroups' turns to issue their wgmmas
// (pingpong, consumer.cuh).
#pragma once

#include <cstddef>
#include <cstdint>

#include "ptx/mbarrier.cuh"
#include "sm90/shared/smem.cuh"

namespace dsv4 {

// kBlockN_, keys per tile, is the launcher's (dispatch in fmha_sm90_launch.cuh): 128 at
// head_dim 64; at 128, 176 for full rows and 128 under a causal mask or a window; 80 at 256,
// where the O accumulator takes 128 registers (80 keys spilled in an earlier version of the
// consumers and fit now, 0 spills; 80 against 64 measured +2-15% on every head_dim-256 row,
// benchmarks/NOTES.md).
template <typename Element_, int kHeadDim_, int kBlockN_>
struct FmhaSm90Traits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "head_dim 64/128/256");
  // D = 64 has the least MMA work per softmax element: a third consumer warpgroup keeps the
  // tensor cores fed. Each consumer warpgroup owns 64 query rows.
  static constexpr int kConsumers = kHeadDim == 64 ? 3 : 2;
  static constexpr int kBlockM = 64 * kConsumers;
  static constexpr int kBlockN = kBlockN_;
  static_assert(kBlockN % 16 == 0 && kBlockN <= 256, "keys per tile: a multiple of 16, <= 256");
  static constexpr int kStages = 2;
  // Whether the key tiles that need no mask run a loop of their own, without the per-tile
  // test. At head_dim 64 (three consumers, 160 registers) the split measured 3-5% slower.
  static constexpr bool kSplitMaskLoop = kHeadDim >= 128;
  // Whether a step converts P before O's rescale: after the rescale's branch ptxas keeps every
  // F2FP behind the last exponential, before it they interleave with the ex2s (as
  // FlashAttention-3's do). Measured +2% in the median at head_dim 64 and 128, -3% at 256.
  static constexpr bool kConvertBeforeRescale = kHeadDim <= 128;
  // Whether the producer publishes each work tile's index (sm90/shared/tile_scheduler.cuh), which
  // the dynamic grid needs. The consumers' register allocation then changes: measured 5-10%
  // slower at 176 keys (head_dim 128) and at head_dim 256, so those take static grids only.
  static constexpr bool kPublishWorkTiles = kHeadDim == 64 || (kHeadDim == 128 && kBlockN == 128);
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kConsumerThreads = 128 * kConsumers;
  static constexpr int kConsumerWarps = 4 * kConsumers;  // the K/V empty barriers' arrivals
  static constexpr int kColBlocks = kHeadDim / 64;  // 128-byte swizzle atoms along head_dim
  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kTileBytes = kBlockN * kHeadDim * sizeof(Element);
  static constexpr uint32_t kProducerRegs = 24;
  static constexpr uint32_t kConsumerRegs = kConsumers == 3 ? 160 : 240;
  // setmaxnreg moves registers within the CTA's launch allocation (the per-thread count that
  // __launch_bounds__ allows, a multiple of 8, times the threads), not the SM's 64K.
  static constexpr uint32_t kLaunchRegs = 65536 / kThreads / 8 * 8 * kThreads;
  static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= kLaunchRegs,
                "register budget");

  // Shared memory: Q [D/64][64 C rows][64]; K and V rings of kStages tiles [D/64][kBlockN][64].
  // Every [rows][64] block is one TMA box written with the 128-byte swizzle that wgmma reads.
  struct alignas(1024) SharedStorage {
    Element q[kColBlocks][kBlockM][64];
    Element k[kStages][kColBlocks][kBlockN][64];
    Element v[kStages][kColBlocks][kBlockN][64];
    // The work-tile index the producer published with round r's Q (q_full), in slot r % 2:
    // it is rewritten two rounds later, after this round's epilogue, so the consumers read it
    // again there instead of holding it in a register through the mainloop.
    int work_tile[2];
    uint64_t q_full, q_empty;
    uint64_t k_full[kStages], k_empty[kStages];
    uint64_t v_full[kStages], v_empty[kStages];
  };
  static constexpr size_t kSmemBytes = sizeof(SharedStorage) + 1024;  // + alignment slack
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than an sm_90 block can have");

  // The mbarriers' arrival counts, one phase each (the protocol above).
  static constexpr uint32_t kQFullArrivals = 1;                  // the producer's arrive
  static constexpr uint32_t kQEmptyArrivals = kConsumerThreads;  // every consumer thread
  static constexpr uint32_t kFullArrivals = 1;                   // k_full, v_full: the producer's
  static constexpr uint32_t kEmptyArrivals = kConsumerWarps;     // k_empty, v_empty: a lane a warp

  // A turn's named barrier counts the warpgroup that waits and the one that hands over.
  static constexpr uint32_t kTurnThreads = 256;
};

// Named barriers (bar.sync ids; 0 is __syncthreads's). Consumer warpgroup wg waits on
// kConsumerTurn + wg for its turn to issue wgmmas: ids 1..C.
enum class FmhaNamedBarrier : int {
  kConsumerTurn = 1,
};

// The role functions that run once per work tile (the producer's loads, the consumers' first
// tile and last PV) derive SharedStorage from smem_raw (sm90/shared/smem.cuh) themselves instead
// of taking their context's reference: the compiler then folds their barrier and buffer
// addresses as it did when that code sat in the kernel's body (the cut into roles kept the SASS
// identical).

}  // namespace dsv4
