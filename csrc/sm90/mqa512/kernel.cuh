// sm90a attention at head_dim 512 with one KV tensor read as both K and V (DeepSeek-V4's
// shared-KV MQA, and GQA), the query heads that share a KV head packed into the M dimension.
//
// Each CTA walks 64-row work tiles: tile_tokens tokens x tile_heads query heads of one KV head
// (one token x 64 heads when there are 64 or more per KV head), so every key tile it loads
// serves all 64 rows. Q's TMA box is (64 dims, tile_tokens, tile_heads), so the rows land
// tokens innermost: row = head * tile_tokens + token.
// Roles (128 threads per warpgroup):
//   warpgroup 0           producers: each work tile decoded once, by thread 0, for everyone
//                          (the tile ring; the consumers only copy it); TMA loads of Q (once
//                          per work tile, thread 0) and of the key tiles (64 keys x 512, in
//                          two halves of 256 dims); warps 2s and 2s + 1 fill stage s,
//                          alternate 64-column blocks each. Each tile is read as K and V. CSA
//                          tiles have no TMA box: the warps gather their rows with 16-byte
//                          cp.async (zero-filled where an index is not visible), reading the
//                          token's list a stage ahead, and leave the tile's visible slots in
//                          csa_valid for the consumer's mask.
//   warpgroups 1, 2        consumers 0 and 1. Consumer w owns O[:, 256w : 256w + 256] and
//                          computes S = Q K^T (all 512 dims) for the key tiles of stage w: the
//                          even tiles of a work tile for w = 0, the odd ones for w = 1. Each
//                          pair of tiles is one step of the softmax, in order: consumer 0
//                          folds its S into the row max and publishes it; consumer 1 folds in
//                          its own (that is the pair's max) and publishes it; consumer 0 then
//                          rescales its P to that max. Each consumer adds both tiles' P V for
//                          its columns, the other's P from shared memory (consumer 1's own P
//                          from registers; consumer 0's own through shared memory too, which
//                          keeps it under its register budget). While one consumer
//                          exponentiates, the other's wgmmas run (FlashMLA's "seesaw" schedule
//                          for sm90 MLA decoding), and each score is exponentiated once.
// Shared memory: Q [8][64 rows][64] and the two stages [2][8][64 keys][64], each [64][64] block
// one TMA box with the 128-byte swizzle that wgmma reads; the P tiles [3][64][64] in the same
// layout; the row maxima [2][64] and row sums [2][2][64] the consumers exchange; the rows' sinks
// [2][64], loaded with Q; the tile ring [2] and the CSA slot masks [2 stages][64 bits].
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
//                     phase open until its copies land (the readers then fence the proxies)
//                     -> readers of that block (Q K^T starts on the first block that lands)
//   kv_empty[s][h]    half h of stage s is read by consumer s (QK^T) and consumer h (P V):
//                     128 arrivals when s == h (after consumer s's own P V), else 256
//                     (consumer s after its QK^T, consumer h after its P V with the other's P)
//                     -> producer, before refilling the half. Stage s's half s is loaded
//                     first: its consumer multiplies it first, and it is released first.
//   handoff[h]        one-way handoffs between the consumers, 128 arrivals (every thread of
//                     the sending consumer), waited on by the other consumer:
//     kMax0Ready  consumer 0 wrote row_max[0]      kMax1Ready  consumer 1 wrote row_max[1]
//     kP0Ready    consumer 0 stored p[0]           kP1Ready    consumer 1 stored p[1]
//                     (row_scale is consumer 0's alone: published with kP0Ready only to order
//                     its O rescale). The first three complete once per pair, i.e. per fill
//                     of stage 0, kP1Ready once per fill of stage 1: they share those parities.
//     kRowSums    both consumers stored their row sums at the end of a work tile: 256
//                 arrivals, both wait (neither passes phase t + 1 before the other arrived
//                 at it), double-buffered by work-tile parity
//   named barrier kPOwn0Ready: consumer 0's 128 threads stored p_own0 (before its own P V)
//   The pair order makes each reuse safe: a consumer writes row_max / p for pair i + 1 only
//   after the other has waited for its pair-i data.
// Keys come in two segments, walked as one sequence of tiles in one online softmax: the rows
// of kv (fmha's visibility: causal, window) and, for dsv4_attention, the closed rows of
// compressed_kv (row w is closed for position t iff w < min(Sc, (t + 1) / r)): all of them
// (HCA, TMA tiles), or the K listed for the tile's token (CSA: one token per tile, 64 listed
// slots per tile; a slot is visible iff its index is closed).
// Split-KV: when the work tiles cannot fill the SMs, each is cut into num_splits ranges of its
// key tiles (work = tile * num_splits + split); a split writes fp32 partial rows and their lse,
// and the combine kernel (csrc/sm90/shared/split_kv_combine.cuh) folds in the sink.
// Masking: key tiles no row can see are never loaded; only boundary tiles are masked, per
// element, from each row's token position (csrc/sm90/shared/key_range.cuh). Rows that see
// nothing end with out = 0 and lse = -inf, or the sink-only value with a sink.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "sm90/shared/fragment_store.cuh"
#include "sm90/shared/key_range.cuh"
#include "sm90/shared/online_softmax.cuh"
#include "sm90/mqa512/params.h"
#include "ptx/cp_async.cuh"
#include "ptx/math.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/sync.cuh"
#include "ptx/tma.cuh"
#include "ptx/wgmma.cuh"

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
  // setmaxnreg moves registers only within the CTA's launch allocation (168 per thread at 384
  // threads). The producer's CSA gather needs 56 (48 spill), which leaves the consumers 224.
  static constexpr uint32_t kProducerRegs = 56, kConsumerRegs = 224;
  static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= kThreads * 168,
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
    uint32_t csa_valid[2][2];        // [stage][key rows 0-31, 32-63]: a CSA tile's visible slots
    uint64_t q_full, q_empty;
    uint64_t kv_full[2][kColBlocks];  // [stage][64-column block]
    uint64_t kv_empty[2][2];          // [stage][half of head_dim]
    uint64_t handoff[5];              // [Mqa512Handoff]
    uint64_t tile_full[2], tile_empty[2];  // [tile parity]: the tile ring
  };
  static constexpr size_t kSmemBytes = sizeof(SharedStorage) + 1024;  // + alignment slack
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than an sm_90 block can have");
};

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
};

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

// The key tiles a work tile visits: num_kv kv tiles from key kv_key0 on, then compressed tiles
// [0, num_c). Producer and consumers derive the same sequence. The kv tiles start at the first
// visible key, not at a multiple of 64: a token's 128-key window is two tiles instead of three,
// and none of them needs a mask once the window is full.
struct Mqa512KeySegments {
  KeyTiles kv;  // pos_lo, pos_hi: the tile's first and last token positions
  int kv_key0;
  int num_kv, num_c;
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

__device__ __forceinline__ Mqa512KeySegments mqa512_key_segments(const Mqa512Sm90Params& p,
                                                                 const Mqa512WorkTile& w,
                                                                 int block_n) {
  Mqa512KeySegments k;
  k.kv = visible_key_tiles(w.shape, w.tok0, p.tile_tokens, block_n);
  k.kv_key0 = visible_keys(w.shape, k.kv.pos_lo).lo;
  const int kv_keys = visible_keys(w.shape, k.kv.pos_hi).hi - k.kv_key0;
  k.num_kv = p.use_kv && kv_keys > 0 ? (kv_keys + block_n - 1) / block_n : 0;
  if (p.compress_ratio == 0) {
    k.num_c = 0;
  } else if (p.topk != nullptr) {
    k.num_c = (p.topk_k + block_n - 1) / block_n;  // listed slots, 64 per tile
  } else {
    k.num_c = (mqa512_closed_rows(p, w, k.kv.pos_hi) + block_n - 1) / block_n;
  }
  return k;
}

// Whether the kernel folds in the sinks, which then travel with Q (a split's rows leave them to
// the combine kernel).
__device__ __forceinline__ bool mqa512_sinks_with_q(const Mqa512Sm90Params& p) {
  return p.sinks != nullptr && p.num_splits == 1;
}

// CSA: the compressed row in slot `slot` of a token's list (`listed`, K entries), or -1 where
// it is not visible (past K, negative, or not below `closed` = min(Sc, (t + 1) / r)).
__device__ __forceinline__ int mqa512_listed_row(const int* listed, int topk_k, int closed,
                                                 int slot) {
  const int w = slot < topk_k ? listed[slot] : -1;
  return w >= 0 && w < closed ? w : -1;
}

// A CTA's place in its loop over work tiles, in one register (the consumers are at their
// register budget): the work tile (bits 5 and up, so fewer than 2^26 work tiles; the launcher
// checks) and the parities barriers are waited on with (only parities matter): bit s, the fills
// of stage s so far (s = 0, 1); bit 2, the Q loads; bits 3-4, a count of the CTA's work tiles:
// bit 3 (the tile's parity) picks its slot of the tile ring and its row-sum buffer, bit 4 is
// that slot's fill parity.
constexpr int kMqa512MaxWork = 1 << 26;
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

template <typename Element>
__global__ void __launch_bounds__(Mqa512Sm90Traits<Element>::kThreads, 1)
    mqa512_sm90_kernel(const __grid_constant__ CUtensorMap tmap_q,
                       const __grid_constant__ CUtensorMap tmap_kv,
                       const __grid_constant__ CUtensorMap tmap_c, const Mqa512Sm90Params p) {
  using T = Mqa512Sm90Traits<Element>;
  constexpr int kBlockN = T::kBlockN, kColBlocks = T::kColBlocks, kHalf = T::kHalfBlocks;
  const float neg_inf = __int_as_float(0xff800000);

  // Aligned by offsetting the __shared__ array itself (not through an integer), so the
  // compiler keeps the shared address space: 32-bit LDS/STS instead of generic accesses.
  extern __shared__ uint8_t smem_raw[];
  auto& s = *reinterpret_cast<typename T::SharedStorage*>(
      smem_raw + ((1024 - (ptx::smem_addr(smem_raw) & 1023)) & 1023));

  const int num_work = p.num_work;
  constexpr int kTileCopyLanes = T::kTileInfoInts / 4;  // lanes copying a ring slot, 16 B each
  const uint32_t q_full = ptx::smem_addr(&s.q_full), q_empty = ptx::smem_addr(&s.q_empty);
  auto kv_full = [&](int stage, int cb) { return ptx::smem_addr(&s.kv_full[stage][cb]); };
  auto kv_empty = [&](int stage, int half) { return ptx::smem_addr(&s.kv_empty[stage][half]); };
  auto tile_full = [&](uint32_t slot) { return ptx::smem_addr(&s.tile_full[slot]); };
  auto tile_empty = [&](uint32_t slot) { return ptx::smem_addr(&s.tile_empty[slot]); };
  static_assert(sizeof(Mqa512TileInfo) <= sizeof(s.tile_ring[0]), "tile_ring too small");
  auto ring = [&](uint32_t slot) -> Mqa512TileInfo& {
    return *reinterpret_cast<Mqa512TileInfo*>(&s.tile_ring[slot][0]);
  };
  if (threadIdx.x == 0) {
    ptx::mbarrier_init(q_full, mqa512_sinks_with_q(p) ? 1 + 32 : 1);  // + warp 0's sink copies
    ptx::mbarrier_init(q_empty, T::kConsumerThreads);
    for (int stage = 0; stage < 2; ++stage) {
      for (int cb = 0; cb < kColBlocks; ++cb) ptx::mbarrier_init(kv_full(stage, cb), 1);
      for (int half = 0; half < 2; ++half) {
        // Half h of stage w is read by consumer w (Q K^T) and by consumer h (P V).
        ptx::mbarrier_init(kv_empty(stage, half), stage == half ? 128 : 256);
      }
    }
    for (int h = 0; h < kNumHandoffs; ++h) {
      ptx::mbarrier_init(ptx::smem_addr(&s.handoff[h]), h == kRowSums ? 256 : 128);
    }
    for (uint32_t slot = 0; slot < 2; ++slot) {
      ptx::mbarrier_init(tile_full(slot), 1);
      ptx::mbarrier_init(tile_empty(slot), 8 * kTileCopyLanes);
    }
    ptx::fence_barrier_init();
  }
  __syncthreads();

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    // ------------------------------------------------------------------ producer
    ptx::setmaxnreg_dec<T::kProducerRegs>();
    // Warps 2s and 2s + 1 fill stage s, each its alternate 64-column blocks (warp 0 also
    // loads Q): each stage is refilled as soon as its own consumers release it, never behind
    // the other stage's wait, and two warps issue its boxes.
    const int stage = threadIdx.x / 64, sub = (threadIdx.x / 32) % 2;
    const int lane = threadIdx.x % 32;
    if (threadIdx.x == 0) {
      ptx::tma_prefetch_descriptor(&tmap_q);
      ptx::tma_prefetch_descriptor(&tmap_kv);
      if (p.compress_ratio > 0 && p.topk == nullptr) ptx::tma_prefetch_descriptor(&tmap_c);
    }
    for (Mqa512Progress progress(blockIdx.x); progress.work() < num_work;
         progress.next_work(gridDim.x)) {
      const Mqa512WorkTile w = mqa512_decode_tile(p, progress.work());
      const Mqa512KeySegments seg = mqa512_key_segments(p, w, kBlockN);
      const SplitRange range = split_key_range(seg.num_kv + seg.num_c, w.split, p.num_splits);
      const int n = range.end - range.begin;
      if (threadIdx.x == 0) {  // publish the work tile: the consumers decode nothing
        ptx::mbarrier_wait(tile_empty(progress.slot()), progress.slot_phase() ^ 1);
        Mqa512TileInfo& t = ring(progress.slot());
        t.w = w;
        t.seg = seg;
        t.seg.kv_key0 += range.begin * kBlockN;  // index the split's tiles from 0 (mask_tile)
        t.seg.num_kv -= range.begin;
        t.n = n;
        ptx::mbarrier_arrive(tile_full(progress.slot()));
      }
      __syncwarp();  // converged (see the Q load)
      progress.next_slot();
      if (n == 0) continue;  // the consumers write the empty rows, no loads
      // Warp 0 fills the Q buffer: lane 0 its TMA boxes and, with sinks, every lane two rows'
      // sinks (each lane waits for the buffers' release itself).
      const bool sinks_with_q = mqa512_sinks_with_q(p);
      if (threadIdx.x == 0 || (sinks_with_q && threadIdx.x < 32)) {
        ptx::mbarrier_wait(q_empty, progress.q() ^ 1);
        if (threadIdx.x == 0) {
          ptx::mbarrier_arrive_expect_tx(q_full, T::kQBytes);
          for (int cb = 0; cb < kColBlocks; ++cb) {  // box (64 dims, tile_tokens, tile_heads)
            ptx::tma_load_4d(ptx::smem_addr(&s.q[cb][0][0]), &tmap_q, q_full, cb * 64,
                             w.q_start + w.tok0, w.head0, w.batch);
          }
        }
        if (sinks_with_q) {
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const int row = lane + 32 * i;
            ptx::cp_async_4_zfill(ptx::smem_addr(&s.sink[progress.q()][row]),
                                  p.sinks + w.head0 + row / p.tile_tokens, true);
          }
          ptx::cp_async_mbarrier_arrive_noinc(q_full);
        }
      }
      // Each producer warp stays converged: the lanes that skip a single-lane issue wait for
      // it here instead of spinning in the next try_wait beside it.
      __syncwarp();
      // Per work tile: the row where each segment's boxes would start for r = 0 (tile
      // it = range.begin + r is the kv tile at key seg.kv_key0 + 64 it, or compressed tile
      // it - num_kv), and for CSA the token's list, its closed rows and the rows' base.
      const int kv_row0 = w.k_start + seg.kv_key0 + range.begin * kBlockN;
      const int c_row0 = w.c_start + (range.begin - seg.num_kv) * kBlockN;
      const int* listed =
          p.topk == nullptr ? nullptr
                            : p.topk + (static_cast<long long>(w.batch) * p.seqlen_q + w.q_start +
                                        w.tok0) * p.topk_k;
      const int closed =  // one token per CSA tile
          p.topk != nullptr ? mqa512_closed_rows(p, w, seg.kv.pos_lo) : 0;
      const Element* rows = static_cast<const Element*>(p.compressed) +
                            w.batch * p.c_batch_stride + w.c_start * p.c_row_stride;
      const int slot_base = (range.begin - seg.num_kv) * kBlockN;
      const int kv_tiles = seg.num_kv - range.begin;  // tiles r < kv_tiles are kv rows
#pragma unroll 1
      for (int r = stage; r < n; r += 2) {  // this stage's tiles
        const uint32_t phase = progress.stage(stage, r >> 1);
        const bool compressed = r >= kv_tiles;
        const bool gathered = compressed && p.topk != nullptr;
        // CSA: lane l reads the list entries of rows l and l + 32 now, before the stage is free
        // (the row loop below broadcasts them), and the warp's ballots give the tile's visible
        // slots.
        int listed_lo = -1, listed_hi = -1;
        if (gathered) {
          const int slot0 = slot_base + r * kBlockN + lane;
          listed_lo = mqa512_listed_row(listed, p.topk_k, closed, slot0);
          listed_hi = mqa512_listed_row(listed, p.topk_k, closed, slot0 + 32);
        }
        const uint32_t valid_lo = __ballot_sync(0xffffffff, listed_lo >= 0);
        const uint32_t valid_hi = __ballot_sync(0xffffffff, listed_hi >= 0);
        // Stage w's consumer multiplies its own half of head_dim first: load that half first.
#pragma unroll 1
        for (int k = 0; k < 2; ++k) {
          const int half = stage ^ k;
          ptx::mbarrier_wait(kv_empty(stage, half), phase ^ 1);
          if (gathered) {
            // The slots' validity for the consumer's mask (written once the half its reader
            // releases last is free, published by this warp's kv_full arrivals).
            if (k == 0 && sub == 0 && lane == 0) {
              s.csa_valid[stage][0] = valid_lo;
              s.csa_valid[stage][1] = valid_hi;
            }
            // Gather: this warp's two 64-column blocks of the half, cb and cb + 2, into the
            // swizzled [8][64][64] layout a TMA box would have written. Lane 8 q + part copies
            // 16-byte part `part` of rows q + 4 i (i < 16) in both blocks; the rows' sources are
            // shuffled from the listing lanes ahead of the copies.
            const int cb = kHalf * half + sub, part = lane % 8, row_sub = lane / 8;
            const uint32_t tile = ptx::smem_addr(&s.kv[stage][cb][0][0]) + row_sub * 128;
            // Row q + 4 i sits at swizzle phase q + 4 (i % 2): chunk part ^ q, then ^ 4 for odd i.
            const uint32_t dst0 = tile + ((part ^ row_sub) << 4);
            const char* src_base = reinterpret_cast<const char*>(rows + cb * 64 + part * 8);
            const uint32_t row_bytes = static_cast<uint32_t>(p.c_row_stride * sizeof(Element));
#pragma unroll
            for (int i = 0; i < kBlockN / 4; ++i) {
              const int src_row =
                  __shfl_sync(0xffffffff, i < 8 ? listed_lo : listed_hi, (row_sub + 4 * i) % 32);
              const char* src =
                  src_base + static_cast<uint64_t>(static_cast<uint32_t>(max(src_row, 0))) * row_bytes;
              const uint32_t dst = (dst0 ^ (i % 2 ? 64u : 0u)) + 4 * 128 * i;
              ptx::cp_async_16_zfill(dst, src, src_row >= 0);
              ptx::cp_async_16_zfill(dst + 2 * kBlockN * 128, src + 2 * 64 * sizeof(Element),
                                     src_row >= 0);
            }
            // The blocks complete as the copies land, without waiting here, so the next half's
            // copies go out at once: every lane holds both blocks' phases open until its own
            // copies have landed, then lane 0 gives the one arrival each barrier counts. (The
            // consumers fence the proxies before their wgmmas read the tile.)
            ptx::cp_async_mbarrier_arrive(kv_full(stage, kHalf * half + sub));
            ptx::cp_async_mbarrier_arrive(kv_full(stage, kHalf * half + sub + 2));
            __syncwarp();  // every lane's copies are tracked before lane 0 arrives
            if (lane == 0) {
              ptx::mbarrier_arrive(kv_full(stage, kHalf * half + sub));
              ptx::mbarrier_arrive(kv_full(stage, kHalf * half + sub + 2));
            }
          } else if (lane == 0) {
            for (int cb = kHalf * half + sub; cb < kHalf * (half + 1); cb += 2) {
              const uint32_t dst = ptx::smem_addr(&s.kv[stage][cb][0][0]), full = kv_full(stage, cb);
              ptx::mbarrier_arrive_expect_tx(full, T::kBlockBytes);
              if (compressed) {
                ptx::tma_load_4d(dst, &tmap_c, full, cb * 64, c_row0 + r * kBlockN, 0, w.batch);
              } else {
                ptx::tma_load_4d(dst, &tmap_kv, full, cb * 64, kv_row0 + r * kBlockN, w.kv_head,
                                 w.batch);
              }
            }
          }
          __syncwarp();  // converged before the next wait (see the Q load)
        }
      }
      progress.finish_keys(n);
    }
    return;
  }

  // -------------------------------------------------------------------- consumers
  ptx::setmaxnreg_inc<T::kConsumerRegs>();
  // Consumer wg multiplies Q by the key tiles of stage wg and owns O[:, 256 wg : 256 wg + 256].
  // Pairs of key tiles (2i in stage 0, 2i + 1 in stage 1) go through one softmax chain:
  // consumer 0 folds its tile into the row max first, consumer 1 then its own, and each P is
  // rescaled to the pair's max before the other consumer adds its P V.
  const int wg = warpgroup - 1;
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  // Accumulator fragment: this thread holds rows r and r + 8 (r = 16 warp + lane / 4) and in
  // each 8-column group j the columns 8j + 2 (lane % 4) + {0, 1}:
  //   acc[4j + 2i + c] = (row r + 8i, col 8j + 2 (lane % 4) + c).
  const int col_lane = 2 * (lane % 4);
  const int frag_row = warp * 16 + lane / 4;
  // This warp's copy of the current work tile and its key segments (rebased to the split).
  Mqa512TileInfo& info = *reinterpret_cast<Mqa512TileInfo*>(&s.tile_info[wg * 4 + warp][0]);
  const Mqa512WorkTile& w = info.w;
  const Mqa512KeySegments& seg = info.seg;

  float o[128];     // this consumer's 256 columns of O
  float sacc[32];   // S, then P, of this consumer's current key tile
  uint32_t pfrag[kBlockN / 16][4];
  float m_run[2] = {neg_inf, neg_inf};  // reference max (log2 domain, lazily raised), shared by both consumers
  float l_run[2];   // this thread's partial sum of 2^(x - m_run) over this consumer's tiles

  // Half `half` of S = Q K^T for this consumer's tile (issued, not waited on), each 64-column
  // block as soon as it has landed (fill parity `phase`).
  auto issue_qk_half = [&](int half, bool overwrite, uint32_t phase) {
    const uint32_t q_base = ptx::smem_addr(&s.q[kHalf * half][0][0]);
    const uint32_t k_base = ptx::smem_addr(&s.kv[wg][kHalf * half][0][0]);
#pragma unroll
    for (int cb = 0; cb < kHalf; ++cb) {
      ptx::mbarrier_wait(kv_full(wg, kHalf * half + cb), phase);
      if (p.topk != nullptr) ptx::fence_proxy_async_smem();  // a gathered tile: cp.async wrote it
      ptx::wgmma_fence();  // after a spin-wait, or ptxas serializes every wgmma (C7520)
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {  // 16 elements = 32 bytes per k-step
        const uint64_t da = ptx::smem_desc_sw128(q_base + cb * T::kBlockM * 128 + kk * 32, 0, 1024);
        const uint64_t db = ptx::smem_desc_sw128(k_base + cb * kBlockN * 128 + kk * 32, 0, 1024);
        ptx::WgmmaSS<kBlockN, Element>::run(sacc, da, db, overwrite && (cb | kk) == 0 ? 0 : 1);
      }
    }
  };
  // O += P V for this consumer's 256 columns of the tile in `stage`, the tile read MN-major
  // (head_dim contiguous): P from registers (this consumer's tile) or from shared memory (the
  // other consumer's, stored by it).
  auto v_desc = [&](int stage, int t) {
    return ptx::smem_desc_sw128(ptx::smem_addr(&s.kv[stage][wg * kHalf][0][0]) + t * 16 * 128,
                                kBlockN * 128, 1024);
  };
  auto issue_pv_regs = [&]() {
#pragma unroll
    for (int t = 0; t < kBlockN / 16; ++t) {
      ptx::WgmmaRS<256, Element, 1>::run(o, pfrag[t], v_desc(wg, t), 1);
    }
  };
  auto wait_half = [&](int stage, int half, uint32_t phase) {  // this consumer's V half of a tile
#pragma unroll
    for (int cb = 0; cb < kHalf; ++cb) ptx::mbarrier_wait(kv_full(stage, kHalf * half + cb), phase);
    if (p.topk != nullptr) ptx::fence_proxy_async_smem();  // as in issue_qk_half
  };
  auto issue_pv_smem = [&](const Element (&pt)[T::kBlockM][kBlockN], int stage) {
    const uint32_t p_base = ptx::smem_addr(&pt[0][0]);
#pragma unroll
    for (int t = 0; t < kBlockN / 16; ++t) {
      const uint64_t da = ptx::smem_desc_sw128(p_base + t * 32, 0, 1024);
      ptx::WgmmaSS<256, Element, 1>::run(o, da, v_desc(stage, t), 1);
    }
  };
  // pfrag -> pt, the 128-byte-swizzled K-major layout of a wgmma A operand. Each warp writes
  // only its own 16 rows.
  auto store_p = [&](Element (&pt)[T::kBlockM][kBlockN]) {
    uint8_t* base = reinterpret_cast<uint8_t*>(&pt[0][0]);
#pragma unroll
    for (int t = 0; t < kBlockN / 16; ++t) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {  // pfrag[t][r]: row frag_row + 8 (r % 2), columns 16t + 8 (r / 2) + col_lane
        const int row = frag_row + 8 * (r % 2), chunk = 2 * t + r / 2;
        *reinterpret_cast<uint32_t*>(base + row * 128 + ((chunk ^ (row % 8)) << 4) + col_lane * 2) =
            pfrag[t][r];
      }
    }
  };
  // Writes one value per row to `dst` (one lane per quad), arrives on `handoff`, and reads the
  // values back: what uses them cannot be scheduled ahead of the arrive. (ptxas moved such an
  // arrive below the register-only work after it, and the other consumer waited through this
  // one's exps or O rescale.)
  auto publish = [&](float (&dst)[T::kBlockM], float (&v)[2], int handoff) {
    if (lane % 4 == 0) {
      dst[frag_row] = v[0];
      dst[frag_row + 8] = v[1];
    }
    __syncwarp();
    ptx::mbarrier_arrive(ptx::smem_addr(&s.handoff[handoff]));
    v[0] = dst[frag_row];
    v[1] = dst[frag_row + 8];
  };
  // The rows' new reference max: the exponent base for this tile's scores, and the factor
  // what was accumulated against the old one must be multiplied by.
  auto adopt_max = [&](const float (&m_new)[2], float (&base)[2], float (&factor)[2]) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      base[i] = softmax_base(m_new[i]);
      factor[i] = ptx::exp2_approx(m_run[i] - base[i]);
      m_run[i] = m_new[i];
    }
  };
  auto wait_handoff = [&](int handoff, uint32_t phase) {
    ptx::mbarrier_wait(ptx::smem_addr(&s.handoff[handoff]), phase);
  };
  // Tile `it` of the split's key sequence (kv rows, then compressed rows; seg rebased to the
  // split's first tile): mask it (boundary tiles and CSA tiles only). Each row's visible keys
  // are one range, so the per-score test is a compare and a select (mask_outside).
  auto mask_tile = [&](int it) {
    const int num_kv = seg.num_kv;
    const bool compressed = it >= num_kv;
    if (compressed && p.topk != nullptr) {  // CSA: the slots the producer found visible
      const uint32_t valid[2] = {s.csa_valid[wg][0], s.csa_valid[wg][1]};  // own tile: stage wg
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const bool visible = (valid[j / 4] >> ((8 * j + col_lane + c) % 32)) & 1u;
          sacc[4 * j + c] = visible ? sacc[4 * j + c] : neg_inf;
          sacc[4 * j + 2 + c] = visible ? sacc[4 * j + 2 + c] : neg_inf;
        }
      }
      return;
    }
    const KeyShape shape = w.shape;
    const KeyTiles kv = seg.kv;
    const int n0 = compressed ? (it - num_kv) * kBlockN : seg.kv_key0 + it * kBlockN;
    const bool needs_mask = compressed ? n0 + kBlockN > mqa512_closed_rows(p, w, kv.pos_lo)
                                       : key_tile_needs_mask(shape, kv, n0, kBlockN);
    if (!needs_mask) return;
    int lo[2], hi[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int pos = kv.pos_lo + (frag_row + 8 * i) % p.tile_tokens;
      const KeySpan span = compressed ? KeySpan{0, mqa512_closed_rows(p, w, pos)}
                                      : visible_keys(shape, pos);
      lo[i] = span.lo - n0 - col_lane;
      hi[i] = span.hi - n0 - col_lane;
    }
    mask_outside<kBlockN>(sacc, lo, hi);
  };

  for (Mqa512Progress progress(blockIdx.x); progress.work() < num_work;  // as in the producer
       progress.next_work(ptx::grid_ctas())) {
    // This warp's copy of the work tile the producer published, 16 bytes per lane; each
    // copying lane releases the ring slot itself.
    ptx::mbarrier_wait(tile_full(progress.slot()), progress.slot_phase());
    __syncwarp();  // the last work tile's readers of the copy are done
    if (lane < kTileCopyLanes) {
      reinterpret_cast<int4*>(&s.tile_info[wg * 4 + warp][0])[lane] =
          reinterpret_cast<const int4*>(&s.tile_ring[progress.slot()][0])[lane];
      ptx::mbarrier_arrive(tile_empty(progress.slot()));
    }
    __syncwarp();
    const int n = info.n;  // this split's key tiles
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
    m_run[0] = m_run[1] = neg_inf;
    l_run[0] = l_run[1] = 0.f;

    if (n > 0) {
      // Q K^T of this consumer's tile r = 2 i + wg (i-th use of its stage in this work tile).
      // It multiplies its own half of head_dim first (released by its own P V); in between,
      // `between` runs (consumer 0 releases the other stage there).
      auto qk_own = [&](int r, auto&& between) {
        const uint32_t phase = progress.stage(wg, r >> 1);
        issue_qk_half(wg, true, phase);
        ptx::wgmma_commit();
        between();
        issue_qk_half(1 - wg, false, phase);
        ptx::wgmma_commit();
        ptx::wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < 32; ++i) ptx::fence_operand(sacc[i]);
        ptx::mbarrier_arrive(kv_empty(wg, 1 - wg));  // the other half's other reader: the other consumer's P V
        if (r + 2 >= n) ptx::mbarrier_arrive(q_empty);  // last read of Q in this work tile
      };
      ptx::mbarrier_wait(q_full, progress.q());
      if (wg < n) {
        qk_own(wg, [] {});
      } else {
        ptx::mbarrier_arrive(q_empty);  // consumer 1 of a one-tile work tile reads no Q
      }

      for (int pair = 0; 2 * pair < n; ++pair) {
        const bool has_odd = 2 * pair + 1 < n;  // consumer 1 has a tile in this pair
        const uint32_t phase0 = progress.stage(0, pair), phase1 = progress.stage(1, pair);
        float base[2], factor[2], sum[2];
        if (wg == 0) {
          // 1. Fold S into the running max, publish it, exponentiate.
          float mx[2];
          mask_tile(2 * pair);
          row_max_scores<kBlockN>(sacc, mx);
          float m_new[2];
#pragma unroll
          for (int i = 0; i < 2; ++i) m_new[i] = raise_lazily(m_run[i], mx[i] * p.scale_log2, kLazyMaxSlack);
          publish(s.row_max[0], m_new, kMax0Ready);
          adopt_max(m_new, base, factor);
          exp2_scores<kBlockN>(sacc, p.scale_log2, base, sum);
#pragma unroll
          for (int i = 0; i < 2; ++i) l_run[i] = l_run[i] * factor[i] + sum[i];
          rescale_rows_unless_one<256>(o, factor);
          // 2. O += P V for the own tile, with P through shared memory: keeping the fp32 P
          //    (rescaled below) and its A fragment in registers during this wgmma spilled.
          scores_to_a_fragment<Element, kBlockN>(sacc, pfrag);
          store_p(s.p_own0);
          ptx::fence_proxy_async_smem();
          ptx::named_barrier_sync(kPOwn0Ready, 128);
          ptx::wgmma_fence();
          issue_pv_smem(s.p_own0, 0);
          ptx::wgmma_commit();
          // 3. While that P V runs: the pair's max from consumer 1, P rescaled to it and handed
          //    over (consumer 1's P V with it is the longest chain of the pair), then O rescaled
          //    once the P V has landed.
          wait_handoff(kMax1Ready, phase0);
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const float m_pair = s.row_max[1][frag_row + 8 * i];
            factor[i] = ptx::exp2_approx(m_run[i] - softmax_base(m_pair));
            m_run[i] = m_pair;
          }
          rescale_rows_unless_one<kBlockN>(sacc, factor);
          scores_to_a_fragment<Element, kBlockN>(sacc, pfrag);
          store_p(s.p[0]);
          ptx::fence_proxy_async_smem();  // the other consumer's wgmma reads it
          publish(s.row_scale, factor, kP0Ready);
#pragma unroll
          for (int i = 0; i < 2; ++i) l_run[i] *= factor[i];
          ptx::wgmma_wait<0>();
#pragma unroll
          for (int i = 0; i < 128; ++i) ptx::fence_operand(o[i]);
          ptx::mbarrier_arrive(kv_empty(0, 0));
          rescale_rows_unless_one<256>(o, factor);
          // 4. O += P V for consumer 1's tile, with its P from shared memory.
          if (has_odd) {
            wait_handoff(kP1Ready, phase1);
            wait_half(1, 0, phase1);
            ptx::wgmma_fence();
            issue_pv_smem(s.p[1], 1);
            ptx::wgmma_commit();
          }
          // Consumer 1's tile, half 0: the P V above was its last reader. The waits stay
          // unconditional (with fewer groups in flight they return at once): a wait that ptxas
          // sees only on some paths makes it serialize every wgmma.
          auto release_odd = [&] {
            ptx::wgmma_wait<1>();
            if (has_odd) ptx::mbarrier_arrive(kv_empty(1, 0));
          };
          // 5. S of the next own tile; the P V above finishes behind its first half.
          if (2 * pair + 2 < n) {
            qk_own(2 * pair + 2, release_odd);
          } else {
            ptx::wgmma_wait<0>();
            if (has_odd) ptx::mbarrier_arrive(kv_empty(1, 0));
          }
#pragma unroll
          for (int i = 0; i < 128; ++i) ptx::fence_operand(o[i]);
        } else {
          // 1. Mask and take the row max of the own tile (none: -inf) while consumer 0 works,
          //    then fold in consumer 0's max: that is the pair's max.
          float mx[2] = {neg_inf, neg_inf};
          if (has_odd) {
            mask_tile(2 * pair + 1);
            row_max_scores<kBlockN>(sacc, mx);
          }
          wait_handoff(kMax0Ready, phase0);
          float m_new[2];
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            m_new[i] = raise_lazily(s.row_max[0][frag_row + 8 * i], mx[i] * p.scale_log2, kLazyMaxSlack);
          }
          publish(s.row_max[1], m_new, kMax1Ready);
          adopt_max(m_new, base, factor);
          rescale_rows_unless_one<256>(o, factor);
          sum[0] = sum[1] = 0.f;
          // 2. Exponentiate, hand P over, O += P V for the own tile.
          if (has_odd) {
            exp2_scores<kBlockN>(sacc, p.scale_log2, base, sum);
            scores_to_a_fragment<Element, kBlockN>(sacc, pfrag);
            store_p(s.p[1]);
            ptx::fence_proxy_async_smem();
            ptx::mbarrier_arrive(ptx::smem_addr(&s.handoff[kP1Ready]));
            ptx::wgmma_fence();
            issue_pv_regs();
            ptx::wgmma_commit();
          }
#pragma unroll
          for (int i = 0; i < 2; ++i) l_run[i] = l_run[i] * factor[i] + sum[i];
          // 3. O += P V for consumer 0's tile, with its P from shared memory.
          wait_handoff(kP0Ready, phase0);
          wait_half(0, 1, phase0);
          ptx::wgmma_fence();
          issue_pv_smem(s.p[0], 0);
          ptx::wgmma_commit();
          ptx::wgmma_wait<1>();  // the own P V, if any (unconditional: see consumer 0)
          if (has_odd) ptx::mbarrier_arrive(kv_empty(1, 1));
          ptx::wgmma_wait<0>();
#pragma unroll
          for (int i = 0; i < 128; ++i) ptx::fence_operand(o[i]);
          ptx::mbarrier_arrive(kv_empty(0, 1));
          // 4. S of the next own tile.
          if (2 * pair + 3 < n) qk_own(2 * pair + 3, [] {});
        }
      }
    }
    progress.finish_keys(n);

    // ---- epilogue: the row sums of both consumers, the sink, normalise, store out and lse; a
    // split stores its normalised rows in fp32 and their lse without the sink instead.
    float total[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) total[i] = quad_sum(l_run[i]);
    if (lane % 4 == 0) {
#pragma unroll
      for (int i = 0; i < 2; ++i) s.row_sum[progress.slot()][wg][frag_row + 8 * i] = total[i];
    }
    ptx::mbarrier_arrive(ptx::smem_addr(&s.handoff[kRowSums]));
    wait_handoff(kRowSums, progress.slot());
#pragma unroll
    for (int i = 0; i < 2; ++i) total[i] += s.row_sum[progress.slot()][1 - wg][frag_row + 8 * i];

    constexpr float kLog2e = 1.4426950408889634f;
    const bool split = p.num_splits > 1;
    Element* out = static_cast<Element*>(p.out);
    const bool has_sink = mqa512_sinks_with_q(p);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = frag_row + 8 * i;
      const int token = w.tok0 + row % p.tile_tokens, head = w.head0 + row / p.tile_tokens;
      float inv, lse;
      // The sink came with Q (a global load here sat on the epilogue's critical path: 12% of
      // the sliding layer's time); a work tile with no keys loaded no Q. (One generic load of
      // either address: selecting the value instead spilled.)
      const float* sink_src = n > 0 ? &s.sink[progress.q() ^ 1][row] : p.sinks + head;
      const float sink = has_sink ? *sink_src : 0.f;
      finish_row_sum(total[i], m_run[i], has_sink, sink * kLog2e, inv, lse);
      const bool valid = token < w.shape.seqlen_q;
      const size_t out_token = static_cast<size_t>(w.batch) * p.seqlen_q + w.q_start + token;
      const size_t out_row = out_token * p.heads_q + head;
      if (split) {
        if (!valid) continue;
        const size_t part_row = static_cast<size_t>(w.split) * p.batch * p.seqlen_q * p.heads_q + out_row;
        float* dst = p.o_partial + part_row * T::kHeadDim + wg * 256;
#pragma unroll
        for (int j = 0; j < 32; ++j) {
          *reinterpret_cast<float2*>(dst + 8 * j + col_lane) =
              make_float2(o[4 * j + 2 * i] * inv, o[4 * j + 2 * i + 1] * inv);
        }
        if (wg == 0 && lane % 4 == 0) p.lse_partial[part_row] = lse;
        continue;
      }
      store_fragment_row<Element, 256>(o, i, inv, out + out_row * T::kHeadDim + wg * 256, valid,
                                       lane);
      if (valid && wg == 0 && lane % 4 == 0) {
        p.lse[(static_cast<size_t>(w.batch) * p.heads_q + head) * p.seqlen_q + w.q_start + token] = lse;
      }
    }
    progress.next_slot();
  }
}

}  // namespace dsv4
