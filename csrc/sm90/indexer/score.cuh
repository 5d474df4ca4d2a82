// The lightning indexer's scores on the tensor cores: for a block of queries, every closed key
// row's Σ_h w_h ReLU(scale q_h · k), written to the chunk's fp32 workspace (params.h).
//
// The product is turned around so that the head sum stays inside a thread: the 64 key rows of a
// tile are wgmma's M and a consumer's N / H queries times H heads its N columns (q rows in
// (query, head) order, N = kIndexerColumns), so each thread holds whole head groups of one key
// row and sums them in registers, with two quad shuffles, instead of reducing across warps.
// Roles: one producer thread loads every consumer's queries once and streams the key tiles of
// this CTA's split through a ring; the consumers, each with its own queries, read every tile
// and take turns on the tensor cores (the others' epilogues run under one's product).
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "ptx/math.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/sync.cuh"
#include "ptx/tma.cuh"
#include "ptx/wgmma.cuh"
#include "sm90/indexer/params.h"
#include "sm90/indexer/work.cuh"
#include "sm90/shared/smem.cuh"

namespace dsv4 {

// Element: bf16 or fp16 (exact mode), or float8_e4m3 (serving mode). A row of 128 dims is two
// 128-byte swizzle atoms of 16-bit elements, or one of FP8; either way a wgmma k-step reads 32
// bytes (k16 or k32), so the descriptors step alike.
template <typename Element>
struct IndexerScoreTraits {
  static constexpr int kHeadDim = 128;
  static constexpr int kAtomElems = 128 / static_cast<int>(sizeof(Element));
  static constexpr int kAtoms = kHeadDim / kAtomElems;
  static constexpr int kColumns = kIndexerColumns;  // a consumer's (query, head) columns: N
  static constexpr int kTileRows = 64;  // key rows per tile: wgmma's M
  static constexpr int kSplitRows = kIndexerTilesPerSplit * kTileRows;
  static constexpr int kStages = 4;
  static constexpr int kConsumers = kIndexerConsumers;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  // setmaxnreg moves registers within the CTA's launch allocation (the file split over
  // kThreads, in steps of 8): the producer's release is all the consumers can gain.
  static constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs =
      (kLaunchRegs * kThreads - 128 * kProducerRegs) / (128 * kConsumers) / 8 * 8;
  static constexpr int kAcc = kColumns / 2;  // fp32 accumulators per thread (64 x N)
  static constexpr uint32_t kTileBytes = kAtoms * kTileRows * 128;
  static constexpr uint32_t kQueryBytes = kConsumers * kAtoms * kColumns * 128;
  // Named barriers (0 is __syncthreads): each consumer's turn to issue (kConsumers of them), and
  // the weights and row factors stored (all consumers).
  static constexpr uint32_t kTurnBarrier = 1, kStagedBarrier = kTurnBarrier + kConsumers;
  // FP8 mode sums the heads on the tensor cores (indexer_tile_scores_tc): per consumer a
  // K-major B of kColumns x (2 per query, at most 2 kColumns / 8) bf16 weights.
  static constexpr bool kTensorHeadSum = std::is_same_v<Element, __nv_fp8_e4m3>;
  static constexpr int kHeadSumRows = 2 * kColumns / 8;  // B's N rows per 64-column atom
  struct HeadSumWeights {
    alignas(1024) uint8_t b[kConsumers][kColumns / 64][kHeadSumRows][128];
  };
  struct NoHeadSumWeights {};

  struct SharedStorage {
    alignas(1024) uint8_t q[kConsumers][kAtoms][kColumns][128];
    alignas(1024) uint8_t k[kStages][kAtoms][kTileRows][128];
    std::conditional_t<kTensorHeadSum, HeadSumWeights, NoHeadSumWeights> head_sum;
    alignas(16) float weights[kConsumers][kColumns];  // read as float2
    float row_factor[kSplitRows];  // the split's indexer_row_factor, loaded once
    uint64_t q_full, k_full[kStages], k_empty[kStages];
    int visible;  // the most closed rows of any query of the block
  };
  static constexpr int kSmemBytes = static_cast<int>(sizeof(SharedStorage)) + 1024;
};

// The tiles this CTA scores: its split of the block's closed rows.
struct IndexerTiles {
  int first, last;
};

// Producer: both consumers' queries (a q row per (query, head): q viewed as (B, Sq H, 1, D)),
// then the key tiles through the ring.
template <typename Element>
__device__ __forceinline__ void indexer_produce(
    typename IndexerScoreTraits<Element>::SharedStorage& s, const CUtensorMap* tmap_q,
    const CUtensorMap* tmap_k, const IndexerParams& p, const IndexerBlock& blk,
    IndexerTiles tiles) {
  using T = IndexerScoreTraits<Element>;
  ptx::tma_prefetch_descriptor(tmap_q);
  ptx::tma_prefetch_descriptor(tmap_k);
  const uint32_t q_full = ptx::smem_addr(&s.q_full);
  ptx::mbarrier_arrive_expect_tx(q_full, T::kQueryBytes);
  const int queries = T::kColumns / p.heads;
#pragma unroll
  for (int c = 0; c < T::kConsumers; ++c) {
#pragma unroll
    for (int a = 0; a < T::kAtoms; ++a) {
      ptx::tma_load_4d(ptx::smem_addr(&s.q[c][a][0][0]), tmap_q, q_full, a * T::kAtomElems,
                       (blk.q0 + blk.first_query + c * queries) * p.heads, 0, blk.batch);
    }
  }
  for (int i = 0, t = tiles.first; t < tiles.last; ++i, ++t) {
    const int stage = i % T::kStages;
    ptx::mbarrier_wait(ptx::smem_addr(&s.k_empty[stage]), ((i / T::kStages) & 1) ^ 1);
    const uint32_t full = ptx::smem_addr(&s.k_full[stage]);
    ptx::mbarrier_arrive_expect_tx(full, T::kTileBytes);
#pragma unroll
    for (int a = 0; a < T::kAtoms; ++a) {
      ptx::tma_load_4d(ptx::smem_addr(&s.k[stage][a][0][0]), tmap_k, full, a * T::kAtomElems,
                       blk.k0 + t * T::kTileRows, 0, blk.batch);
    }
  }
}

// The quad's head sums reduced and scattered: in each round a lane keeps half of its queries
// and adds its partner's copy of them (one shuffle per kept value, where a butterfly would
// shuffle every value twice). Enters with kQ per-lane partial sums, leaves with the lane's
// kQ / 4 full sums, of queries 4 n + quad (kQ >= 4; below that, lanes quad < kQ hold query quad).
template <int kQ>
__device__ __forceinline__ void indexer_quad_reduce(float (&v)[kQ], int quad) {
  const int bit0 = quad & 1, bit1 = quad >> 1;
  if constexpr (kQ >= 2) {
#pragma unroll
    for (int m = 0; m < kQ / 2; ++m) {  // keep query 2m + bit0
      const float keep = bit0 ? v[2 * m + 1] : v[2 * m];
      const float give = bit0 ? v[2 * m] : v[2 * m + 1];
      v[m] = keep + __shfl_xor_sync(0xffffffffu, give, 1);
    }
  } else {
    v[0] += __shfl_xor_sync(0xffffffffu, v[0], 1);
  }
  if constexpr (kQ >= 4) {
#pragma unroll
    for (int n = 0; n < kQ / 4; ++n) {  // keep query 4n + 2 bit1 + bit0
      const float keep = bit1 ? v[2 * n + 1] : v[2 * n];
      const float give = bit1 ? v[2 * n] : v[2 * n + 1];
      v[n] = keep + __shfl_xor_sync(0xffffffffu, give, 2);
    }
  } else {
    v[0] += __shfl_xor_sync(0xffffffffu, v[0], 2);
  }
}

// A key row's factor f = sign(scale) k_scale (0 past the sequence's rows), so that
// ReLU(scale k_scale x) = |scale| ReLU(f x). A CTA stages its split's factors in shared memory
// once: read from global memory per tile, their latency outlasted the FP8 product.
__device__ __forceinline__ float indexer_row_factor(const IndexerParams& p, const float* k_scale,
                                                   int seq_c, int row) {
  if (k_scale == nullptr) return p.sign;
  return row < seq_c ? p.sign * k_scale[row * p.k_scale_stride_s] : 0.f;
}

// The row factors f0, f1 (rows r and r + 8) of a tile's accumulators. Where every lane's factors
// are >= 0, ReLU(f x) = f ReLU(x): f then scales the row's sums (post0, post1), a multiply per
// sum instead of per accumulator (the FP8 mode always has row scales); else the accumulators.
template <int kAcc>
__device__ __forceinline__ void indexer_apply_row_factors(float (&acc)[kAcc], float f0, float f1,
                                                          float& post0, float& post1) {
  post0 = f0;
  post1 = f1;
  if (!__all_sync(0xffffffffu, f0 >= 0.f && f1 >= 0.f)) {
    post0 = post1 = 1.f;
#pragma unroll
    for (int j = 0; j < kAcc / 4; ++j) {
      acc[4 * j] *= f0;
      acc[4 * j + 1] *= f0;
      acc[4 * j + 2] *= f1;
      acc[4 * j + 3] *= f1;
    }
  }
}

// The FP8 head sum's N: two columns (hi and lo weights) per query, at least wgmma's 8.
constexpr int indexer_head_sum_columns(int queries) { return 2 * queries < 8 ? 8 : 2 * queries; }

// A consumer's epilogue for one tile: ReLU, the weights and the head sum of its kQ = N / H
// queries, and the scores of its two key rows per query stored to the workspace.
//   acc[4j + {0,1}]: key row r, columns 8j + 2(lane % 4) + {0,1}; acc[4j + {2,3}]: row r + 8.
//   Column n is query n / H, head n % H: query i owns j in [i H / 8, (i + 1) H / 8).
//   f0, f1: rows r and r + 8's factors (indexer_row_factor).
template <int kQ, int kAcc>
__device__ __forceinline__ void indexer_tile_scores(float (&acc)[kAcc], const float* weights,
                                                    const IndexerParams& p, float f0, float f1,
                                                    float* ws, int row0) {
  constexpr int kGroups = kAcc / 4;  // j: 8-column groups
  constexpr int kJ = kGroups / kQ;   // j values per query
  const int quad = threadIdx.x % 4;
  float post0, post1;
  indexer_apply_row_factors(acc, f0, f1, post0, post1);
  const float2* w2 = reinterpret_cast<const float2*>(weights) + quad;
  float s0[kQ], s1[kQ];
#pragma unroll
  for (int i = 0; i < kQ; ++i) {
    s0[i] = s1[i] = 0.f;
#pragma unroll
    for (int j = i * kJ; j < (i + 1) * kJ; ++j) {
      const float2 w = w2[4 * j];
      s0[i] = fmaf(fmaxf(acc[4 * j], 0.f), w.x, s0[i]);
      s0[i] = fmaf(fmaxf(acc[4 * j + 1], 0.f), w.y, s0[i]);
      s1[i] = fmaf(fmaxf(acc[4 * j + 2], 0.f), w.x, s1[i]);
      s1[i] = fmaf(fmaxf(acc[4 * j + 3], 0.f), w.y, s1[i]);
    }
    s0[i] *= post0;
    s1[i] *= post1;
  }
  indexer_quad_reduce<kQ>(s0, quad);
  indexer_quad_reduce<kQ>(s1, quad);
  if constexpr (kQ >= 4) {
#pragma unroll
    for (int n = 0; n < kQ / 4; ++n) {
      float* at = ws + (4 * n + quad) * p.row_stride + row0;
      at[0] = s0[n];
      at[8] = s1[n];
    }
  } else if (quad < kQ) {
    float* at = ws + quad * p.row_stride + row0;
    at[0] = s0[0];
    at[8] = s1[0];
  }
}

// FP8 mode's epilogue: the head sum on the tensor cores. The ReLU'd scores, rounded to bf16,
// are wgmma's A from registers (the accumulator layout is the A fragment's, as FA3 reuses P),
// and B (`head_sum_b`, K-major, swizzled) holds each query's weights on its heads' columns,
// split into bf16 hi and lo parts so that they keep 16 bits: result column 2i + t is query i's
// sum over part t. A score's terms are rounded to bf16 (relative 2^-9); the sum is in fp32.
// The rest as indexer_tile_scores.
template <int kQ, int kRowsPerAtom, int kAcc>
__device__ __forceinline__ void indexer_tile_scores_tc(float (&acc)[kAcc], uint32_t head_sum_b,
                                                       const IndexerParams& p, float f0,
                                                       float f1, float* ws, int row0) {
  constexpr int kN = indexer_head_sum_columns(kQ);
  const int quad = threadIdx.x % 4;
  float post0, post1;
  indexer_apply_row_factors(acc, f0, f1, post0, post1);
  uint32_t a[kAcc / 2];
#pragma unroll
  for (int i = 0; i < kAcc / 2; ++i) a[i] = ptx::pack2_relu_bf16(acc[2 * i], acc[2 * i + 1]);
  float sums[kN / 2];
  ptx::wgmma_fence();
#pragma unroll
  for (int step = 0; step < kAcc / 8; ++step) {  // k16 steps over the consumer's columns
    const uint32_t frag[4] = {a[4 * step], a[4 * step + 1], a[4 * step + 2], a[4 * step + 3]};
    const uint64_t desc = ptx::smem_desc_sw128(
        head_sum_b + (step / 4) * kRowsPerAtom * 128 + (step % 4) * 32, 0, 1024);
    ptx::WgmmaRS<kN, __nv_bfloat16, 0>::run(sums, frag, desc, step != 0);
  }
  ptx::wgmma_commit();
  ptx::wgmma_wait<0>();
#pragma unroll
  for (int j = 0; j < kN / 8; ++j) {
    ptx::fence_operand(sums[4 * j]);
    ptx::fence_operand(sums[4 * j + 1]);
    ptx::fence_operand(sums[4 * j + 2]);
    ptx::fence_operand(sums[4 * j + 3]);
    const int query = 4 * j + quad;  // columns 8j + 2 quad + {hi, lo}
    if (query < kQ) {
      float* at = ws + query * p.row_stride + row0;
      at[0] = (sums[4 * j] + sums[4 * j + 1]) * post0;
      at[8] = (sums[4 * j + 2] + sums[4 * j + 3]) * post1;
    }
  }
}

// The B of indexer_tile_scores_tc for column c (this thread's) of a consumer: weight w in rows
// 2 (c / H) (hi) and 2 (c / H) + 1 (lo), zero in the other rows up to N; the 128-byte swizzle
// moves 16-byte chunk x of row n to x ^ (n % 8).
template <int kQ, int kRowsPerAtom>
__device__ __forceinline__ void indexer_stage_head_sum_b(uint8_t* b, int column, int heads,
                                                         float w) {
  constexpr int kN = indexer_head_sum_columns(kQ);
  const __nv_bfloat16 hi = __float2bfloat16_rn(w);
  const __nv_bfloat16 lo = __float2bfloat16_rn(w - __bfloat162float(hi));
  const int query = column / heads, in_atom = column % 64;
  uint8_t* atom = b + (column / 64) * kRowsPerAtom * 128;
#pragma unroll
  for (int n = 0; n < kN; ++n) {
    const __nv_bfloat16 v =
        n / 2 == query ? (n % 2 == 0 ? hi : lo) : __float2bfloat16_rn(0.f);
    const int chunk = (in_atom / 8) ^ (n % 8);
    *reinterpret_cast<__nv_bfloat16*>(atom + n * 128 + chunk * 16 + (in_atom % 8) * 2) = v;
  }
}

// Consumer `wg` of kQ = N / H queries: their weights (and a share of the split's row factors)
// into shared memory, then per tile: wait for the keys and its turn, issue S = K Q^T (64 x N,
// over the 128 dims), pass the turn to the next consumer, release the keys once read, and
// store the scores.
template <typename Element, int kQ>
__device__ __forceinline__ void indexer_consume(
    typename IndexerScoreTraits<Element>::SharedStorage& s, const IndexerParams& p,
    const IndexerBlock& blk, IndexerTiles tiles, int wg) {
  using T = IndexerScoreTraits<Element>;
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int query0 = blk.first_query + wg * kQ;
  for (int c = tid; c < T::kColumns; c += 128) {
    const int q = query0 + c / p.heads;
    const float w =
        q < blk.seq_q ? p.weight_scale * p.weights[(blk.token0 + q) * p.heads + c % p.heads]
                      : 0.f;
    if constexpr (T::kTensorHeadSum) {
      indexer_stage_head_sum_b<kQ, T::kHeadSumRows>(&s.head_sum.b[wg][0][0][0], c, p.heads, w);
      ptx::fence_proxy_async_smem();  // st.shared, then wgmma's reads (async proxy)
    } else {
      s.weights[wg][c] = w;
    }
  }
  const float* k_scale =
      p.k_scale == nullptr
          ? nullptr
          : p.k_scale + blk.batch * p.k_scale_stride_b + blk.k0 * p.k_scale_stride_s;
  const int split_row0 = tiles.first * T::kTileRows;
  const int split_rows = (tiles.last - tiles.first) * T::kTileRows;
  constexpr int kConsumerThreads = 128 * T::kConsumers;
  constexpr int kFactorsPerThread = T::kSplitRows / kConsumerThreads;  // loads in flight together
  float factor[kFactorsPerThread];
#pragma unroll
  for (int j = 0; j < kFactorsPerThread; ++j) {
    const int r = wg * 128 + tid + j * kConsumerThreads;
    factor[j] = r < split_rows ? indexer_row_factor(p, k_scale, blk.seq_c, split_row0 + r) : 0.f;
  }
#pragma unroll
  for (int j = 0; j < kFactorsPerThread; ++j) {
    const int r = wg * 128 + tid + j * kConsumerThreads;
    if (r < split_rows) s.row_factor[r] = factor[j];
  }
  ptx::named_barrier_sync(T::kStagedBarrier, kConsumerThreads);
  float* ws = p.scores +
              static_cast<int64_t>(blockIdx.y * p.queries_per_block + wg * kQ) * p.row_stride;
  const uint32_t q_base = ptx::smem_addr(&s.q[wg][0][0][0]);
  ptx::mbarrier_wait(ptx::smem_addr(&s.q_full), 0);
  // The turn passes round the consumers, 0 first: the last one opens it.
  if (wg == T::kConsumers - 1) ptx::named_barrier_arrive(T::kTurnBarrier, 256);
  float acc[T::kAcc];
  for (int i = 0, t = tiles.first; t < tiles.last; ++i, ++t) {
    const int stage = i % T::kStages;
    ptx::mbarrier_wait(ptx::smem_addr(&s.k_full[stage]), (i / T::kStages) & 1);
    ptx::named_barrier_sync(T::kTurnBarrier + wg, 256);
#pragma unroll
    for (int r = 0; r < T::kAcc; ++r) ptx::fence_operand(acc[r]);
    ptx::wgmma_fence();
    const uint32_t k_base = ptx::smem_addr(&s.k[stage][0][0][0]);
#pragma unroll
    for (int a = 0; a < T::kAtoms; ++a) {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {  // 32 bytes per k-step
        const uint64_t da =
            ptx::smem_desc_sw128(k_base + a * T::kTileRows * 128 + kk * 32, 0, 1024);
        const uint64_t db =
            ptx::smem_desc_sw128(q_base + a * T::kColumns * 128 + kk * 32, 0, 1024);
        ptx::WgmmaSS<T::kColumns, Element>::run(acc, da, db, (a | kk) != 0);
      }
    }
    ptx::wgmma_commit();
    ptx::named_barrier_arrive(T::kTurnBarrier + (wg + 1) % T::kConsumers, 256);
    const int row0 = t * T::kTileRows + warp * 16 + lane / 4;
    const float f0 = s.row_factor[row0 - split_row0];
    const float f1 = s.row_factor[row0 + 8 - split_row0];
    ptx::wgmma_wait<0>();
#pragma unroll
    for (int r = 0; r < T::kAcc; ++r) ptx::fence_operand(acc[r]);
    if (lane == 0) ptx::mbarrier_arrive(ptx::smem_addr(&s.k_empty[stage]));
    if constexpr (T::kTensorHeadSum) {
      indexer_tile_scores_tc<kQ, T::kHeadSumRows>(
          acc, ptx::smem_addr(&s.head_sum.b[wg][0][0][0]), p, f0, f1, ws, row0);
    } else {
      indexer_tile_scores<kQ>(acc, s.weights[wg], p, f0, f1, ws, row0);
    }
  }
  // The last consumer's last pass of the turn has no issue after it: consume it.
  if (wg == 0) ptx::named_barrier_sync(T::kTurnBarrier, 256);
}

// Calls consume(std::integral_constant<int, kQ>{}) with kQ = kMaxQ >> head_levels: the consumer
// compiled for H = 8 << head_levels (kQ = N / H queries), so that the head sum has static
// shapes; the route keeps H <= N.
template <int kQ, typename Consume>
__device__ __forceinline__ void indexer_per_heads(int head_levels, const Consume& consume) {
  if constexpr (kQ >= 1) {
    if (head_levels == 0) {
      consume(std::integral_constant<int, kQ>{});
    } else {
      indexer_per_heads<kQ / 2>(head_levels - 1, consume);
    }
  }
}

// Grid (splits, chunk_blocks): CTA (x, y) scores key tiles [x, x + 1) * kIndexerTilesPerSplit of
// the chunk's block y, or exits at once where no query of the block has closed rows there.
template <typename Element>
__global__ void __launch_bounds__(IndexerScoreTraits<Element>::kThreads, 1)
    indexer_score_kernel(const __grid_constant__ CUtensorMap tmap_q,
                         const __grid_constant__ CUtensorMap tmap_k, const IndexerParams p) {
  using T = IndexerScoreTraits<Element>;
  auto& s = *reinterpret_cast<typename T::SharedStorage*>(smem_raw + smem_align_offset());
  IndexerBlock blk;
  if (!indexer_block(p, blockIdx.y, blk)) return;
  if (threadIdx.x < 32) {
    const int visible = indexer_block_visible(p, blk, threadIdx.x);
    if (threadIdx.x == 0) {
      s.visible = visible;
      ptx::mbarrier_init(ptx::smem_addr(&s.q_full), 1);
      for (int st = 0; st < T::kStages; ++st) {
        ptx::mbarrier_init(ptx::smem_addr(&s.k_full[st]), 1);
        ptx::mbarrier_init(ptx::smem_addr(&s.k_empty[st]), T::kConsumers * 4);  // per warp
      }
      ptx::fence_barrier_init();
    }
  }
  __syncthreads();
  IndexerTiles tiles;
  tiles.first = blockIdx.x * kIndexerTilesPerSplit;
  tiles.last =
      min(tiles.first + kIndexerTilesPerSplit, (s.visible + T::kTileRows - 1) / T::kTileRows);
  if (tiles.first >= tiles.last) return;  // causally dead: nothing closed in this split

  if (threadIdx.x / 128 == 0) {
    ptx::setmaxnreg_dec<T::kProducerRegs>();
    if (threadIdx.x == 0) indexer_produce<Element>(s, &tmap_q, &tmap_k, p, blk, tiles);
  } else {
    ptx::setmaxnreg_inc<T::kConsumerRegs>();
    const int wg = threadIdx.x / 128 - 1;
    indexer_per_heads<T::kColumns / 8>(p.head_levels, [&](auto q) {
      indexer_consume<Element, decltype(q)::value>(s, p, blk, tiles, wg);
    });
  }
}

}  // namespace dsv4
