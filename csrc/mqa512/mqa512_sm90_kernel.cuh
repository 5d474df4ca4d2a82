// sm90a attention at head_dim 512 with one KV tensor read as both K and V (DeepSeek-V4's
// shared-KV MQA, and GQA), the query heads that share a KV head packed into the M dimension.
//
// Each CTA walks 64-row work tiles: tile_tokens tokens x tile_heads query heads of one KV head
// (one token x 64 heads when there are 64 or more per KV head), so every key tile it loads
// serves all 64 rows. Q's TMA box is (64 dims, tile_tokens, tile_heads), so the rows land
// tokens innermost: row = head * tile_tokens + token.
// Roles (128 threads per warpgroup):
//   warpgroup 0, warp 0    producer: TMA loads of Q (once per work tile) and of the key tiles
//                          (64 keys x 512, in two halves of 256 dims) into two stages; each
//                          tile is read as K and V. CSA tiles have no TMA box: the warp gathers
//                          their rows with 16-byte cp.async (zero-filled where an index is not
//                          visible).
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
// layout; the row maxima [2][64] and row sums [2][2][64] the consumers exchange.
//
// Barrier protocol (phase bits flip once per fill; Mqa512Phases carries them across work tiles):
//   q_full            producer arrive.expect_tx(64 KB) + TMA        -> consumers wait
//   q_empty           each consumer thread after its last QK^T of the work tile (consumer 1
//                     of a one-tile work tile at once)            -> producer, before next Q
//   kv_full[s][h]     32 producer-lane arrivals per half h of stage s: lane 0's carries
//                     expect_tx(32 KB) of the TMA boxes; for a gather each lane arrives after
//                     its copies landed and a fence.proxy.async    -> readers of that half
//   kv_empty[s][h]    half h of stage s is read by consumer s (QK^T) and consumer h (P V):
//                     128 arrivals when s == h (after consumer s's own P V), else 256
//                     (consumer s after its QK^T, consumer h after its P V with the other's P)
//                     -> producer, before refilling the half. Stage s's half s is loaded
//                     first: its consumer multiplies it first, and it is released first.
//   named barriers (consumers only, 256 threads; one arrives, the other syncs, once per pair):
//     kMax0Ready  consumer 0 wrote row_max[0]      kMax1Ready  consumer 1 wrote row_max[1]
//     kP0Ready    consumer 0 stored p[0]           kP1Ready    consumer 1 stored p[1]
//     kRowSums    both stored their row sums (a sync for both, once per work tile)
//     kPOwn0Ready consumer 0's 128 threads stored p_own0 (before its own P V reads it)
//   The pair order makes each reuse safe: a consumer writes row_max / p for pair i + 1 only
//   after the other has synced on its pair-i data.
// Keys come in two segments, walked as one sequence of tiles in one online softmax: the rows
// of kv (fmha's visibility: causal, window) and, for dsv4_attention, the closed rows of
// compressed_kv (row w is closed for position t iff w < min(Sc, (t + 1) / r)): all of them
// (HCA, TMA tiles), or the K listed for the tile's token (CSA: one token per tile, 64 listed
// slots per tile; a slot is visible iff its index is closed).
// Split-KV: when the work tiles cannot fill the SMs, each is cut into num_splits ranges of its
// key tiles (work = tile * num_splits + split); a split writes fp32 partial rows and their lse,
// and the combine kernel (csrc/attention/split_kv_combine.cuh) folds in the sink.
// Masking: key tiles no row can see are never loaded; only boundary tiles are masked, per
// element, from each row's token position (csrc/attention/key_range.cuh). Rows that see
// nothing end with out = 0 and lse = -inf, or the sink-only value with a sink.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "attention/key_range.cuh"
#include "attention/online_softmax.cuh"
#include "mqa512/mqa512_sm90_params.h"
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
  static constexpr uint32_t kHalfTileBytes = kBlockN * kHeadDim / 2 * sizeof(Element);
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
    float row_sum[2][2][kBlockM];    // [work-tile parity][w]: the sums both consumers need
    uint64_t q_full, q_empty;
    uint64_t kv_full[2][2], kv_empty[2][2];  // [stage][half of head_dim]
  };
  static constexpr size_t kSmemBytes = sizeof(SharedStorage) + 1024;  // + alignment slack
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than an sm_90 block can have");
};

// Named barriers between the two consumer warpgroups (256 threads; 0 is __syncthreads).
enum Mqa512Barrier : uint32_t {
  kMax0Ready = 1,  // consumer 0 wrote its row max for this pair of key tiles
  kMax1Ready = 2,  // consumer 1 wrote the pair's row max
  kP0Ready = 3,    // consumer 0 stored its P, rescaled to the pair's max
  kP1Ready = 4,    // consumer 1 stored its P
  kRowSums = 5,    // both stored their row sums at the end of a work tile
  kPOwn0Ready = 6,  // consumer 0 only (128 threads): all of it stored p_own0
};

// Work tile t -> its tokens, heads, KV head and split, and its sequence's rows and lengths.
// Dense: the query tiles of one (batch, KV head, head block) are consecutive, so CTAs running
// together share that KV head's keys in L2; the last query tile (the most keys under a causal
// mask) comes first. Varlen: the schedule's order (costliest first).
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

// The key tiles a work tile visits: kv tiles [kv.first, kv.first + num_kv), then compressed
// tiles [0, num_c). Producer and consumers derive the same sequence.
struct Mqa512KeySegments {
  KeyTiles kv;
  int num_kv, num_c;
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
  k.num_kv = p.use_kv ? k.kv.end - k.kv.first : 0;
  if (p.compress_ratio == 0) {
    k.num_c = 0;
  } else if (p.topk != nullptr) {
    k.num_c = (p.topk_k + block_n - 1) / block_n;  // listed slots, 64 per tile
  } else {
    k.num_c = (mqa512_closed_rows(p, w, k.kv.pos_hi) + block_n - 1) / block_n;
  }
  return k;
}

// CSA: the compressed row in slot `slot` of a token's list (`listed`, K entries), or -1 where
// it is not visible (past K, negative, or not below `closed` = min(Sc, (t + 1) / r)).
__device__ __forceinline__ int mqa512_listed_row(const int* listed, int topk_k, int closed,
                                                 int slot) {
  const int w = slot < topk_k ? listed[slot] : -1;
  return w >= 0 && w < closed ? w : -1;
}

// The parities barriers are waited on with, carried across a CTA's work tiles in one register
// (only parities matter): bit s, the fills of stage s so far (s = 0, 1); bit 2, the Q loads;
// bit 3, the consumers' row-sum buffer.
struct Mqa512Phases {
  uint32_t bits = 0;
  // The parity of the i-th fill of stage s from the start of the current work tile.
  __device__ __forceinline__ uint32_t stage(int s, int i) const { return ((bits >> s) + i) & 1; }
  __device__ __forceinline__ uint32_t q() const { return (bits >> 2) & 1; }
  __device__ __forceinline__ uint32_t sums() const { return (bits >> 3) & 1; }
  // After a work tile of n key tiles: stage 0 took (n + 1) / 2 of them, stage 1 n / 2.
  __device__ __forceinline__ void next_work_tile(int n) {
    bits ^= (((n + 1) / 2) & 1) | (((n / 2) & 1) << 1) | (n > 0 ? 4u : 0u);
  }
  __device__ __forceinline__ void flip_sums() { bits ^= 8u; }
};

template <typename Element>
__global__ void __launch_bounds__(Mqa512Sm90Traits<Element>::kThreads, 1)
    mqa512_sm90_kernel(const __grid_constant__ CUtensorMap tmap_q,
                       const __grid_constant__ CUtensorMap tmap_kv,
                       const __grid_constant__ CUtensorMap tmap_c, const Mqa512Sm90Params p) {
  using T = Mqa512Sm90Traits<Element>;
  constexpr int kBlockN = T::kBlockN, kColBlocks = T::kColBlocks, kHalf = T::kHalfBlocks;
  constexpr uint32_t kPair = T::kConsumerThreads;  // named-barrier thread count
  const float neg_inf = __int_as_float(0xff800000);

  // Aligned by offsetting the __shared__ array itself (not through an integer), so the
  // compiler keeps the shared address space: 32-bit LDS/STS instead of generic accesses.
  extern __shared__ uint8_t smem_raw[];
  auto& s = *reinterpret_cast<typename T::SharedStorage*>(
      smem_raw + ((1024 - (ptx::smem_addr(smem_raw) & 1023)) & 1023));

  const int num_work = p.num_work;
  const uint32_t q_full = ptx::smem_addr(&s.q_full), q_empty = ptx::smem_addr(&s.q_empty);
  auto kv_full = [&](int stage, int half) { return ptx::smem_addr(&s.kv_full[stage][half]); };
  auto kv_empty = [&](int stage, int half) { return ptx::smem_addr(&s.kv_empty[stage][half]); };
  if (threadIdx.x == 0) {
    ptx::mbarrier_init(q_full, 1);
    ptx::mbarrier_init(q_empty, T::kConsumerThreads);
    for (int stage = 0; stage < 2; ++stage) {
      for (int half = 0; half < 2; ++half) {
        ptx::mbarrier_init(kv_full(stage, half), 32);  // every producer lane
        // Half h of stage w is read by consumer w (Q K^T) and by consumer h (P V).
        ptx::mbarrier_init(kv_empty(stage, half), stage == half ? 128 : 256);
      }
    }
    ptx::fence_barrier_init();
  }
  __syncthreads();

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    // ------------------------------------------------------------------ producer
    ptx::setmaxnreg_dec<T::kProducerRegs>();
    if (threadIdx.x >= 32) return;
    const int lane = threadIdx.x;
    if (lane == 0) {
      ptx::tma_prefetch_descriptor(&tmap_q);
      ptx::tma_prefetch_descriptor(&tmap_kv);
      if (p.compress_ratio > 0 && p.topk == nullptr) ptx::tma_prefetch_descriptor(&tmap_c);
    }
    Mqa512Phases phases;
    for (int work = blockIdx.x; work < num_work; work += gridDim.x) {
      const Mqa512WorkTile w = mqa512_decode_tile(p, work);
      const Mqa512KeySegments seg = mqa512_key_segments(p, w, kBlockN);
      const SplitRange range = split_key_range(seg.num_kv + seg.num_c, w.split, p.num_splits);
      const int n = range.end - range.begin;
      if (n == 0) continue;  // the consumers write the empty rows, no loads
      if (lane == 0) {
        ptx::mbarrier_wait(q_empty, phases.q() ^ 1);
        ptx::mbarrier_arrive_expect_tx(q_full, T::kQBytes);
        for (int cb = 0; cb < kColBlocks; ++cb) {  // box (64 dims, tile_tokens, tile_heads)
          ptx::tma_load_4d(ptx::smem_addr(&s.q[cb][0][0]), &tmap_q, q_full, cb * 64,
                           w.q_start + w.tok0, w.head0, w.batch);
        }
      }
      // Per work tile: the row where each segment's boxes would start for r = 0 (tile
      // it = range.begin + r is kv tile seg.kv.first + it, or compressed tile it - num_kv),
      // and for CSA the token's list, its closed rows and the rows' base.
      const int kv_row0 = w.k_start + (seg.kv.first + range.begin) * kBlockN;
      const int c_row0 = w.c_start + (range.begin - seg.num_kv) * kBlockN;
      const int* listed =
          p.topk == nullptr ? nullptr
                            : p.topk + (static_cast<long long>(w.batch) * p.seqlen_q + w.q_start +
                                        w.tok0) * p.topk_k;
      const int closed = mqa512_closed_rows(p, w, seg.kv.pos_lo);  // one token per CSA tile
      const Element* rows = static_cast<const Element*>(p.compressed) +
                            w.batch * p.c_batch_stride + w.c_start * p.c_row_stride;
      const int slot_base = (range.begin - seg.num_kv) * kBlockN;
      const int kv_tiles = seg.num_kv - range.begin;  // tiles r < kv_tiles are kv rows
#pragma unroll 1
      for (int r = 0; r < n; ++r) {
        const int stage = r & 1;
        const uint32_t phase = phases.stage(stage, r >> 1);
        const bool compressed = r >= kv_tiles;
        // Stage w's consumer multiplies its own half of head_dim first: load that half first.
#pragma unroll 1
        for (int k = 0; k < 2; ++k) {
          const int half = stage ^ k;
          const uint32_t full = kv_full(stage, half);
          ptx::mbarrier_wait(kv_empty(stage, half), phase ^ 1);
          if (compressed && p.topk != nullptr) {
            // Gather: lane l copies 16-byte chunk 32 half + l of each listed row into the
            // swizzled [8][64][64] layout a TMA box would have written. Lane l reads the list
            // entries of rows l and l + 32; the row loop broadcasts them.
            const uint32_t tile = ptx::smem_addr(&s.kv[stage][0][0][0]);
            const int chunk = lane + 32 * half;  // of the 1024-byte row
            const int slot0 = slot_base + r * kBlockN + lane;
            const int listed_lo = mqa512_listed_row(listed, p.topk_k, closed, slot0);
            const int listed_hi = mqa512_listed_row(listed, p.topk_k, closed, slot0 + 32);
#pragma unroll 1
            for (int row = 0; row < kBlockN; ++row) {
              const int src_row = __shfl_sync(0xffffffff, row < 32 ? listed_lo : listed_hi, row % 32);
              const Element* src = rows + static_cast<long long>(max(src_row, 0)) * p.c_row_stride;
              const uint32_t dst = tile + (chunk / 8) * kBlockN * 128 + row * 128 +
                                   (((chunk % 8) ^ (row % 8)) << 4);
              ptx::cp_async_16_zfill(dst, src + chunk * 8, src_row >= 0);
            }
            ptx::cp_async_wait_all();
            ptx::fence_proxy_async_smem();  // wgmma reads what cp.async wrote
            ptx::mbarrier_arrive(full);
          } else if (lane == 0) {
            ptx::mbarrier_arrive_expect_tx(full, T::kHalfTileBytes);
            for (int cb = kHalf * half; cb < kHalf * (half + 1); ++cb) {
              const uint32_t dst = ptx::smem_addr(&s.kv[stage][cb][0][0]);
              if (compressed) {
                ptx::tma_load_4d(dst, &tmap_c, full, cb * 64, c_row0 + r * kBlockN, 0, w.batch);
              } else {
                ptx::tma_load_4d(dst, &tmap_kv, full, cb * 64, kv_row0 + r * kBlockN, w.kv_head,
                                 w.batch);
              }
            }
          } else {
            ptx::mbarrier_arrive(full);
          }
        }
      }
      phases.next_work_tile(n);
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
  Mqa512KeySegments seg{};
  Mqa512WorkTile w{};

  float o[128];     // this consumer's 256 columns of O
  float sacc[32];   // S, then P, of this consumer's current key tile
  uint32_t pfrag[kBlockN / 16][4];
  float m_run[2] = {neg_inf, neg_inf};  // running max of scale * log2(e) * s, shared by both consumers
  float l_run[2];   // this thread's partial sum of 2^(x - m_run) over this consumer's tiles

  // Half `half` of S = Q K^T for this consumer's tile (issued, not waited on).
  auto issue_qk_half = [&](int half, bool overwrite) {
    const uint32_t q_base = ptx::smem_addr(&s.q[kHalf * half][0][0]);
    const uint32_t k_base = ptx::smem_addr(&s.kv[wg][kHalf * half][0][0]);
#pragma unroll
    for (int cb = 0; cb < kHalf; ++cb) {
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
  // The row max written for the other consumer: one lane of each quad.
  auto publish_max = [&]() {
    if (lane % 4 == 0) {
      s.row_max[wg][frag_row] = m_run[0];
      s.row_max[wg][frag_row + 8] = m_run[1];
    }
  };
  // Tile `it` of the work tile's key sequence (kv rows, then compressed rows): mask it
  // (boundary tiles and CSA tiles only).
  auto mask_tile = [&](int it) {
    const bool compressed = it >= seg.num_kv;
    const int n0 = compressed ? (it - seg.num_kv) * kBlockN : (seg.kv.first + it) * kBlockN;
    const bool csa = compressed && p.topk != nullptr;
    if (csa) {  // one token per tile: mask by listed slot
      const int closed = mqa512_closed_rows(p, w, seg.kv.pos_lo);
      const int* listed =
          p.topk + (static_cast<long long>(w.batch) * p.seqlen_q + w.q_start + w.tok0) * p.topk_k;
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          if (mqa512_listed_row(listed, p.topk_k, closed, n0 + 8 * j + col_lane + c) < 0) {
            sacc[4 * j + c] = neg_inf;
            sacc[4 * j + 2 + c] = neg_inf;
          }
        }
      }
    }
    const bool needs_mask =
        !csa && (compressed ? n0 + kBlockN > mqa512_closed_rows(p, w, seg.kv.pos_lo)
                            : key_tile_needs_mask(w.shape, seg.kv, n0, kBlockN));
    if (needs_mask) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int pos =
            w.tok0 + (frag_row + 8 * i) % p.tile_tokens + w.shape.seqlen_k - w.shape.seqlen_q;
        const int closed = compressed ? mqa512_closed_rows(p, w, pos) : 0;
#pragma unroll
        for (int j = 0; j < kBlockN / 8; ++j) {
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int key = n0 + 8 * j + col_lane + c;
            const bool visible = compressed ? key < closed
                                            : key_visible(w.shape, key, pos);
            if (!visible) sacc[4 * j + 2 * i + c] = neg_inf;
          }
        }
      }
    }
  };

  Mqa512Phases phases;  // as in the producer
  for (int work = blockIdx.x; work < num_work; work += gridDim.x) {
    w = mqa512_decode_tile(p, work);
    seg = mqa512_key_segments(p, w, kBlockN);
    const SplitRange range = split_key_range(seg.num_kv + seg.num_c, w.split, p.num_splits);
    const int n = range.end - range.begin;  // this split's key tiles
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
    m_run[0] = m_run[1] = neg_inf;
    l_run[0] = l_run[1] = 0.f;

    if (n > 0) {
      // Q K^T of this consumer's tile r = 2 i + wg (i-th use of its stage in this work tile).
      // It multiplies its own half of head_dim first (released by its own P V); in between,
      // `between` runs (consumer 0 releases the other stage there).
      auto qk_own = [&](int r, auto&& between) {
        const uint32_t phase = phases.stage(wg, r >> 1);
        ptx::mbarrier_wait(kv_full(wg, wg), phase);
        ptx::wgmma_fence();
        issue_qk_half(wg, true);
        ptx::wgmma_commit();
        between();
        ptx::mbarrier_wait(kv_full(wg, 1 - wg), phase);
        ptx::wgmma_fence();  // after a spin-wait, or ptxas serializes every wgmma (C7520)
        issue_qk_half(1 - wg, false);
        ptx::wgmma_commit();
        ptx::wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < 32; ++i) ptx::fence_operand(sacc[i]);
        ptx::mbarrier_arrive(kv_empty(wg, 1 - wg));  // the other half's other reader: the other consumer's P V
        if (r + 2 >= n) ptx::mbarrier_arrive(q_empty);  // last read of Q in this work tile
      };
      ptx::mbarrier_wait(q_full, phases.q());
      if (wg < n) {
        qk_own(wg, [] {});
      } else {
        ptx::mbarrier_arrive(q_empty);  // consumer 1 of a one-tile work tile reads no Q
      }

      for (int pair = 0; 2 * pair < n; ++pair) {
        const bool has_odd = 2 * pair + 1 < n;  // consumer 1 has a tile in this pair
        const uint32_t phase0 = phases.stage(0, pair), phase1 = phases.stage(1, pair);
        float base[2], factor[2], sum[2];
        if (wg == 0) {
          // 1. Fold S into the running max, publish it, exponentiate.
          float mx[2];
          mask_tile(range.begin + 2 * pair);
          row_max_scores<kBlockN>(sacc, mx);
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const float m_new = fmaxf(m_run[i], mx[i] * p.scale_log2);
            base[i] = softmax_base(m_new);
            factor[i] = ptx::exp2_approx(m_run[i] - base[i]);
            m_run[i] = m_new;
          }
          publish_max();
          ptx::named_barrier_arrive(kMax0Ready, kPair);
          exp2_scores<kBlockN>(sacc, p.scale_log2, base, sum);
#pragma unroll
          for (int i = 0; i < 2; ++i) l_run[i] = l_run[i] * factor[i] + sum[i];
          rescale_rows<256>(o, factor);
          // 2. O += P V for the own tile, with P through shared memory: keeping the fp32 P
          //    (rescaled below) and its A fragment in registers during this wgmma spilled.
          scores_to_a_fragment<Element, kBlockN>(sacc, pfrag);
          store_p(s.p_own0);
          ptx::fence_proxy_async_smem();
          ptx::named_barrier_sync(kPOwn0Ready, 128);
          ptx::wgmma_fence();
          issue_pv_smem(s.p_own0, 0);
          ptx::wgmma_commit();
          ptx::wgmma_wait<0>();
#pragma unroll
          for (int i = 0; i < 128; ++i) ptx::fence_operand(o[i]);
          ptx::mbarrier_arrive(kv_empty(0, 0));
          // 3. The pair's max, from consumer 1: rescale P and hand it over, rescale O.
          ptx::named_barrier_sync(kMax1Ready, kPair);
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const float m_pair = s.row_max[1][frag_row + 8 * i];
            factor[i] = ptx::exp2_approx(m_run[i] - softmax_base(m_pair));
            m_run[i] = m_pair;
            l_run[i] *= factor[i];
          }
          rescale_rows<kBlockN>(sacc, factor);
          scores_to_a_fragment<Element, kBlockN>(sacc, pfrag);
          store_p(s.p[0]);
          ptx::fence_proxy_async_smem();  // the other consumer's wgmma reads it
          ptx::named_barrier_arrive(kP0Ready, kPair);
          rescale_rows<256>(o, factor);
          // 4. O += P V for consumer 1's tile, with its P from shared memory.
          if (has_odd) {
            ptx::named_barrier_sync(kP1Ready, kPair);
            ptx::mbarrier_wait(kv_full(1, 0), phase1);
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
            mask_tile(range.begin + 2 * pair + 1);
            row_max_scores<kBlockN>(sacc, mx);
          }
          ptx::named_barrier_sync(kMax0Ready, kPair);
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const float m_new = fmaxf(s.row_max[0][frag_row + 8 * i], mx[i] * p.scale_log2);
            base[i] = softmax_base(m_new);
            factor[i] = ptx::exp2_approx(m_run[i] - base[i]);
            m_run[i] = m_new;
          }
          publish_max();
          ptx::named_barrier_arrive(kMax1Ready, kPair);
          rescale_rows<256>(o, factor);
          sum[0] = sum[1] = 0.f;
          // 2. Exponentiate, hand P over, O += P V for the own tile.
          if (has_odd) {
            exp2_scores<kBlockN>(sacc, p.scale_log2, base, sum);
            scores_to_a_fragment<Element, kBlockN>(sacc, pfrag);
            store_p(s.p[1]);
            ptx::fence_proxy_async_smem();
            ptx::named_barrier_arrive(kP1Ready, kPair);
            ptx::wgmma_fence();
            issue_pv_regs();
            ptx::wgmma_commit();
          }
#pragma unroll
          for (int i = 0; i < 2; ++i) l_run[i] = l_run[i] * factor[i] + sum[i];
          // 3. O += P V for consumer 0's tile, with its P from shared memory.
          ptx::named_barrier_sync(kP0Ready, kPair);
          ptx::mbarrier_wait(kv_full(0, 1), phase0);
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
    phases.next_work_tile(n);

    // ---- epilogue: the row sums of both consumers, the sink, normalise, store out and lse; a
    // split stores its normalised rows in fp32 and their lse without the sink instead.
    float total[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      total[i] = quad_sum(l_run[i]);
      if (lane % 4 == 0) s.row_sum[phases.sums()][wg][frag_row + 8 * i] = total[i];
    }
    ptx::named_barrier_sync(kRowSums, kPair);
#pragma unroll
    for (int i = 0; i < 2; ++i) total[i] += s.row_sum[phases.sums()][1 - wg][frag_row + 8 * i];
    phases.flip_sums();  // the next work tile's swap cannot overwrite this one before it is read

    w = mqa512_decode_tile(p, work);  // again: cheaper than keeping it live across the key loop
    constexpr float kLog2e = 1.4426950408889634f;
    const bool split = p.num_splits > 1;
    Element* out = static_cast<Element*>(p.out);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = frag_row + 8 * i;
      const int token = w.tok0 + row % p.tile_tokens, head = w.head0 + row / p.tile_tokens;
      const bool has_sink = p.sinks != nullptr && !split;
      float inv, lse;
      finish_row_sum(total[i], m_run[i], has_sink, has_sink ? p.sinks[head] * kLog2e : 0.f, inv,
                     lse);
      if (token < w.shape.seqlen_q) {
        const size_t out_token = static_cast<size_t>(w.batch) * p.seqlen_q + w.q_start + token;
        const size_t out_row = out_token * p.heads_q + head;
        if (split) {
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
#pragma unroll
        for (int j = 0; j < 32; ++j) {
          const uint32_t packed = ptx::pack2<Element>(o[4 * j + 2 * i] * inv, o[4 * j + 2 * i + 1] * inv);
          *reinterpret_cast<uint32_t*>(out + out_row * T::kHeadDim + wg * 256 + 8 * j + col_lane) = packed;
        }
        if (wg == 0 && lane % 4 == 0) {
          p.lse[(static_cast<size_t>(w.batch) * p.heads_q + head) * p.seqlen_q + w.q_start + token] = lse;
        }
      }
    }
  }
}

}  // namespace dsv4
