// sm90a attention at head_dim 512 with one KV tensor read as both K and V (DeepSeek-V4's
// shared-KV MQA, and GQA), the query heads that share a KV head packed into the M dimension.
//
// Each CTA walks 64-row work tiles: tile_tokens tokens x tile_heads query heads of one KV head
// (one token x 64 heads when there are 64 or more per KV head), so every key tile it loads
// serves all 64 rows. Q's TMA box is (64 dims, tile_tokens, tile_heads), so the rows land
// tokens innermost: row = head * tile_tokens + token.
// Roles (128 threads per warpgroup):
//   warpgroup 0, warp 0    producer: TMA loads of Q (once per work tile) and of the key tiles
//                          (64 keys x 512) into a two-stage ring; each tile is read as K and V.
//                          CSA tiles have no TMA box: the warp gathers their rows with 16-byte
//                          cp.async (zero-filled where an index is not visible).
//   warpgroups 1, 2        consumers. The 64 x 512 output is split by columns: warpgroup w
//                          owns O[:, 256w : 256w + 256]. Both need the whole S = Q K^T, so
//                          each computes the partial product over its half of head_dim, they
//                          swap partials through shared memory and add the other's: both then
//                          hold the same S and run the same online softmax (bitwise equal:
//                          fp32 addition commutes). O_w += P V[:, 256w : 256w + 256] takes P
//                          from registers. QK^T of tile j is issued together with PV of tile
//                          j-1, so the swap and the softmax overlap the PV wgmma.
// Shared memory: Q [8][64 rows][64], the key ring [2][8][64 keys][64], each [64][64] block one
// TMA box with the 128-byte swizzle that wgmma reads; the partial-S swap [2][32][128] fp32.
//
// Barrier protocol (phase bits flip once per pass over the ring):
//   q_full        producer arrive.expect_tx(64 KB) + TMA          -> consumers wait
//   q_empty       every consumer thread after its last QK^T       -> producer, before next Q
//   kv_full[s]    32 producer-lane arrivals: lane 0's carries expect_tx(64 KB) of a TMA tile;
//                 for a gather tile each lane arrives after its copies landed and a
//                 fence.proxy.async (wgmma reads them)       -> consumers, before QK^T
//   kv_empty[s]   every consumer thread after its PV of the tile  -> producer, before reuse
//   named barrier 1  both consumer warpgroups stored their partial S; read the other's after it
//   named barrier 2  both read the previous swap; store the next partial after it
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
  static constexpr int kStages = 2;
  static constexpr int kColBlocks = kHeadDim / 64;  // 128-byte swizzle atoms along head_dim
  static constexpr int kHalfBlocks = kColBlocks / 2;  // each consumer's half of head_dim
  static constexpr int kThreads = 384;
  static constexpr int kConsumerThreads = 256;
  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kTileBytes = kBlockN * kHeadDim * sizeof(Element);
  // The producer gathers CSA rows with 64-bit address arithmetic: 56 registers (ptxas spills
  // at 40); the consumers fit in 224 without spills.
  static constexpr uint32_t kProducerRegs = 56, kConsumerRegs = 224;
  static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= 65536, "register budget");

  struct alignas(1024) SharedStorage {
    Element q[kColBlocks][kBlockM][64];
    Element kv[kStages][kColBlocks][kBlockN][64];
    float partial_s[2][kBlockN / 2][128];  // [warpgroup][accumulator register][thread]
    uint64_t q_full, q_empty;
    uint64_t kv_full[kStages], kv_empty[kStages];
  };
  static constexpr size_t kSmemBytes = sizeof(SharedStorage) + 1024;  // + alignment slack
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than an sm_90 block can have");
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

template <typename Element>
__global__ void __launch_bounds__(Mqa512Sm90Traits<Element>::kThreads, 1)
    mqa512_sm90_kernel(const __grid_constant__ CUtensorMap tmap_q,
                       const __grid_constant__ CUtensorMap tmap_kv,
                       const __grid_constant__ CUtensorMap tmap_c, const Mqa512Sm90Params p) {
  using T = Mqa512Sm90Traits<Element>;
  constexpr int kBlockN = T::kBlockN, kStages = T::kStages, kColBlocks = T::kColBlocks;
  constexpr int kHalf = T::kHalfBlocks;
  const float neg_inf = __int_as_float(0xff800000);

  extern __shared__ uint8_t smem_raw[];
  auto& s = *reinterpret_cast<typename T::SharedStorage*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));

  const int num_work = p.num_work;
  const uint32_t q_full = ptx::smem_addr(&s.q_full), q_empty = ptx::smem_addr(&s.q_empty);
  if (threadIdx.x == 0) {
    ptx::mbarrier_init(q_full, 1);
    ptx::mbarrier_init(q_empty, T::kConsumerThreads);
    for (int i = 0; i < kStages; ++i) {
      ptx::mbarrier_init(ptx::smem_addr(&s.kv_full[i]), 32);  // every producer lane
      ptx::mbarrier_init(ptx::smem_addr(&s.kv_empty[i]), T::kConsumerThreads);
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
    int kv_iter = 0, q_round = 0;  // ring position and Q loads, continued across work tiles
    for (int work = blockIdx.x; work < num_work; work += gridDim.x) {
      const Mqa512WorkTile w = mqa512_decode_tile(p, work);
      const Mqa512KeySegments seg = mqa512_key_segments(p, w, kBlockN);
      const SplitRange range = split_key_range(seg.num_kv + seg.num_c, w.split, p.num_splits);
      if (range.begin == range.end) continue;  // the consumers write the empty rows, no loads
      if (lane == 0) {
        ptx::mbarrier_wait(q_empty, (q_round & 1) ^ 1);
        ptx::mbarrier_arrive_expect_tx(q_full, T::kQBytes);
        for (int cb = 0; cb < kColBlocks; ++cb) {  // box (64 dims, tile_tokens, tile_heads)
          ptx::tma_load_4d(ptx::smem_addr(&s.q[cb][0][0]), &tmap_q, q_full, cb * 64,
                           w.q_start + w.tok0, w.head0, w.batch);
        }
      }
      ++q_round;
      for (int it = range.begin; it < range.end; ++it, ++kv_iter) {
        const int stage = kv_iter % kStages;
        const uint32_t phase = (kv_iter / kStages) & 1;
        const uint32_t full = ptx::smem_addr(&s.kv_full[stage]);
        ptx::mbarrier_wait(ptx::smem_addr(&s.kv_empty[stage]), phase ^ 1);
        const bool compressed = it >= seg.num_kv;
        if (compressed && p.topk != nullptr) {
          // Gather: lane l copies 16-byte chunks l and l + 32 of each listed row into the
          // swizzled [8][64][64] layout a TMA box would have written.
          const int slot0 = (it - seg.num_kv) * kBlockN;
          const int closed = mqa512_closed_rows(p, w, seg.kv.pos_lo);  // one token per CSA tile
          const int* listed =
              p.topk + (static_cast<long long>(w.batch) * p.seqlen_q + w.q_start + w.tok0) * p.topk_k;
          const Element* base = static_cast<const Element*>(p.compressed) +
                                w.batch * p.c_batch_stride + w.c_start * p.c_row_stride;
          const uint32_t tile = ptx::smem_addr(&s.kv[stage][0][0][0]);
          for (int row = 0; row < kBlockN; ++row) {
            const int src_row = mqa512_listed_row(listed, p.topk_k, closed, slot0 + row);
            const Element* src = base + static_cast<long long>(max(src_row, 0)) * p.c_row_stride;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const int chunk = lane + 32 * h;  // 16-byte chunk of the 1024-byte row
              const uint32_t dst = tile + (chunk / 8) * kBlockN * 128 + row * 128 +
                                   (((chunk % 8) ^ (row % 8)) << 4);
              ptx::cp_async_16_zfill(dst, src + chunk * 8, src_row >= 0);
            }
          }
          ptx::cp_async_wait_all();
          ptx::fence_proxy_async_smem();  // wgmma reads what cp.async wrote
          ptx::mbarrier_arrive(full);
        } else {
          if (lane == 0) {
            const CUtensorMap* map = compressed ? &tmap_c : &tmap_kv;
            const int n0 = compressed ? w.c_start + (it - seg.num_kv) * kBlockN
                                      : w.k_start + (seg.kv.first + it) * kBlockN;
            ptx::mbarrier_arrive_expect_tx(full, T::kTileBytes);
            for (int cb = 0; cb < kColBlocks; ++cb) {
              ptx::tma_load_4d(ptx::smem_addr(&s.kv[stage][cb][0][0]), map, full, cb * 64, n0,
                               compressed ? 0 : w.kv_head, w.batch);
            }
          } else {
            ptx::mbarrier_arrive(full);
          }
        }
      }
    }
    return;
  }

  // -------------------------------------------------------------------- consumers
  ptx::setmaxnreg_inc<T::kConsumerRegs>();
  const int wg = warpgroup - 1;
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  // Accumulator fragment: this thread holds rows r and r + 8 (r = 16 warp + lane / 4) and in
  // each 8-column group j the columns 8j + 2 (lane % 4) + {0, 1}:
  //   acc[4j + 2i + c] = (row r + 8i, col 8j + 2 (lane % 4) + c).
  // Both consumer warpgroups cover all 64 rows with the same fragment layout.
  const int col_lane = 2 * (lane % 4);
  const int frag_row = warp * 16 + lane / 4;
  Mqa512KeySegments seg{};
  Mqa512WorkTile w{};

  float o[128];      // this warpgroup's 256 columns of O
  float row_max[2];  // running max of scale * log2(e) * s
  float row_sum[2];  // this thread's partial sum of 2^(x - row_max)

  const uint32_t q_base = ptx::smem_addr(&s.q[wg * kHalf][0][0]);

  // This warpgroup's half of S = Q K^T for the tile in `stage` (issued, not waited on).
  auto issue_qk = [&](float (&sacc)[kBlockN / 2], int stage) {
    const uint32_t k_base = ptx::smem_addr(&s.kv[stage][wg * kHalf][0][0]);
#pragma unroll
    for (int cb = 0; cb < kHalf; ++cb) {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {  // 16 elements = 32 bytes per k-step
        const uint64_t da = ptx::smem_desc_sw128(q_base + cb * T::kBlockM * 128 + kk * 32, 0, 1024);
        const uint64_t db = ptx::smem_desc_sw128(k_base + cb * kBlockN * 128 + kk * 32, 0, 1024);
        ptx::WgmmaSS<kBlockN, Element>::run(sacc, da, db, (cb | kk) != 0);
      }
    }
  };
  // O_w += P V_w for the tile in `stage`: the same tile read MN-major (head_dim contiguous),
  // this warpgroup's 256 columns (four 64-column blocks, kBlockN * 128 bytes apart).
  auto issue_pv = [&](const uint32_t (&pfrag)[kBlockN / 16][4], int stage) {
    const uint32_t v_base = ptx::smem_addr(&s.kv[stage][wg * kHalf][0][0]);
#pragma unroll
    for (int t = 0; t < kBlockN / 16; ++t) {
      const uint64_t db = ptx::smem_desc_sw128(v_base + t * 16 * 128, kBlockN * 128, 1024);
      ptx::WgmmaRS<256, Element, 1>::run(o, pfrag[t], db, 1);
    }
  };
  // Swap the partial S with the other warpgroup and add its half: afterwards both hold S.
  int swaps = 0;
  auto complete_s = [&](float (&sacc)[kBlockN / 2]) {
    if (swaps++ > 0) ptx::named_barrier_sync(2, T::kConsumerThreads);  // the last swap was read
#pragma unroll
    for (int i = 0; i < kBlockN / 2; ++i) s.partial_s[wg][i][tid] = sacc[i];
    ptx::named_barrier_sync(1, T::kConsumerThreads);
#pragma unroll
    for (int i = 0; i < kBlockN / 2; ++i) sacc[i] += s.partial_s[1 - wg][i][tid];
  };
  // Tile `it` of the work tile's key sequence (kv rows, then compressed rows): mask it (boundary
  // tiles and CSA tiles only), exponentiate in the log2 domain, and set the factor O must be
  // multiplied by once the previous PV has landed.
  auto softmax = [&](float (&sacc)[kBlockN / 2], int it, float (&correction)[2]) {
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
    online_softmax_update<kBlockN>(sacc, p.scale_log2, row_max, row_sum, correction);
  };

  int kv_iter = 0, q_round = 0;  // as in the producer
  for (int work = blockIdx.x; work < num_work; work += gridDim.x) {
    w = mqa512_decode_tile(p, work);
    seg = mqa512_key_segments(p, w, kBlockN);
    const SplitRange range = split_key_range(seg.num_kv + seg.num_c, w.split, p.num_splits);
    const int num_tiles = range.end - range.begin;  // this split's key tiles
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
    row_max[0] = row_max[1] = neg_inf;
    row_sum[0] = row_sum[1] = 0.f;

    if (num_tiles > 0) {
      ptx::mbarrier_wait(q_full, q_round & 1);
      float sacc[kBlockN / 2];
      uint32_t pfrag[kBlockN / 16][4];
      float correction[2];

      const int first = kv_iter % kStages;
      ptx::mbarrier_wait(ptx::smem_addr(&s.kv_full[first]), (kv_iter / kStages) & 1);
      ptx::wgmma_fence();
      issue_qk(sacc, first);
      ptx::wgmma_commit();
      ptx::wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < kBlockN / 2; ++i) ptx::fence_operand(sacc[i]);
      if (num_tiles == 1) ptx::mbarrier_arrive(q_empty);  // last read of Q in this work tile
      complete_s(sacc);
      softmax(sacc, range.begin, correction);  // O is still 0: no rescale
      scores_to_a_fragment<Element, kBlockN>(sacc, pfrag);

      for (int it = 1; it < num_tiles; ++it) {
        const int cur = kv_iter + it;
        const int stage = cur % kStages, prev = (cur - 1) % kStages;
        ptx::mbarrier_wait(ptx::smem_addr(&s.kv_full[stage]), (cur / kStages) & 1);
        ptx::wgmma_fence();
        issue_qk(sacc, stage);
        ptx::wgmma_commit();
        issue_pv(pfrag, prev);
        ptx::wgmma_commit();
        ptx::wgmma_wait<1>();  // this tile's partial S has landed; PV of the last may still run
#pragma unroll
        for (int i = 0; i < kBlockN / 2; ++i) ptx::fence_operand(sacc[i]);
        if (it == num_tiles - 1) ptx::mbarrier_arrive(q_empty);  // last read of Q
        complete_s(sacc);
        softmax(sacc, range.begin + it, correction);
        ptx::wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < 128; ++i) ptx::fence_operand(o[i]);
        ptx::mbarrier_arrive(ptx::smem_addr(&s.kv_empty[prev]));
        rescale_rows<256>(o, correction);
        scores_to_a_fragment<Element, kBlockN>(sacc, pfrag);
      }

      const int last = (kv_iter + num_tiles - 1) % kStages;
      ptx::wgmma_fence();
      issue_pv(pfrag, last);
      ptx::wgmma_commit();
      ptx::wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < 128; ++i) ptx::fence_operand(o[i]);
      ptx::mbarrier_arrive(ptx::smem_addr(&s.kv_empty[last]));
      kv_iter += num_tiles;
      ++q_round;
    }

    // ---- epilogue: finish the row sums, fold in the sink, normalise, store out and lse; a
    // split stores its normalised rows in fp32 and their lse without the sink instead
    constexpr float kLog2e = 1.4426950408889634f;
    const bool split = p.num_splits > 1;
    Element* out = static_cast<Element*>(p.out);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = frag_row + 8 * i;
      const int token = w.tok0 + row % p.tile_tokens, head = w.head0 + row / p.tile_tokens;
      const bool has_sink = p.sinks != nullptr && !split;
      float inv, lse;
      finish_row(row_sum[i], row_max[i], has_sink, has_sink ? p.sinks[head] * kLog2e : 0.f, inv,
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
