// sm90a forward of chunk_gated_delta_rule and chunk_simple_gla (K = V = 128, 64-token chunks).
//
// One CTA owns one (sequence or segment of one, v-head) and walks its chunks in order; each of
// its two chain warpgroups keeps half of the state S (128 x 64 of 128 x 128, fp32) in registers
// the whole way, and one prep warpgroup serves both. The only intermediate in HBM is the delta
// rule's per-chunk T_u, from the parallel inverse kernel (every chunk's, or with kFused the odd
// chunks' only: the prep solves the even ones itself).
// The state is kept transposed (S^T, v-columns as rows) so every product is a wgmma with M = 64
// v-columns and the chain's operands come from registers or from tiles as TMA wrote them.
// Roles (128 threads per warpgroup):
//   warpgroup 0, warp 0  producer: TMA loads of the chunk's q, k (both halves of K), v as
//                        two 64-column tiles (none for a state map) and, for the delta rule, a
//                        bulk copy of the chunk's packed ungated inverse T_u into the P tile
//                        (csrc/sm90/chunk/inverse.cuh, run before this kernel); cp.async
//                        of g and beta (zero past the chunk).
//   warpgroup 1          prep, everything that does not depend on S, up to two chunks ahead:
//                        G = cumsum(g) (log2 units), P = (Q K^T) . Gamma . [i >= j]  and, for the
//                        delta rule, T = (I + strict_lower(beta_i Gamma_ij k_i.k_j))^-1
//                        = Gamma . T_u into the T tile, then P over T_u (a barrier between
//                        them: T_u lands in the P tile). With use_qk_l2norm_in_kernel it first
//                        normalizes the stage's q and k rows in place, before anyone else reads
//                        them (the chain waits for prep_full). kFused, an even chunk: the prep
//                        first solves T_u itself (K K^T by wgmma, invert_unit_lower_64) into the
//                        stage's t and p tiles, and the producer loads none.
//   warpgroups 2, 3      chains, v-columns 0-63 and 64-127, everything that depends on S (the
//                        serial part):
//                          X^T = S^T K^T and Y^T = S^T Q^T                (wgmma RS)
//                          V_new^T = (beta (V - e^G X))^T T^T           (wgmma RS; GLA: V)
//                          O^T = e^G Y^T + V_new^T P^T                  (wgmma RS)
//                          S^T = e^G_last S^T + (w V_new)^T K,  w = e^(G_last - G)  (wgmma RS)
//                        then S^T is packed to 16 bits in registers as the next chunk's A
//                        operand, the next chunk's Y is issued, and O goes through the chain's
//                        staging tile (stmatrix) to HBM while Y runs: one TMA store by its
//                        thread 0 for a whole chunk, coalesced stores for a partial one (always
//                        the walk's last).
//                        A state-only pass (no o) skips Y, O and the prep's P, and so do
//                        the warm-up chunks a segment may walk before its first token.
// Gamma_ij = exp(G_i - G_j) is always computed pairwise, and only where it is selected.
//
// Barriers per stage s (three stages; parity flips once per pass over the ring):
//   full[s]       producer arrive.expect_tx + TMA, and 32 cp.async arrivals  -> prep, chain
//   prep_full[s]  every prep thread after its writes of stage s              -> chain
//   empty[s]      every prep and chain thread after its last read of stage s -> producer
// Registers: producer 24 + prep 104 + two chains at 192 fill the 64K of a 512-thread CTA
// (ptxas, all six instantiations: no spills; at 184 the chain spills, at 88 the prep). The
// delta rule's chain fits 192 only because it waits for Y together with X (see there).
// Tokens past a chunk's end have g = beta = 0 (zero-filled), so they neither decay nor write
// the state, and their output rows are not stored; rows of the next varlen sequence that a TMA
// box may bring in are thereby ignored.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

#include "sm90/chunk/params.h"
#include "sm90/chunk/segments.cuh"
#include "sm90/chunk/tiles.cuh"
#include "ptx/cp_async.cuh"
#include "ptx/math.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/mma_sync.cuh"
#include "ptx/sync.cuh"
#include "ptx/tma.cuh"
#include "ptx/wgmma.cuh"

namespace dsv4 {

template <typename Element>
struct ChunkSm90Traits {
  static constexpr int kChunk = 64;   // tokens per chunk
  static constexpr int kDim = 128;    // K = V
  static constexpr int kBlockV = 64;  // v-columns per chain warpgroup
  static constexpr int kChains = kDim / kBlockV;  // chain warpgroups per CTA: a whole v-head
  static constexpr int kStages = 3;  // two left the chain waiting for loads and prep (6-9%)
  static constexpr int kThreads = 128 * (2 + kChains);
  static constexpr int kInvLd = 72;  // fp16 row stride of the fused inverse's tiles
  // setmaxnreg budget: 128 * (producer + prep + chains) <= 64K registers. Every warpgroup
  // starts at the __launch_bounds__ cap of 128; producer and prep give back what the chains take.
  static constexpr int kLaunchRegs = 65536 / kThreads;
  static constexpr int kProducerRegs = 24, kPrepRegs = 104, kChainRegs = 192;
  static_assert(128 * (kProducerRegs + kPrepRegs + kChains * kChainRegs) <= 65536,
                "register budget");
  static_assert(kPrepRegs <= kLaunchRegs && kChainRegs >= kLaunchRegs, "prep gives, chains take");
  static_assert(kChains * (kChainRegs - kLaunchRegs) <=
                    (kLaunchRegs - kProducerRegs) + (kLaunchRegs - kPrepRegs),
                "the chains take only what the producer and prep free");

  // Every [64][64] tile is 1024-byte aligned and written with the 128-byte swizzle.
  struct alignas(1024) Stage {
    Element q[2][kChunk][64];  // [K half][token][64]
    Element k[2][kChunk][64];
    Element v[kChains][kChunk][64];  // [chain][token][its 64 v-columns]
    Element t[kChunk][64];     // T[i][j] (delta rule)
    Element p[kChunk][64];     // the packed T_u as loaded (delta rule), then P[i][j]
    float g[kChunk];           // raw gates, zero past the chunk
    float beta[kChunk];        // raw beta, zero past the chunk
    float g2[kChunk];          // G = inclusive cumsum(g), times log2(e)
    float eg[kChunk];          // e^G
    float w[kChunk];           // e^(G_last - G)
  };
  struct alignas(1024) SharedStorage {
    Stage stage[kStages];
    // [chain][token][v-column]: o's TMA box, swizzled. One per chain (two would pass 227 KB):
    // a chunk's TMA store has read it before the next chunk writes it.
    Element o_stage[kChains][kChunk][64];
    // kFused: the delta rule's A, then its E blocks, one chunk at a time (the prep's inverse).
    __half inv_a[kChunk][kInvLd];
    uint64_t full[kStages], prep_full[kStages], empty[kStages];
  };
  static constexpr uint32_t kLoadBytes = sizeof(Stage::q) + sizeof(Stage::k) + sizeof(Stage::v);
  static constexpr uint32_t kTuBytes = PackedTu::kElems * sizeof(Element);
  static constexpr uint32_t kLoadBytesDelta = kLoadBytes + kTuBytes;
  static_assert(kTuBytes <= sizeof(Stage::p), "the packed T_u lands in the P tile");
  // kFused: the prep's T_u (fp16, row stride kInvLd) spans the stage's t and p tiles.
  static_assert(offsetof(Stage, p) == offsetof(Stage, t) + sizeof(Stage::t) &&
                    kChunk * kInvLd * sizeof(__half) <= sizeof(Stage::t) + sizeof(Stage::p),
                "the fused T_u spans the t and p tiles");
  static constexpr size_t kSmemBytes = sizeof(SharedStorage) + 1024;  // + alignment slack
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than an sm_90 block can have");
};

// kFused (delta rule only): the prep solves the ungated inverse of every even chunk itself (K K^T
// by wgmma, invert_unit_lower_64 over its four warps) and loads the inverse kernel's T_u only
// for the odd ones. Where HBM sets the pace (a grid of more than one wave), this halves the
// inverse kernel's bytes (its read of k, T_u's round trip) while the prep, ~4,000 cycles longer
// on a solved chunk, stays within the period on average: solving every chunk made the prep the
// limit (measured: no faster than the split form).
template <typename Element, bool kDelta, bool kFused = false>
__global__ void __launch_bounds__(ChunkSm90Traits<Element>::kThreads, 1)
    chunk_sm90_kernel(const __grid_constant__ CUtensorMap tmap_q,
                      const __grid_constant__ CUtensorMap tmap_k,
                      const __grid_constant__ CUtensorMap tmap_v,
                      const __grid_constant__ CUtensorMap tmap_o, const ChunkSm90Params p) {
  using Tr = ChunkSm90Traits<Element>;
  constexpr int kChunk = Tr::kChunk, kStages = Tr::kStages;
  constexpr float kLog2e = 1.4426950408889634f;
  const float neg_inf = __int_as_float(0xff800000);

  // Aligned by offsetting the __shared__ array itself (not through an integer), so the
  // compiler keeps shared-space accesses.
  extern __shared__ uint8_t smem_raw[];
  auto& s = *reinterpret_cast<typename Tr::SharedStorage*>(
      smem_raw + ((1024 - (ptx::smem_addr(smem_raw) & 1023)) & 1023));

  // This CTA's (work item n: a sequence or a segment, v-head hv). Varlen sequences go in the
  // plan's order, the longest first.
  // Launched programmatically behind the op's previous kernel (launch_kernel): nothing it
  // writes is read before this wait. The next kernel, the op's as well, may then be queued.
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();

  // The delta rule's two state-only passes share one launch: the grid's second half walks the
  // state maps (S = I, v taken as zeros) into p.state_maps.
  const bool state_map = p.state_maps != nullptr && blockIdx.x >= gridDim.x / 2;
  float* const final_state = state_map ? p.state_maps : p.final_state;
  const int work = state_map ? blockIdx.x - gridDim.x / 2 : blockIdx.x;
  const int hv = work % p.heads_v;
  int n = work / p.heads_v;
  int len, tma_row0, tma_batch;
  int64_t row_base;  // row of the sequence's first token in the (B * T) token rows
  if (p.sequences != nullptr) {
    n = p.order[n];
    const VarlenRows seq = p.sequences[n];
    len = seq.len;
    tma_row0 = seq.start;
    tma_batch = 0;
    row_base = seq.start;
  } else {  // sequence b, or its segment k when the call is cut into segments
    const int b = n / p.walked_segments, k = n % p.walked_segments;
    n = b * p.segments + k;
    tma_row0 = k * p.segment_len;
    len = min(p.segment_len, p.seqlen - tma_row0);
    tma_batch = b;
    row_base = static_cast<int64_t>(b) * p.seqlen + tma_row0;
  }
  // Segment split: a state-only pass skips heads that start from warm-ups; the last pass walks
  // `warm` chunks before the sequence from S = 0 and writes o only from the sequence's start.
  int warm = 0;
  if (p.warmup != nullptr) {
    // A state-only pass reads every segment's entry (segment_exact); the last pass its own,
    // which the combine set to -1 in an exact head.
    int plan;
    if (p.o != nullptr) {
      plan = p.warmup[static_cast<int64_t>(n) * p.heads_v + hv];
    } else {
      plan = segment_exact(p.warmup, n / p.segments, p.segments, p.heads_v, hv) ? -1 : 0;
    }
    if (p.o == nullptr && plan >= 0) return;  // whole CTA, before any barrier
    warm = max(plan, 0);
    len += warm * kChunk;
    tma_row0 -= warm * kChunk;
    row_base -= warm * kChunk;
  }
  const int num_chunks = (len + kChunk - 1) / kChunk;
  const int head_qk = hv / p.group;

  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) {
      ptx::mbarrier_init(ptx::smem_addr(&s.full[i]), 1 + 32);
      ptx::mbarrier_init(ptx::smem_addr(&s.prep_full[i]), 128);
      ptx::mbarrier_init(ptx::smem_addr(&s.empty[i]), 128 * (1 + Tr::kChains));
    }
    ptx::fence_barrier_init();
  }
  if (state_map) {  // v is never loaded: its tiles stay zero
    for (int i = threadIdx.x; i < kStages * int(sizeof(s.stage[0].v) / 16);
         i += Tr::kThreads) {
      reinterpret_cast<uint4*>(&s.stage[i % kStages].v[0][0][0])[i / kStages] =
          make_uint4(0, 0, 0, 0);
    }
  }
  __syncthreads();

  const int warpgroup = threadIdx.x / 128;
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;

  if (warpgroup == 0) {
    // ------------------------------------------------------------------ producer
    ptx::setmaxnreg_dec<Tr::kProducerRegs>();
    if (warp != 0) return;
    if (lane == 0) {
      ptx::tma_prefetch_descriptor(&tmap_q);
      ptx::tma_prefetch_descriptor(&tmap_k);
      ptx::tma_prefetch_descriptor(&tmap_v);
    }
    // The walk's first chunk slot of T_u (PackedTu), then one slot further per chunk.
    const Element* t_u_chunk = nullptr;
    if constexpr (kDelta) {
      const int64_t slot0 = p.sequences != nullptr ? p.chunk_start[n]
                                                   : static_cast<int64_t>(tma_batch) *
                                                             p.chunks_per_seq +
                                                         tma_row0 / kChunk;
      t_u_chunk = static_cast<const Element*>(p.t_u) + (slot0 * p.heads_v + hv) * PackedTu::kElems;
    }
    for (int c = 0; c < num_chunks; ++c) {
      const int st = c % kStages;
      const uint32_t phase = (c / kStages) & 1;
      auto& S = s.stage[st];
      const uint32_t full = ptx::smem_addr(&s.full[st]);
      ptx::mbarrier_wait(ptx::smem_addr(&s.empty[st]), phase ^ 1);
      const int row = tma_row0 + c * kChunk;
      const bool load_t_u = kDelta && !(kFused && c % 2 == 0);
      if (lane == 0) {
        ptx::mbarrier_arrive_expect_tx(
            full,
            (load_t_u ? Tr::kLoadBytesDelta : Tr::kLoadBytes) - (state_map ? sizeof(S.v) : 0));
        for (int cb = 0; cb < 2; ++cb) {
          ptx::tma_load_4d(ptx::smem_addr(&S.q[cb][0][0]), &tmap_q, full, cb * 64, row, head_qk,
                           tma_batch);
          ptx::tma_load_4d(ptx::smem_addr(&S.k[cb][0][0]), &tmap_k, full, cb * 64, row, head_qk,
                           tma_batch);
        }
        if (!state_map) {
          for (int ch = 0; ch < Tr::kChains; ++ch) {
            ptx::tma_load_4d(ptx::smem_addr(&S.v[ch][0][0]), &tmap_v, full, ch * Tr::kBlockV, row,
                             hv, tma_batch);
          }
        }
        if (load_t_u) ptx::bulk_load(ptx::smem_addr(&S.p[0][0]), t_u_chunk, Tr::kTuBytes, full);
        if constexpr (kDelta) t_u_chunk += static_cast<int64_t>(p.heads_v) * PackedTu::kElems;
      }
      const int valid_rows = min(kChunk, len - c * kChunk);
#pragma unroll
      for (int i = lane; i < kChunk; i += 32) {
        const bool valid = i < valid_rows;
        const int64_t idx = valid ? (row_base + c * kChunk + i) * p.heads_v + hv : 0;
        ptx::cp_async_4_zfill(ptx::smem_addr(&S.g[i]), p.g + idx, valid);
        if constexpr (kDelta) ptx::cp_async_4_zfill(ptx::smem_addr(&S.beta[i]), p.beta + idx, valid);
      }
      ptx::cp_async_mbarrier_arrive_noinc(full);
    }
    return;
  }

  // Accumulator fragment of an m64nN wgmma: this thread holds rows r and r + 8, and in each
  // 8-column group j the columns 8j + 2 (lane % 4) + {0, 1}:
  //   acc[4j + 2i + c] = (row r + 8i, col 8j + 2 (lane % 4) + c),  r = 16 warp + lane / 4.
  const int frag_row = warp * 16 + lane / 4;
  const int frag_col = 2 * (lane % 4);

  if (warpgroup == 1) {
    // ------------------------------------------------------------------ prep
    ptx::setmaxnreg_dec<Tr::kPrepRegs>();
    constexpr uint32_t kPrepBar = 1;
    for (int c = 0; c < num_chunks; ++c) {
      const bool write_p = p.o != nullptr && c >= warm;  // P feeds only o's products
      // The fragment's row and column, opaque so that the offsets derived from them are
      // computed per chunk: hoisted, they outlive the fused inverse's registers and spill.
      const int prep_row = kFused ? ptx::opaque(frag_row) : frag_row;
      const int prep_col = kFused ? ptx::opaque(frag_col) : frag_col;
      const int st = c % kStages;
      const uint32_t phase = (c / kStages) & 1;
      auto& S = s.stage[st];
      ptx::mbarrier_wait(ptx::smem_addr(&s.full[st]), phase);
      if constexpr (kDelta) {
        if (p.qk_l2norm) {
          l2norm_rows_in_place<Element>(tid < kChunk ? &S.q[0][0][0] : &S.k[0][0][0],
                                        ptx::opaque(tid % kChunk));  // offsets not hoisted
          ptx::fence_proxy_async_smem();  // the normalized q and k are read by wgmma
          ptx::named_barrier_sync(kPrepBar, 128);
        }
      }
      // kFused, an even chunk: T_u = (I + strict_lower(beta_i k_i.k_j))^-1 over the chunk's
      // valid rows, in fp16 over the stage's t and p tiles (the gating pass reads it, then
      // overwrites it).
      auto* const fused_t_u = reinterpret_cast<__half(*)[Tr::kInvLd]>(&S.t[0][0]);
      const bool solve_here = kFused && c % 2 == 0;
      if (solve_here) {
        float kacc[32];
        k_times_k_transposed<Element>(kacc, ptx::smem_addr(&S.k[0][0][0]));
        store_beta_kkt<Tr::kInvLd>(kacc, S.beta, min(kChunk, len - c * kChunk), s.inv_a,
                                   prep_row, prep_col);
        // A written; the previous chunk's gating pass has read its stage's T_u long before.
        ptx::named_barrier_sync(kPrepBar, 128);
        // warp and lane opaque too: addresses hoisted out of the chunk loop would spill.
        invert_unit_lower_64<Tr::kInvLd>(s.inv_a, fused_t_u, ptx::opaque(warp), ptx::opaque(lane),
                                         [] { ptx::named_barrier_sync(kPrepBar, 128); }, [] {});
      }

      // P_raw = Q K^T (token x token).
      float pacc[32];
      const uint32_t q_base = ptx::smem_addr(&S.q[0][0][0]);
      const uint32_t k_base = ptx::smem_addr(&S.k[0][0][0]);
      ptx::wgmma_fence();
      if (write_p) {
#pragma unroll
        for (int cb = 0; cb < 2; ++cb) {
#pragma unroll
          for (int kk = 0; kk < 4; ++kk) {
            const uint32_t off = cb * kChunk * 128 + kk * 32;
            const uint64_t dk = ptx::smem_desc_sw128(k_base + off, 0, 1024);
            ptx::WgmmaSS<64, Element>::run(pacc, ptx::smem_desc_sw128(q_base + off, 0, 1024),
                                           dk, (cb | kk) != 0);
          }
        }
      }
      ptx::wgmma_commit();

      // G: inclusive prefix sum of the gates over the chunk, in log2 units.
      if (warp == 0) {
        const float g0 = S.g[2 * lane], g1 = S.g[2 * lane + 1];
        float incl = g0 + g1;
#pragma unroll
        for (int d = 1; d < 32; d *= 2) {
          const float up = __shfl_up_sync(0xffffffff, incl, d);
          if (lane >= d) incl += up;
        }
        const float g_last = __shfl_sync(0xffffffff, incl, 31) * kLog2e;
        const float ga = (incl - g1) * kLog2e, gb = incl * kLog2e;
        S.g2[2 * lane] = ga;
        S.g2[2 * lane + 1] = gb;
        S.eg[2 * lane] = ptx::exp2_approx(ga);
        S.eg[2 * lane + 1] = ptx::exp2_approx(gb);
        S.w[2 * lane] = ptx::exp2_approx(g_last - ga);
        S.w[2 * lane + 1] = ptx::exp2_approx(g_last - gb);
      }
      ptx::named_barrier_sync(kPrepBar, 128);
      ptx::wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < 32; ++i) ptx::fence_operand(pacc[i]);

      float g_col[16];  // G of this thread's 16 columns
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float2 g2v = *reinterpret_cast<const float2*>(&S.g2[8 * j + prep_col]);
        g_col[2 * j] = g2v.x;
        g_col[2 * j + 1] = g2v.y;
      }
      // This thread's T_u pairs, all loaded before any is used (a load per pair under its own
      // condition kept the gating pass one dependent chain, 2,700-3,200 cycles per chunk). An
      // upper block's pair lands inside the packed tile, on entries of another block, and the
      // select below drops it. Pair (i, j) sits at a constant distance from pair (0, 0): block
      // column j / 2 (256 elements per block), row 8 i, column 8 (j % 2).
      uint32_t t_u_pairs[2][8];
      if (solve_here) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            t_u_pairs[i][j] = load_at<uint32_t>(&fused_t_u[prep_row + 8 * i][8 * j + prep_col], 0);
          }
        }
        // Every prep thread has its T_u: T and P may overwrite the tiles under it.
        ptx::named_barrier_sync(kPrepBar, 128);
      } else if constexpr (kDelta) {
        const uint8_t* t_u_at = reinterpret_cast<const uint8_t*>(&S.p[0][0]) +
                                2 * ptx::opaque(PackedTu::offset(prep_row, prep_col));
#pragma unroll
        for (int i = 0; i < 2; ++i) {
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            t_u_pairs[i][j] = load_at<uint32_t>(t_u_at, 2 * (256 * (j / 2) + 128 * i + 8 * (j % 2)));
          }
        }
      }
      // T = Gamma . T_u (delta rule) into the T tile, and P_raw . Gamma in registers, at the same
      // (row, col) pairs; then P into the P tile, where T_u landed, once every prep thread has
      // read its T_u. T rows of tokens past the sequence are zero (so is their beta).
      const int valid_rows = min(kChunk, len - c * kChunk);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int row = prep_row + 8 * i;
        const float gi = S.g2[row];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          float gamma[2];
#pragma unroll
          for (int cc = 0; cc < 2; ++cc) {
            const int col = 8 * j + prep_col + cc;
            // Selected before exp: the upper triangle never reaches the exponential.
            gamma[cc] = ptx::exp2_approx(row >= col ? gi - g_col[2 * j + cc] : neg_inf);
          }
          if (write_p) {
            pacc[4 * j + 2 * i] *= gamma[0];
            pacc[4 * j + 2 * i + 1] *= gamma[1];
          }
          if constexpr (kDelta) {
            const int col = 8 * j + prep_col;
            const bool row_in = row < valid_rows;
            float t_u[2];
            if (solve_here) {
              const float2 x = __half22float2(*reinterpret_cast<const __half2*>(&t_u_pairs[i][j]));
              t_u[0] = x.x;
              t_u[1] = x.y;
            } else {
              const Element* x = reinterpret_cast<const Element*>(&t_u_pairs[i][j]);
              t_u[0] = ptx::to_float(x[0]);
              t_u[1] = ptx::to_float(x[1]);
            }
            store_at(&S.t[0][0], sw128_offset(row, col),
                     ptx::pack2<Element>(row_in && row >= col ? gamma[0] * t_u[0] : 0.f,
                                         row_in && row >= col + 1 ? gamma[1] * t_u[1] : 0.f));
          }
        }
      }
      if (write_p) {
        if (kDelta && !solve_here) ptx::named_barrier_sync(kPrepBar, 128);  // T_u read
#pragma unroll
        for (int i = 0; i < 2; ++i) {
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            store_at(&S.p[0][0], sw128_offset(prep_row + 8 * i, 8 * j + prep_col),
                     ptx::pack2<Element>(pacc[4 * j + 2 * i], pacc[4 * j + 2 * i + 1]));
          }
        }
      }
      ptx::fence_proxy_async_smem();  // P and T are read by the chain's wgmmas
      ptx::named_barrier_sync(kPrepBar, 128);
      // Every thread releases its own writes and reads, so the handoff does not depend on
      // the named barrier's cumulativity (and compute-sanitizer racecheck can follow it).
      ptx::mbarrier_arrive(ptx::smem_addr(&s.prep_full[st]));
      ptx::mbarrier_arrive(ptx::smem_addr(&s.empty[st]));
    }
    return;
  }

  // -------------------------------------------------------------------- chain
  ptx::setmaxnreg_inc<Tr::kChainRegs>();
  // This chain's v-columns; broadcast from lane 0, which ptxas treats as warp-uniform.
  const int chain = __shfl_sync(0xffffffff, warpgroup - 2, 0);
  const int v0 = chain * Tr::kBlockV;
  const uint32_t chain_bar = 2 + chain;  // named barrier of this chain's 128 threads
  const int64_t state_offset = (static_cast<int64_t>(n) * p.heads_v + hv) * 128 * 128;
  // Where S starts (warm == 0): a later segment of a head without warm-ups from the combine's
  // state, a sequence or its first segment from the call's initial state.
  const bool later_segment = p.segment_start != nullptr && n % p.segments != 0;
  const float* start_state = later_segment ? p.segment_start : p.initial_state;
  const int64_t start_offset =
      later_segment ? state_offset
                    : (static_cast<int64_t>(n / p.segments) * p.heads_v + hv) * 128 * 128;
  // S^T (64 v-columns x 128 key dims): sacc[4j + 2i + c] = S[key 8j + frag_col + c][v0 + row].
  float sacc[64];
#pragma unroll
  for (int j = 0; j < 16; ++j) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int cc = 0; cc < 2; ++cc) {
        const int key = 8 * j + frag_col + cc, col = v0 + frag_row + 8 * i;
        if (state_map) {
          sacc[4 * j + 2 * i + cc] = key == col ? 1.f : 0.f;
        } else {
          sacc[4 * j + 2 * i + cc] = start_state != nullptr && warm == 0
                                         ? start_state[start_offset + key * 128 + col]
                                         : 0.f;
        }
      }
    }
  }
  // S^T in 16 bits as the A operand of the next chunk's products: an accumulator's 8-column
  // groups 2t and 2t + 1 are exactly k-step t's A fragment, so S never goes through shared memory.
  uint32_t sfrag[8][4];
  auto pack_state = [&] {
#pragma unroll
    for (int j = 0; j < 16; ++j) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        sfrag[j / 2][2 * (j % 2) + i] =
            ptx::pack2<Element>(sacc[4 * j + 2 * i], sacc[4 * j + 2 * i + 1]);
      }
    }
  };
  pack_state();

  Element* out = static_cast<Element*>(p.o);
  // No o: a state-only pass or a warm-up chunk (intra-sequence split).
  auto writes_o = [&](int c) { return out != nullptr && c >= warm; };
  // X and Y read only the loaded q and k, so they wait for the prep only when it normalizes
  // q and k in place.
  const bool prep_rewrites_qk = kDelta && p.qk_l2norm;

  // X^T = S^T K^T and Y^T = S^T Q^T (v-column x token). Y is issued one chunk ahead, under the
  // previous chunk's o staging, and stays in flight into the loop and across its back edge on
  // every path (ptxas serializes the chain otherwise): the last chunk issues it once more on its
  // own stage, which nobody refills, and a walk without chunks on stage 0, which nobody fills;
  // those results are never read. X is issued at the top of its chunk (with both ahead beside
  // o, the delta chain passes 192 registers and ptxas serializes its wgmmas, C7512).
  float xacc[32], yacc[32];
  // acc = S^T X^T over the 128 key dims, X a [K half][token][64] tile of the stage.
  auto st_times = [&](float(&acc)[32], uint32_t x_base) {
#pragma unroll
    for (int cb = 0; cb < 2; ++cb) {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const uint64_t db = ptx::smem_desc_sw128(x_base + cb * kChunk * 128 + kk * 32, 0, 1024);
        ptx::WgmmaRS<64, Element, 0>::run(acc, sfrag[4 * cb + kk], db, (cb | kk) != 0);
      }
    }
    ptx::wgmma_commit();
  };
  auto issue_y = [&](int cn) {
    const int st = cn % kStages;
    if (cn < num_chunks) {
      const uint32_t phase = (cn / kStages) & 1;
      ptx::mbarrier_wait(ptx::smem_addr(&s.full[st]), phase);
      if (prep_rewrites_qk) ptx::mbarrier_wait(ptx::smem_addr(&s.prep_full[st]), phase);
    }
    ptx::wgmma_fence();
    // A state-only pass skips o's products (an empty group keeps the wait counts).
    if (writes_o(cn)) {
      st_times(yacc, ptx::smem_addr(&s.stage[st].q[0][0][0]));
    } else {
      ptx::wgmma_commit();
    }
  };
  issue_y(0);

  for (int c = 0; c < num_chunks; ++c) {
    const bool write_o = writes_o(c);
    const int st = c % kStages;
    const uint32_t phase = (c / kStages) & 1;
    auto& S = s.stage[st];
    const int valid_rows = min(kChunk, len - c * kChunk);
    const uint32_t k_base = ptx::smem_addr(&S.k[0][0][0]);
    if constexpr (kDelta) {
      ptx::wgmma_fence();
      st_times(xacc, k_base);  // q and k have landed (issue_y waited)
    }
    if (!prep_rewrites_qk) ptx::mbarrier_wait(ptx::smem_addr(&s.prep_full[st]), phase);

    // V^T in the accumulator layout (v-column x token) by ldmatrix.trans from the swizzled
    // [token][v-column] tile: matrix m of step u is tokens 16 u + 8 (m >> 1) by v-columns
    // 16 warp + 8 (m & 1), so pair (i, j) of the fragment (v-column frag_row + 8 i, tokens
    // 8 j + frag_col + {0, 1}) is v_pairs[j / 2][i + 2 (j % 2)]. Four instructions where
    // 32 two-byte loads and their swizzle arithmetic sat on the chain.
    uint32_t v_pairs[4][4];
    {
      const int m = lane / 8;
      // Token 16 u + t sits 2048 u bytes after token t (the swizzle reads its low three bits).
      const uint32_t v_row = ptx::smem_addr(&S.v[chain][0][0]) +
                             sw128_offset(8 * (m >> 1) + lane % 8, 16 * warp + 8 * (m & 1));
#pragma unroll
      for (int u = 0; u < 4; ++u) ptx::ldmatrix_x4_trans(v_pairs[u], v_row + 2048 * u);
    }
    auto v_pair = [&](int i, int j) {
      return reinterpret_cast<const Element*>(&v_pairs[j / 2][i + 2 * (j % 2)]);
    };
    // e^G of this thread's token pairs (8 j + frag_col + {0, 1}), read as pairs.
    float2 eg_pair[8];
    auto load_eg = [&] {
#pragma unroll
      for (int j = 0; j < 8; ++j) eg_pair[j] = load_at<float2>(S.eg, 4 * (8 * j + frag_col));
    };
    // e^G Y^T and e^G_last S^T, in place; in the delta rule under V_new's product, where
    // neither accumulator is in flight.
    auto gate_y = [&] {
#pragma unroll
      for (int i = 0; i < 32; ++i) ptx::fence_operand(yacc[i]);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          yacc[4 * j + 2 * i] *= eg_pair[j].x;
          yacc[4 * j + 2 * i + 1] *= eg_pair[j].y;
        }
      }
    };
    auto decay_state = [&] {
      const float chunk_decay = S.eg[kChunk - 1];
#pragma unroll
      for (int i = 0; i < 64; ++i) sacc[i] *= chunk_decay;
    };
    float vnew[32];  // V_new^T
    if constexpr (kDelta) {
      // Y as well as X: with Y in flight, its A operand (S^T in 16 bits) would stay live beside
      // V_new's operands and accumulator, past 192 registers, and ptxas would serialize every
      // wgmma of the chain (C7512).
      ptx::wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < 32; ++i) ptx::fence_operand(xacc[i]);
      load_eg();
      uint32_t xfrag[4][4];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float2 beta = load_at<float2>(S.beta, 4 * (8 * j + frag_col));
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const Element* v = v_pair(i, j);
          float x[2];
          x[0] = beta.x * (ptx::to_float(v[0]) - eg_pair[j].x * xacc[4 * j + 2 * i]);
          x[1] = beta.y * (ptx::to_float(v[1]) - eg_pair[j].y * xacc[4 * j + 2 * i + 1]);
          // A fragment of k-step j / 2: registers {rows r, r+8} x {cols 0-7, 8-15}.
          xfrag[j / 2][2 * (j % 2) + i] = ptx::pack2<Element>(x[0], x[1]);
        }
      }
      ptx::wgmma_fence();
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        const uint64_t db = ptx::smem_desc_sw128(ptx::smem_addr(&S.t[0][0]) + t * 32, 0, 1024);
        ptx::WgmmaRS<64, Element, 0>::run(vnew, xfrag[t], db, t != 0);
      }
      ptx::wgmma_commit();
      gate_y();  // Y landed with X
      decay_state();
      ptx::wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < 32; ++i) ptx::fence_operand(vnew[i]);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
#pragma unroll
          for (int cc = 0; cc < 2; ++cc) {
            const int token = 8 * j + frag_col + cc;
            vnew[4 * j + 2 * i + cc] = token < valid_rows ? ptx::to_float(v_pair(i, j)[cc]) : 0.f;
          }
        }
      }
      // (Before this wait, ptxas injects one: C7517.)
      ptx::wgmma_wait<0>();
      load_eg();
      gate_y();
      decay_state();
    }

    // O^T = e^G Y^T + V_new^T P^T;  S^T = e^G_last S^T + (w V_new)^T K.
    uint32_t vfrag[4][4], wfrag[4][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float2 w_pair = load_at<float2>(S.w, 4 * (8 * j + frag_col));
      const float w[2] = {w_pair.x, w_pair.y};
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int idx = 4 * j + 2 * i;
        vfrag[j / 2][2 * (j % 2) + i] = ptx::pack2<Element>(vnew[idx], vnew[idx + 1]);
        wfrag[j / 2][2 * (j % 2) + i] = ptx::pack2<Element>(vnew[idx] * w[0], vnew[idx + 1] * w[1]);
      }
    }
    ptx::wgmma_fence();
    if (write_o) {
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        const uint64_t db = ptx::smem_desc_sw128(ptx::smem_addr(&S.p[0][0]) + t * 32, 0, 1024);
        ptx::WgmmaRS<64, Element, 0>::run(yacc, vfrag[t], db, 1);
      }
    }
    ptx::wgmma_commit();
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      // K as B (token x key dim) read MN-major: 16 tokens per k-step, the two key halves 8 KB apart.
      const uint64_t db = ptx::smem_desc_sw128(k_base + t * 16 * 128, kChunk * 128, 1024);
      ptx::WgmmaRS<128, Element, 1>::run(sacc, wfrag[t], db, 1);
    }
    ptx::wgmma_commit();
    ptx::wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 32; ++i) ptx::fence_operand(yacc[i]);
#pragma unroll
    for (int i = 0; i < 64; ++i) ptx::fence_operand(sacc[i]);
    ptx::mbarrier_arrive(ptx::smem_addr(&s.empty[st]));  // last read of this stage

    pack_state();
    // O^T * scale in 16 bits: o_pack[j][i] is the pair at rows 8 i, columns 8 j + frag_col, of
    // this thread's fragment (yacc is the next chunk's accumulator from here on).
    uint32_t o_pack[8][2];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        o_pack[j][i] =
            ptx::pack2<Element>(yacc[4 * j + 2 * i] * p.scale, yacc[4 * j + 2 * i + 1] * p.scale);
      }
    }
    issue_y(min(c + 1, num_chunks - 1));

    Element* stage_o = &s.o_stage[chain][0][0];
    if (write_o) {
      // Chunk c - 1's TMA store has read the tile (a partial chunk's readers are the walk's
      // last, so none is left).
      if (tid == 0) ptx::bulk_wait_group_read<0>();
      ptx::named_barrier_sync(chain_bar, 128);
      // O^T's 8 x 8 blocks, transposed by stmatrix into the [token][v-column] tile. Matrix m of
      // step j: v-columns 8 (m & 1) of this warp's 16, tokens 8 (j + (m >> 1)); lane 8 m + k
      // addresses its token row k. Token 8 j + t sits 1024 j bytes after token t (the swizzle
      // reads only the token's low three bits), so one address serves every step.
      const int m = lane / 8;
      const uint32_t o_row = ptx::smem_addr(stage_o) +
                             sw128_offset(8 * (m >> 1) + lane % 8, 16 * warp + 8 * (m & 1));
#pragma unroll
      for (int j = 0; j < 8; j += 2) {
        ptx::stmatrix_x4_trans(o_row + 1024 * j,
                               {o_pack[j][0], o_pack[j][1], o_pack[j + 1][0], o_pack[j + 1][1]});
      }
      ptx::fence_proxy_async_smem();  // read by the TMA store
    }
    ptx::named_barrier_sync(chain_bar, 128);  // o_stage written
    if (write_o && valid_rows == kChunk) {
      // Off the chain: the TMA unit drains the tile while the next chunk's products run.
      if (tid == 0) {
        ptx::tma_store_4d(&tmap_o, ptx::smem_addr(stage_o), v0, tma_row0 + c * kChunk, hv,
                          tma_batch);
        ptx::bulk_commit_group();
      }
    } else if (write_o) {
      // A partial chunk: only its own rows (a box would also write the next sequence's).
      // 64 tokens x 128 bytes, 16 bytes per thread per step.
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int idx = tid + 128 * u, token = idx / 8, part = idx % 8;
        if (token < valid_rows) {
          const uint4 val = load_at<uint4>(stage_o, token * 128 + (((part ^ token) & 7) << 4));
          const int64_t row = row_base + c * kChunk + token;
          *reinterpret_cast<uint4*>(out + (row * p.heads_v + hv) * 128 + v0 + part * 8) = val;
        }
      }
    }
  }
  ptx::wgmma_wait<0>();  // the last chunk's repeated Y (unused)
  if (tid == 0) ptx::bulk_wait_group<0>();  // the last stores complete before the CTA exits

  if (final_state != nullptr &&
      (!p.final_per_sequence || n % p.segments == p.segments - 1)) {
    const int64_t final_offset =
        p.final_per_sequence ? (static_cast<int64_t>(n / p.segments) * p.heads_v + hv) * 128 * 128
                             : state_offset;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
#pragma unroll
        for (int cc = 0; cc < 2; ++cc) {
          const int key = 8 * j + frag_col + cc, col = v0 + frag_row + 8 * i;
          final_state[final_offset + key * 128 + col] = sacc[4 * j + 2 * i + cc];
        }
      }
    }
  }
}

}  // namespace dsv4
