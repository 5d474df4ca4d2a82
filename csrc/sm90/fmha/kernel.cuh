// sm90a fmha forward: TMA loads, an mbarrier pipeline, wgmma and warp specialization.
//
// Each CTA walks work tiles (a query tile of one (batch, head), or with packed GQA the query
// heads of one KV head, tokens x heads in the rows) and computes each against every visible
// key tile. The producer thread picks the CTA's next work tile (sm90/shared/tile_scheduler.cuh:
// a static stride, or a global counter for the launcher's dynamic grid, fmha_grid). The
// kernels with kPublishWorkTiles publish each index with its Q load (the counter's draws are
// known to the producer alone); the others' consumers follow the static stride themselves.
// Either way the consumers decode each tile themselves.
// Roles (128 threads per warpgroup):
//   warpgroup 0, thread 0  producer: issues every TMA load, then idles (24 registers).
//   warpgroups 1..C        consumers (C = 2, or 3 at head_dim 64), 64 query rows each, with
//                          240 (C = 2) or 160 (C = 3) registers: S = Q K^T (wgmma, both
//                          operands in shared memory), online softmax in registers (its
//                          reference max raised lazily, so most tiles skip O's rescale),
//                          O += P V (wgmma, P from registers). Each warpgroup overlaps the
//                          softmax of tile j with the PV wgmma of tile j-1 (QK^T of tile j is
//                          issued first, then PV of j-1; wait_group 1 releases S_j alone), and the
//                          warpgroups take turns issuing wgmmas (pingpong, named barriers), so
//                          one's softmax overlaps another's GEMMs.
//
// Shared memory: Q [D/64][64 C rows][64]; K and V rings of kStages tiles [D/64][kBlockN][64].
// Every [rows][64] block is one TMA box written with the 128-byte swizzle that wgmma reads.
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
//
// Varlen (the kVarlen instantiations): the tensor maps see the packed tensors as one batch and
// each work tile takes its sequence's rows and lengths from a schedule built on the device
// (csrc/sm90/shared/varlen_schedule.cuh); a tile past its sequence's end loads the next one's
// rows, which the masks exclude and the epilogue never stores.
// Split-KV (dense): when the work tiles cannot fill the SMs, each one's key tiles are cut into
// num_splits ranges (work = tile * num_splits + split); a split writes fp32 partial rows and
// their lse, and the combine kernel (csrc/sm90/shared/split_kv_combine.cuh) folds in the sink.
// Masking: key tiles that no row of the CTA can see (causal, window, past Sk) are never
// loaded; only tiles that straddle a boundary are masked element by element (at head_dim >=
// 128 the tiles every row sees whole run a loop of their own, without the per-tile test).
// Rows that see nothing end with out = 0 and lse = -inf, or the sink-only value when a sink
// is given.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "sm90/shared/fragment_store.cuh"
#include "sm90/shared/key_range.cuh"
#include "sm90/shared/online_softmax.cuh"
#include "sm90/shared/tile_scheduler.cuh"
#include "sm90/fmha/params.h"
#include "ptx/math.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/sync.cuh"
#include "ptx/tma.cuh"
#include "ptx/wgmma.cuh"

namespace dsv4 {

// kBlockN_, keys per tile, is the launcher's (dispatch in fmha_sm90_launch.cuh): 128 at
// head_dim 64; at 128, 176 for full rows and 128 under a causal mask or a window; 80 at 256,
// where the O accumulator takes 128 registers (80 keys spilled in an earlier version of the
// consumers and fit now, 0 spills; 80 against 64 measured +2-15% on every head_dim-256 row,
// benchmarks/NOTES.md).
template <typename Element, int kHeadDim, int kBlockN_>
struct FmhaSm90Traits {
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
};

// Work tile t: a query tile of one (sequence, head group), with that sequence's rows and
// lengths. Dense: sections of FmhaSm90Params::section_units (batch, head group) units whose
// K/V fit in L2 together, so the CTAs running at the same time share them; within a section
// the last query tiles (the ones that see the most keys under a causal mask) come first, the
// section's units innermost. Varlen: the schedule's order (varlen_schedule.cuh: the costliest
// sequences first, each one's tiles section by section), a section's heads consecutive.
// Packed GQA (dense, FmhaSm90Params::pack_heads > 1): a tile's rows are pack_tokens tokens of
// pack_heads query heads of one KV head, so decode and short queries read each K/V tile once
// for the whole group instead of once per query head.
// Dense calls take the lengths from the parameters, by reference (key_range.cuh): a copy
// would hold registers through the mainloop, which the D = 64 and 128 consumers do not have.
struct WorkTile {
  int m_block, head0, batch;  // head0: the tile's first query head; batch: the index into the
                              // tensors' batch dim (0 for varlen)
  int split;                  // dense split-KV: which range of the key tiles (0 without)
  int q_start, k_start;       // the sequence's first row of q/out and of k/v (0 for dense)
  KeyShape shape;             // varlen: its lengths; 0 for an unused schedule slot
};

template <bool kVarlen>
__device__ __forceinline__ WorkTile decode_tile(const FmhaSm90Params& p, int t) {
  if constexpr (kVarlen) {
    const unsigned section_heads = p.section_units;
    const VarlenTile tile = p.varlen_tiles[unsigned(t) / section_heads];
    WorkTile w{tile.m_block, tile.head0 + int(unsigned(t) % section_heads), 0, 0, 0, 0,
               {0, 0, p.causal, p.window_left}};
    if (tile.batch >= 0) {
      const VarlenSequence seq = p.varlen_sequences[tile.batch];
      w.q_start = seq.q_start;
      w.k_start = seq.k_start;
      w.shape.seqlen_q = seq.seqlen_q;
      w.shape.seqlen_k = seq.seqlen_k;
    }
    return w;
  } else {
    // Unsigned: each division is shorter and needs fewer registers (the producer has 24).
    const unsigned num_splits = p.num_splits, num_m_blocks = p.num_m_blocks;
    const unsigned section_units = p.section_units;
    const unsigned head_groups = unsigned(p.heads_q) / unsigned(p.pack_heads);
    unsigned u = t;
    const unsigned split = u % num_splits;  // a work tile's splits are neighbours
    u /= num_splits;
    // Sections of section_units (batch, head group) units, the last query tiles first.
    const unsigned section = u / (num_m_blocks * section_units);
    const unsigned in_section = u - section * (num_m_blocks * section_units);
    const unsigned first_unit = section * section_units;
    const unsigned units = min(section_units, head_groups * unsigned(p.batch) - first_unit);
    const unsigned unit = first_unit + in_section % units;
    return {int(num_m_blocks - 1 - in_section / units), int(unit % head_groups) * p.pack_heads,
            int(unit / head_groups), int(split), 0, 0, {}};
  }
}

// Query tokens per work tile (FmhaSm90Params::pack_tokens; varlen tiles are never packed).
template <bool kVarlen, int kBlockM>
__device__ __forceinline__ int tile_tokens(const FmhaSm90Params& p) {
  return kVarlen ? kBlockM : p.pack_tokens;
}

// The key tiles a work tile's split visits, with the row facts of the whole tile (its mask).
__device__ __forceinline__ KeyTiles split_tiles(KeyTiles tiles, int split, int num_splits) {
  const SplitRange r = split_key_range(tiles.end - tiles.first, split, num_splits);
  tiles.end = tiles.first + r.end;
  tiles.first += r.begin;
  return tiles;
}

// Sets the scores of the keys that this thread's rows {0, 8} cannot see to -inf in the key
// tile starting at n0, if it straddles a boundary. `keys`: the parameters (dense) or the
// sequence's KeyShape. Unpacked, `row` is the query token of the first row; packed, its row in
// the tile, whose token is row % tokens. (Deriving the token from the tile row in both cases
// made ptxas spill in the varlen consumers.)
template <int kBlockN, bool kPacked, typename Keys>
__device__ __forceinline__ void mask_key_tile(const Keys& keys, const KeyTiles& tiles, int row,
                                              int tokens, int col_lane, int n0,
                                              float (&sacc)[kBlockN / 2]) {
  if (!key_tile_needs_mask(keys, tiles, n0, kBlockN)) return;
  int lo[2], hi[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int pos = kPacked ? tiles.pos_lo + (row + 8 * i) % tokens
                            : row + 8 * i + keys.seqlen_k - keys.seqlen_q;
    const KeySpan span = visible_keys(keys, pos);
    lo[i] = span.lo - n0 - col_lane;
    hi[i] = span.hi - n0 - col_lane;
  }
  if (keys.window_left < 0) {  // without a window every row sees the tile's first keys
    mask_outside<kBlockN, false>(sacc, lo, hi);
  } else {
    mask_outside<kBlockN>(sacc, lo, hi);
  }
}

template <typename Element, int kHeadDim, int kBlockN_, bool kVarlen>
__global__ void __launch_bounds__(FmhaSm90Traits<Element, kHeadDim, kBlockN_>::kThreads, 1)
    fmha_sm90_kernel(const __grid_constant__ CUtensorMap tmap_q,
                     const __grid_constant__ CUtensorMap tmap_k,
                     const __grid_constant__ CUtensorMap tmap_v, const FmhaSm90Params p) {
  using T = FmhaSm90Traits<Element, kHeadDim, kBlockN_>;
  constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN, kStages = T::kStages;
  constexpr int kColBlocks = T::kColBlocks;
  constexpr bool kPublish = T::kPublishWorkTiles;
  const float neg_inf = __int_as_float(0xff800000);

  // Aligned by offsetting the __shared__ array itself (not through an integer), so the
  // compiler keeps shared-space addressing (an integer round trip makes accesses generic).
  extern __shared__ uint8_t smem_raw[];
  auto& s = *reinterpret_cast<typename T::SharedStorage*>(
      smem_raw + ((1024 - (ptx::smem_addr(smem_raw) & 1023)) & 1023));

  const uint32_t q_full = ptx::smem_addr(&s.q_full), q_empty = ptx::smem_addr(&s.q_empty);
  if (threadIdx.x == 0) {
    ptx::mbarrier_init(q_full, 1);
    ptx::mbarrier_init(q_empty, T::kConsumerThreads);
    for (int i = 0; i < kStages; ++i) {
      ptx::mbarrier_init(ptx::smem_addr(&s.k_full[i]), 1);
      ptx::mbarrier_init(ptx::smem_addr(&s.v_full[i]), 1);
      ptx::mbarrier_init(ptx::smem_addr(&s.k_empty[i]), T::kConsumerWarps);
      ptx::mbarrier_init(ptx::smem_addr(&s.v_empty[i]), T::kConsumerWarps);
    }
    ptx::fence_barrier_init();
  }
  __syncthreads();

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    // ------------------------------------------------------------------ producer
    ptx::setmaxnreg_dec<T::kProducerRegs>();
    if (threadIdx.x == 0) {
      ptx::tma_prefetch_descriptor(&tmap_q);
      ptx::tma_prefetch_descriptor(&tmap_k);
      ptx::tma_prefetch_descriptor(&tmap_v);
      int kv_iter = 0, q_round = 0;  // ring position and Q rounds, continued across work tiles
      // A Q round: once the consumers' last QK^T of the previous work tile has landed (so a Q
      // load overlaps their last PV and epilogue), arrive on q_full, with Q's bytes when the
      // tile sees a key (the caller's TMA). With kPublish, write the tile's index first.
      auto q_round_begin = [&](int work, bool with_q) {
        ptx::mbarrier_wait(q_empty, (q_round & 1) ^ 1);
        if constexpr (kPublish) s.work_tile[q_round & 1] = work;
        if (with_q) {
          ptx::mbarrier_arrive_expect_tx(q_full, T::kQBytes);
        } else {
          ptx::mbarrier_arrive(q_full);
        }
        ++q_round;
      };
      int work = blockIdx.x;
      while (work < p.num_work) {
        // Drawn now, used once this tile's loads are issued: an atomic's latency hides.
        const int next =
            kPublish ? next_work_tile(p.tile_counter, work) : work + ptx::grid_ctas();
        const WorkTile w = decode_tile<kVarlen>(p, work);
        const int tokens = tile_tokens<kVarlen, kBlockM>(p);
        const int tok0 = w.m_block * tokens;
        const KeyTiles tiles =
            kVarlen ? visible_key_tiles(w.shape, tok0, tokens, kBlockN)
                    : split_tiles(visible_key_tiles(p, tok0, tokens, kBlockN), w.split, p.num_splits);
        const int num_tiles = tiles.end - tiles.first;
        // A tile that sees no key loads nothing (its consumers write the empty rows); with
        // kPublish it still takes a round, to publish its index.
        if (kPublish || num_tiles > 0) q_round_begin(work, num_tiles > 0);
        work = next;
        if (num_tiles == 0) continue;
        for (int cb = 0; cb < kColBlocks; ++cb) {
          ptx::tma_load_4d(ptx::smem_addr(&s.q[cb][0][0]), &tmap_q, q_full, cb * 64,
                           w.q_start + tok0, w.head0, w.batch);
        }
        const int kv_head = w.head0 / p.group;
        for (int it = 0; it < num_tiles; ++it, ++kv_iter) {
          const int stage = kv_iter % kStages;
          const uint32_t phase = (kv_iter / kStages) & 1;
          const int n0 = (tiles.first + it) * kBlockN;
          const uint32_t k_full = ptx::smem_addr(&s.k_full[stage]);
          ptx::mbarrier_wait(ptx::smem_addr(&s.k_empty[stage]), phase ^ 1);
          ptx::mbarrier_arrive_expect_tx(k_full, T::kTileBytes);
          for (int cb = 0; cb < kColBlocks; ++cb) {
            ptx::tma_load_4d(ptx::smem_addr(&s.k[stage][cb][0][0]), &tmap_k, k_full, cb * 64,
                             w.k_start + n0, kv_head, w.batch);
          }
          const uint32_t v_full = ptx::smem_addr(&s.v_full[stage]);
          ptx::mbarrier_wait(ptx::smem_addr(&s.v_empty[stage]), phase ^ 1);
          ptx::mbarrier_arrive_expect_tx(v_full, T::kTileBytes);
          for (int cb = 0; cb < kColBlocks; ++cb) {
            ptx::tma_load_4d(ptx::smem_addr(&s.v[stage][cb][0][0]), &tmap_v, v_full, cb * 64,
                             w.k_start + n0, kv_head, w.batch);
          }
        }
      }
      if constexpr (kPublish) q_round_begin(work, false);  // past the last: the loop ends
    }
    return;
  }

  // -------------------------------------------------------------------- consumers
  ptx::setmaxnreg_inc<T::kConsumerRegs>();
  // Broadcast from lane 0, which ptxas treats as warp-uniform: the Q descriptors, barrier
  // addresses and ring arithmetic then stay in uniform registers (SASS per mask-free key tile at
  // head_dim 128 / 128 keys: 561 -> 488 instructions, 17 R2UR -> 0; FlashAttention-3 does the
  // same and runs 469).
  const int wg = __shfl_sync(0xffffffff, warpgroup - 1, 0);
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  // Accumulator fragment: this thread holds rows r and r + 8 of the warpgroup's 64 rows, and
  // in each 8-column group j the columns 8j + 2 (lane % 4) + {0, 1}:
  //   acc[4j + 2i + c] = (row r + 8i, col 8j + 2 (lane % 4) + c).
  const int col_lane = 2 * (lane % 4);
  const int row0 = wg * 64 + warp * 16 + lane / 4;  // this thread's first row of a work tile
  KeyTiles tiles{};  // the current work tile's visible key tiles
  KeyShape shape{};  // varlen: its sequence's lengths
  int token0 = 0;    // varlen masks: the query token of this thread's first row

  float o[kHeadDim / 2];
  float row_max[2];  // running max of scale * log2(e) * s
  float row_sum[2];  // this thread's partial sum of 2^(x - row_max)

  const uint32_t q_base = ptx::smem_addr(&s.q[0][wg * 64][0]);

  // S = Q K^T for the tile in `stage` (issued, not waited on). Each wgmma's descriptors step
  // from the stage's (smem_desc_advance).
  auto issue_qk = [&](float (&sacc)[kBlockN / 2], int stage) {
    const uint64_t k_desc = ptx::smem_desc_sw128(ptx::smem_addr(&s.k[stage][0][0][0]), 0, 1024);
#pragma unroll
    for (int cb = 0; cb < kColBlocks; ++cb) {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {  // 16 elements = 32 bytes per k-step
        const uint64_t da = ptx::smem_desc_sw128(q_base + cb * kBlockM * 128 + kk * 32, 0, 1024);
        ptx::WgmmaSS<kBlockN, Element>::run(
            sacc, da, ptx::smem_desc_advance(k_desc, cb * kBlockN * 128 + kk * 32),
            (cb | kk) != 0);
      }
    }
  };
  // O += P V for the tile in `stage`; V is read MN-major (head_dim contiguous).
  auto issue_pv = [&](const uint32_t (&pfrag)[kBlockN / 16][4], int stage) {
    const uint64_t v_desc =
        ptx::smem_desc_sw128(ptx::smem_addr(&s.v[stage][0][0][0]), kBlockN * 128, 1024);
#pragma unroll
    for (int t = 0; t < kBlockN / 16; ++t) {
      ptx::WgmmaRS<kHeadDim, Element, 1>::run(o, pfrag[t],
                                              ptx::smem_desc_advance(v_desc, t * 16 * 128), 1);
    }
  };
  // Masks the tile starting at key n0 if `masked` and it straddles a boundary, turns the
  // scores into exponentials (log2 domain; the scale folds into one FMA) and sets the per-row
  // factor that O must be multiplied by once the previous PV has landed.
  auto softmax = [&](float (&sacc)[kBlockN / 2], int n0, float (&correction)[2],
                     bool masked) {
    if (masked) {
      if constexpr (kVarlen) {
        mask_key_tile<kBlockN, false>(shape, tiles, token0, kBlockM, col_lane, n0, sacc);
      } else {
        mask_key_tile<kBlockN, true>(p, tiles, row0, p.pack_tokens, col_lane, n0, sacc);
      }
    }
    online_softmax_update<kBlockN>(sacc, p.scale_log2, row_max, row_sum, correction);
  };

  // The K/V empty barriers count one arrival per consumer warp: a warp's wgmma reads of a
  // buffer are complete once its lanes have passed the wait_group that they execute together.
  // q_empty keeps one arrival per thread: every lane also reads the published work-tile index
  // (a generic shared-memory read), and one lane's arrival would not order the others' reads
  // before the producer rewrites it (compute-sanitizer racecheck reported exactly that).
  auto release = [&](uint32_t bar) {
    if (lane == 0) ptx::mbarrier_arrive(bar);
  };

  // Pingpong: consumer warpgroups take turns to issue their wgmmas (round robin through named
  // barriers 1..C), so one warpgroup's softmax runs while another's GEMMs use the tensor cores.
  // Every warpgroup issues the same number of slots (num_tiles + 1 per work tile); the last
  // warpgroup pre-arrives for the first, and warpgroup 0 consumes the one arrival left at exit.
  constexpr int kSchedulerThreads = 256;  // the waiting warpgroup and the one that hands over
  auto wait_turn = [&] { ptx::named_barrier_sync(1 + wg, kSchedulerThreads); };
  auto pass_turn = [&] {
    ptx::named_barrier_arrive(1 + (wg + 1) % T::kConsumers, kSchedulerThreads);
  };
  if (wg == T::kConsumers - 1) pass_turn();

  int kv_iter = 0, q_round = 0;  // as in the producer
  // The round's work tile: published by the producer (kPublish; read through redux.sync, whose
  // result is in a uniform register: a value loaded from shared memory is per-thread to ptxas,
  // and everything derived from it would be computed per thread), or the static stride's.
  // Read again for the epilogue rather than held in a register through the mainloop: the slot
  // is rewritten two rounds later, after this round's epilogue.
  for (int stride_work = blockIdx.x;; stride_work += ptx::grid_ctas(), q_round += kPublish) {
    auto published_work = [&] {
      if constexpr (kPublish) {
        return __reduce_max_sync(
            0xffffffffu, p.tile_counter == nullptr
                             ? int(blockIdx.x) + q_round * ptx::grid_ctas()
                             : *reinterpret_cast<volatile int*>(&s.work_tile[q_round & 1]));
      } else {
        return stride_work;
      }
    };
    if constexpr (kPublish) ptx::mbarrier_wait(q_full, q_round & 1);
    if (published_work() >= p.num_work) break;
    {
      const WorkTile w = decode_tile<kVarlen>(p, published_work());
      const int tokens = tile_tokens<kVarlen, kBlockM>(p);
      shape = w.shape;
      token0 = w.m_block * kBlockM + row0;
      // The producer derives the same tiles (its split of them) for this work tile.
      tiles = kVarlen ? visible_key_tiles(shape, w.m_block * tokens, tokens, kBlockN)
                      : split_tiles(visible_key_tiles(p, w.m_block * tokens, tokens, kBlockN),
                                    w.split, p.num_splits);
    }
    const int num_tiles = tiles.end - tiles.first;
#pragma unroll
    for (int i = 0; i < kHeadDim / 2; ++i) o[i] = 0.f;
    row_max[0] = row_max[1] = neg_inf;
    row_sum[0] = row_sum[1] = 0.f;

    // Intra-warpgroup overlap: while the softmax of tile j runs on the CUDA cores, the tensor
    // cores work on PV of tile j-1 (and had QK^T of tile j issued just before it).
    if (kPublish && num_tiles == 0) ptx::mbarrier_arrive(q_empty);  // Q was not loaded
    if (num_tiles > 0) {
      if constexpr (!kPublish) ptx::mbarrier_wait(q_full, q_round & 1);
      float sacc[kBlockN / 2];
      uint32_t pfrag[kBlockN / 16][4];
      float correction[2];

      const int first = kv_iter % kStages;
      ptx::mbarrier_wait(ptx::smem_addr(&s.k_full[first]), (kv_iter / kStages) & 1);
      wait_turn();
      ptx::wgmma_fence();
      issue_qk(sacc, first);
      ptx::wgmma_commit();
      pass_turn();
      ptx::wgmma_wait<0>();
  #pragma unroll
      for (int i = 0; i < kBlockN / 2; ++i) ptx::fence_operand(sacc[i]);
      release(ptx::smem_addr(&s.k_empty[first]));
      if (num_tiles == 1) ptx::mbarrier_arrive(q_empty);  // last read of Q in this work tile
      softmax(sacc, tiles.first * kBlockN, correction, true);  // O is still 0: no rescale
      scores_to_a_fragment<Element, kBlockN>(sacc, pfrag);

      // One steady-state key tile: QK^T of tile it and PV of tile it-1 issued, then the softmax
      // of tile it. `masked`: whether the tile may straddle a boundary (tested at run time).
      auto step = [&](int it, bool masked) {
        const int cur = kv_iter + it;
        const int stage = cur % kStages, prev = (cur - 1) % kStages;
        const uint32_t phase = (cur / kStages) & 1, prev_phase = ((cur - 1) / kStages) & 1;
        if (wg == 0) ptx::mbarrier_wait(ptx::smem_addr(&s.k_full[stage]), phase);
        wait_turn();
        ptx::wgmma_fence();
        issue_qk(sacc, stage);
        ptx::wgmma_commit();
        if (wg == 0) ptx::mbarrier_wait(ptx::smem_addr(&s.v_full[prev]), prev_phase);
        ptx::wgmma_fence();  // without it ptxas serializes the wgmmas around the wait (C7520)
        issue_pv(pfrag, prev);
        ptx::wgmma_commit();
        pass_turn();
        ptx::wgmma_wait<1>();  // QK^T of tile it has landed; PV of tile it-1 may still run
  #pragma unroll
        for (int i = 0; i < kBlockN / 2; ++i) ptx::fence_operand(sacc[i]);
        release(ptx::smem_addr(&s.k_empty[stage]));
        if (it == num_tiles - 1) ptx::mbarrier_arrive(q_empty);  // last read of Q
        softmax(sacc, (tiles.first + it) * kBlockN, correction, masked);
        ptx::wgmma_wait<0>();
  #pragma unroll
        for (int i = 0; i < kHeadDim / 2; ++i) ptx::fence_operand(o[i]);
        release(ptx::smem_addr(&s.v_empty[prev]));
        if constexpr (T::kConvertBeforeRescale) scores_to_a_fragment<Element, kBlockN>(sacc, pfrag);
        rescale_rows_unless_one<kHeadDim>(o, correction);
        if constexpr (!T::kConvertBeforeRescale) {
          scores_to_a_fragment<Element, kBlockN>(sacc, pfrag);
        }
      };
      int it = 1;
      if constexpr (T::kSplitMaskLoop) {  // the tiles every row sees whole: no mask test
        const KeySpan free = kVarlen ? mask_free_key_tiles(shape, tiles, kBlockN)
                                     : mask_free_key_tiles(p, tiles, kBlockN);
        const int free_lo = max(free.lo - tiles.first, 1);
        const int free_hi = max(free.hi - tiles.first, free_lo);
        for (; it < free_lo; ++it) step(it, true);
        for (; it < free_hi; ++it) step(it, false);
      }
      for (; it < num_tiles; ++it) step(it, true);

      const int last_iter = kv_iter + num_tiles - 1, last = last_iter % kStages;
      ptx::mbarrier_wait(ptx::smem_addr(&s.v_full[last]), (last_iter / kStages) & 1);
      wait_turn();
      ptx::wgmma_fence();
      issue_pv(pfrag, last);
      ptx::wgmma_commit();
      pass_turn();
      kv_iter += num_tiles;
      if constexpr (!kPublish) ++q_round;
    }

    // ---- epilogue: finish the row sums, fold in the sink, normalise, store out and lse; a
    // split stores its normalised rows in fp32 and their lse without the sink instead. The
    // work tile is decoded again, so that its fields held no registers through the mainloop.
    // Everything up to the stores needs only the row statistics, final since the last
    // softmax: it runs while the last PV is in flight, and O is waited for just before them.
    constexpr float kLog2e = 1.4426950408889634f;
    const WorkTile w = decode_tile<kVarlen>(p, published_work());
    const int tokens = tile_tokens<kVarlen, kBlockM>(p);
    const int seqlen_q = kVarlen ? w.shape.seqlen_q : p.seqlen_q;
    // Row row0 + 8 i of the tile: token[i] of the sequence, query head head[i].
    int token[2], head[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = row0 + 8 * i;
      token[i] = w.m_block * tokens + (kVarlen ? row : row % tokens);
      head[i] = w.head0 + (kVarlen ? 0 : row / tokens);
    }
    // (batch, token) -> the row of q/out in the tensors' (B * Sq) tokens.
    const size_t seq_row0 = static_cast<size_t>(w.batch) * p.seqlen_q + w.q_start;
    const bool split_rows = !kVarlen && p.num_splits > 1;
    float sink_log2[2];
  #pragma unroll
    for (int i = 0; i < 2; ++i) {
      sink_log2[i] = p.sinks != nullptr && !split_rows ? p.sinks[head[i]] * kLog2e : neg_inf;
    }
    float inv[2], lse[2];  // a split's rows leave the sink to the combine
  #pragma unroll
    for (int i = 0; i < 2; ++i) {
      finish_row(row_sum[i], row_max[i], p.sinks != nullptr && !split_rows, sink_log2[i], inv[i],
                 lse[i]);
    }
    // The last PV (none is pending after a tile that saw no key). Unconditional: behind a
    // branch, ptxas serializes every wgmma of the kernel (C7514).
    ptx::wgmma_wait<0>();
  #pragma unroll
    for (int i = 0; i < kHeadDim / 2; ++i) ptx::fence_operand(o[i]);
    if (num_tiles > 0) release(ptx::smem_addr(&s.v_empty[(kv_iter - 1) % kStages]));
    if (split_rows) {  // rows of the split-major [splits][B * Sq * Hq] partials
      const size_t part0 = static_cast<size_t>(w.split) * p.batch * p.seqlen_q * p.heads_q;
  #pragma unroll
      for (int i = 0; i < 2; ++i) {
        if (token[i] < seqlen_q) {
          const size_t part_row = part0 + (seq_row0 + token[i]) * p.heads_q + head[i];
  #pragma unroll
          for (int j = 0; j < kHeadDim / 8; ++j) {
            *reinterpret_cast<float2*>(p.o_partial + part_row * kHeadDim + 8 * j + col_lane) =
                make_float2(o[4 * j + 2 * i] * inv[i], o[4 * j + 2 * i + 1] * inv[i]);
          }
          if (lane % 4 == 0) p.lse_partial[part_row] = lse[i];
        }
      }
      continue;
    }
    Element* out = static_cast<Element*>(p.out);
  #pragma unroll
    for (int i = 0; i < 2; ++i) {
      const bool valid = token[i] < seqlen_q;
      const size_t row_offset = ((seq_row0 + token[i]) * p.heads_q + head[i]) * kHeadDim;
      store_fragment_row<Element, kHeadDim>(o, i, inv[i], out + row_offset, valid, lane);
      if (valid && lane % 4 == 0) {
        p.lse[(static_cast<size_t>(w.batch) * p.heads_q + head[i]) * p.seqlen_q + w.q_start +
              token[i]] = lse[i];
      }
    }
  }
  if (wg == 0) wait_turn();  // the last hand-over (or the pre-arrival) is still open
}

}  // namespace dsv4
