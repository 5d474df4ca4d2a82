// The narrow form's consumer warpgroups (Mqa512NarrowTraits in traits.h has the protocol).
// Consumer c takes the ring's key tiles g % 2 == c of a work tile (one token's heads), each
// whole: S^T = K Q^T over 512 dims, its own online softmax per head, O^T += V^T P^T over 512
// dims. At the end the one that took the last tile merges the other's partial result into its
// own and stores the token (finish_tile).
#pragma once

#include <cstdint>

#include "ptx/math.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/sync.cuh"
#include "ptx/wgmma.cuh"
#include "sm90/mqa512/traits.h"
#include "sm90/mqa512/work.cuh"
#include "sm90/shared/online_softmax.cuh"
#include "sm90/shared/trace.cuh"

namespace dsv4 {

template <typename Element>
struct Mqa512NarrowConsumer {
  using T = Mqa512NarrowTraits<Element>;
  static constexpr int kBlockN = T::kBlockN, kCols = T::kColBlocks, kHeads = T::kBlockM;

  typename T::SharedStorage& s;
  const Mqa512Sm90Params& p;
  const int wg;
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  // The m64n16 accumulator fragment: this thread holds rows r and r + 8 (r = 16 warp +
  // lane / 4; S^T: keys, O^T: dims) of heads 8j + 2 (lane % 4) + c: acc[4j + 2i + c]. Its four
  // heads are numbered k = 2j + c.
  const int col_lane = 2 * (lane % 4);
  const int frag_row = warp * 16 + lane / 4;
  Mqa512TileInfo& info;
  const Mqa512WorkTile& w;
  const Mqa512KeySegments& seg;

  float o[kCols][8];  // O^T, 64 dims a block
  float sacc[8];      // S^T, then P^T, of the current key tile
  float m_run[4];     // per head: the reference max (log2 domain, lazily raised)
  float l_run[4];     // per head: this thread's partial sum over its keys
  int handoffs = 0;         // partial results handed over so far (both consumers count them)
  int own_sums_parity = 0;  // which own_sums buffer this consumer's next merge writes

  __device__ __forceinline__ Mqa512NarrowConsumer(typename T::SharedStorage& storage,
                                                  const Mqa512Sm90Params& params, int warpgroup)
      : s(storage),
        p(params),
        wg(warpgroup),
        info(*reinterpret_cast<Mqa512TileInfo*>(&storage.tile_info[warpgroup * 4 + warp][0])),
        w(info.w),
        seg(info.seg) {}

  __device__ __forceinline__ static int head_of(int k, int col_lane) {
    return 8 * (k / 2) + col_lane + k % 2;
  }

  // As the seesaw consumer's: this warp's copy of the published work tile; then O^T and the
  // softmax state start over. Returns the work tile's key tiles.
  __device__ __forceinline__ int take_tile(const Mqa512Progress& progress) {
    mqa512_copy_tile_info<T::kTileCopyLanes>(s, progress, wg * 4 + warp, lane);
#pragma unroll
    for (int cb = 0; cb < kCols; ++cb) {
#pragma unroll
      for (int e = 0; e < 8; ++e) o[cb][e] = 0.f;
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      m_run[k] = __int_as_float(0xff800000);
      l_run[k] = 0.f;
    }
    DSV4_TRACE_STAMP(wg, kTraceNarrowTake, tid == 0);
    return info.n;
  }

  // S^T = K Q^T for the tile in stage st, set `set`: the column blocks in order (both consumers
  // add them in one order, so a tile's scores do not depend on which consumer took it), each as
  // soon as it has landed.
  __device__ __forceinline__ void qk(int st, int set, uint32_t parity) {
    const uint64_t k_desc = ptx::smem_desc_sw128(ptx::smem_addr(&s.kv[st][0][0][0]), 0, 1024);
    const uint64_t q_desc = ptx::smem_desc_sw128(ptx::smem_addr(&s.q[0][0][0]), 0, 1024);
#pragma unroll
    for (int cb = 0; cb < kCols; ++cb) {
      ptx::mbarrier_wait(ptx::smem_addr(&s.kv_full[set][cb]), parity);
      if (cb == 0) DSV4_TRACE_STAMP(wg, kTraceNarrowFirstBlock, tid == 0);
      // A gathered tile's cp.async writes complete on the barrier with no thread after them.
      ptx::fence_proxy_async_smem();
      ptx::wgmma_fence();  // after a spin-wait, or ptxas serializes every wgmma (C7520)
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        ptx::WgmmaSS<kHeads, Element, 0, 0>::run(
            sacc, ptx::smem_desc_advance(k_desc, cb * kBlockN * 128 + kk * 32),
            ptx::smem_desc_advance(q_desc, cb * kHeads * 128 + kk * 32), (cb | kk) == 0 ? 0 : 1);
      }
    }
    ptx::wgmma_commit();
    ptx::wgmma_wait<0>();
#pragma unroll
    for (int e = 0; e < 8; ++e) ptx::fence_operand(sacc[e]);
    DSV4_TRACE_STAMP(wg, kTraceNarrowQkDone, tid == 0);
  }

  // Masks this thread's keys of tile r (stage st) that the token cannot see: a listed tile's
  // invisible slots (csa_slots), or a window tile's keys outside the token's range.
  __device__ __forceinline__ void mask_tile(int r, int st) {
    const float neg_inf = __int_as_float(0xff800000);
    bool visible[2];
    if (r >= seg.num_kv) {
      const uint4 slots = *reinterpret_cast<const uint4*>(&s.csa_slots[st][0]);
      const uint32_t word = warp < 2 ? slots.x : slots.y;  // keys 0-31, 32-63
#pragma unroll
      for (int i = 0; i < 2; ++i) visible[i] = (word >> ((frag_row + 8 * i) % 32)) & 1u;
    } else {
      const int n0 = seg.kv_key0 + r * kBlockN;
      if (!key_tile_needs_mask(w.shape, seg.kv, n0, kBlockN)) return;
      const KeySpan span = visible_keys(w.shape, seg.kv.pos_lo);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int key = n0 + frag_row + 8 * i;
        visible[i] = key >= span.lo && key < span.hi;
      }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          sacc[4 * j + 2 * i + c] = visible[i] ? sacc[4 * j + 2 * i + c] : neg_inf;
        }
      }
    }
  }

  // The tile's online softmax step per head (its max over the 64 keys through shared memory),
  // O^T rescaled, and P^T stored as the P V product's B operand.
  __device__ __forceinline__ void softmax_to_p() {
    float mx[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int j = k / 2, c = k % 2;
      float m = fmaxf(sacc[4 * j + c], sacc[4 * j + 2 + c]);
      m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, 4));
      m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, 8));
      mx[k] = fmaxf(m, __shfl_xor_sync(0xffffffff, m, 16));
    }
    // (The P^T barrier below orders every thread's reads before the next tile's writes.)
    float(&heads)[4][kHeads] = s.head_max[wg];
    if (lane < 4) {
#pragma unroll
      for (int k = 0; k < 4; ++k) heads[warp][head_of(k, col_lane)] = mx[k];
    }
    ptx::named_barrier_sync(kNarrowMaxReady + wg, 128);
    float factor[4];
    bool all_one = true;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int h = head_of(k, col_lane);
      const float m = fmaxf(fmaxf(heads[0][h], heads[1][h]), fmaxf(heads[2][h], heads[3][h]));
      const float m_new = raise_lazily(m_run[k], m * p.scale_log2, kLazyMaxSlack);
      const float base = softmax_base(m_new);
      factor[k] = ptx::exp2_approx(m_run[k] - base);
      m_run[k] = m_new;
      all_one = all_one && factor[k] == 1.f;
      const int j = k / 2, c = k % 2;
      const float p0 = ptx::exp2_approx(sacc[4 * j + c] * p.scale_log2 - base);
      const float p1 = ptx::exp2_approx(sacc[4 * j + 2 + c] * p.scale_log2 - base);
      sacc[4 * j + c] = p0;
      sacc[4 * j + 2 + c] = p1;
      l_run[k] = l_run[k] * factor[k] + (p0 + p1);
    }
    if (!__all_sync(0xffffffff, all_one)) {
#pragma unroll
      for (int cb = 0; cb < kCols; ++cb) {
#pragma unroll
        for (int e = 0; e < 8; ++e) o[cb][e] *= factor[2 * (e / 4) + e % 2];
      }
    }
    // P^T [head][key], K-major with the 128-byte swizzle: key k of head h at h * 128 +
    // ((k / 8) ^ (h % 8)) * 16 + (k % 8) * 2.
    uint8_t* pt = reinterpret_cast<uint8_t*>(&s.p[wg][0][0]);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int h = head_of(2 * (e / 4) + e % 2, col_lane), key = frag_row + 8 * ((e / 2) % 2);
      *reinterpret_cast<Element*>(pt + h * 128 + (((key / 8) ^ (h % 8)) << 4) + (key % 8) * 2) =
          ptx::from_float<Element>(sacc[e]);
    }
    ptx::fence_proxy_async_smem();  // the wgmma reads them
    ptx::named_barrier_sync(kNarrowPReady + wg, 128);
    DSV4_TRACE_STAMP(wg, kTraceNarrowPReady, tid == 0);
  }

  // O^T += V^T P^T, V^T the tile read MN-major (dims contiguous); each half of the dims is one
  // group, released (kv_empty[set][half]) as soon as it has landed. keep_second_half: the
  // second half is left to the merging consumer (finish_tile), which reads this consumer's
  // partial O^T there.
  __device__ __forceinline__ void pv(int st, int set, bool keep_second_half) {
    const uint64_t v_desc =
        ptx::smem_desc_sw128(ptx::smem_addr(&s.kv[st][0][0][0]), kBlockN * 128, 1024);
    const uint64_t p_desc = ptx::smem_desc_sw128(ptx::smem_addr(&s.p[wg][0][0]), 0, 1024);
    ptx::wgmma_fence();
#pragma unroll
    for (int half = 0; half < 2; ++half) {
#pragma unroll
      for (int cb = T::kHalfBlocks * half; cb < T::kHalfBlocks * (half + 1); ++cb) {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          ptx::WgmmaSS<kHeads, Element, 0, 1>::run(
              o[cb], ptx::smem_desc_advance(v_desc, cb * kBlockN * 128 + kk * 16 * 128),
              ptx::smem_desc_advance(p_desc, kk * 32), 1);
        }
      }
      ptx::wgmma_commit();
    }
    ptx::wgmma_wait<1>();
#pragma unroll
    for (int cb = 0; cb < T::kHalfBlocks; ++cb) {
#pragma unroll
      for (int e = 0; e < 8; ++e) ptx::fence_operand(o[cb][e]);
    }
    ptx::mbarrier_arrive(ptx::smem_addr(&s.kv_empty[set][0]));
    ptx::wgmma_wait<0>();
#pragma unroll
    for (int cb = T::kHalfBlocks; cb < kCols; ++cb) {
#pragma unroll
      for (int e = 0; e < 8; ++e) ptx::fence_operand(o[cb][e]);
    }
    if (!keep_second_half) ptx::mbarrier_arrive(ptx::smem_addr(&s.kv_empty[set][1]));
    DSV4_TRACE_STAMP(wg, kTraceNarrowPvDone, tid == 0);
  }

  // The consumer that merges a work tile of n key tiles: the one that takes its last tile (the
  // other finishes first), consumer 0 when there are none.
  __device__ __forceinline__ static int merger(const Mqa512Ring& ring, int n) {
    return n == 0 ? 0 : ring.tile(n - 1) & 1;
  }

  // The second half of the stage of the other consumer's last tile (n >= 2): its partial O^T,
  // 16 float4 a thread, thread tid's i-th at [i][tid] (both consumers' fragments are alike).
  __device__ __forceinline__ float4* partial_of(const Mqa512Ring& ring, int n) const {
    const int stage = Mqa512Ring::stage(ring.tile(n - 2));
    return reinterpret_cast<float4*>(&s.kv[stage][T::kHalfBlocks][0][0]);
  }

  // This consumer's tiles of a work tile of n > 0 key tiles.
  __device__ __forceinline__ void run_keys(const Mqa512Progress& progress, const Mqa512Ring& ring,
                                           int n) {
    const int first = ring.first_of(wg);
    if (first >= n) {  // a one-tile work tile: nothing for this consumer, and no read of Q
      ptx::mbarrier_arrive(ptx::smem_addr(&s.q_empty));
      return;
    }
    ptx::mbarrier_wait(ptx::smem_addr(&s.q_full), progress.q());
    const bool merges = merger(ring, n) == wg;
#pragma unroll 1
    for (int r = first; r < n; r += 2) {
      const int g = ring.tile(r), st = Mqa512Ring::stage(g), set = Mqa512Ring::set(g);
      qk(st, set, Mqa512Ring::full_parity(g));
      if (r + 2 >= n) ptx::mbarrier_arrive(ptx::smem_addr(&s.q_empty));  // its last read of Q
      mask_tile(r, st);
      softmax_to_p();
      pv(st, set, !merges && r + 2 >= n);
    }
  }

  // The end of a work tile of n key tiles, before the ring moves past it. The consumer that
  // does not merge hands its max, sums and partial O^T over (n >= 2) and goes on to the next
  // work tile; the merging one adds them to its own, normalizes (with the sink) and stores the
  // token's rows and lse. The two never wait for each other here, so they stay out of step,
  // as their key tiles want. Each combination rounds both products and then their sum, so the
  // result does not depend on which consumer took which tiles.
  __device__ __forceinline__ void finish_tile(const Mqa512Progress& progress,
                                              const Mqa512Ring& ring, int n) {
    constexpr float kLog2e = 1.4426950408889634f;
    DSV4_TRACE_STAMP(wg, kTraceNarrowEnd, tid == 0);
    // Per head, this thread's partial sum over the warp's keys, then the warp's.
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      l_run[k] += __shfl_xor_sync(0xffffffff, l_run[k], 4);
      l_run[k] += __shfl_xor_sync(0xffffffff, l_run[k], 8);
      l_run[k] += __shfl_xor_sync(0xffffffff, l_run[k], 16);
    }
    const bool merges = merger(ring, n) == wg;
    const int handoff = handoffs & 1;
    if (!merges) {
      if (n < 2) return;  // no keys taken
      float(&stats)[5][kHeads] = s.partner_stats[handoff];
      if (lane < 4) {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int h = head_of(k, col_lane);
          stats[1 + warp][h] = l_run[k];
          if (warp == 0) stats[0][h] = m_run[k];
        }
      }
      float4* partial = partial_of(ring, n);
#pragma unroll
      for (int cb = 0; cb < kCols; ++cb) {
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          partial[(2 * cb + q) * 128 + tid] =
              make_float4(o[cb][4 * q], o[cb][4 * q + 1], o[cb][4 * q + 2], o[cb][4 * q + 3]);
        }
      }
      ptx::mbarrier_arrive(ptx::smem_addr(&s.partial_ready[handoff]));
      ++handoffs;
      return;
    }
    // The merging consumer: its own sums over its four warps.
    float(&own)[4][kHeads] = s.own_sums[wg][own_sums_parity];
    if (lane < 4) {
#pragma unroll
      for (int k = 0; k < 4; ++k) own[warp][head_of(k, col_lane)] = l_run[k];
    }
    ptx::named_barrier_sync(kNarrowSumsReady + wg, 128);
    own_sums_parity ^= 1;
    const float(&other)[5][kHeads] = s.partner_stats[handoff];
    if (n >= 2) {
      ptx::mbarrier_wait(ptx::smem_addr(&s.partial_ready[handoff]), (handoffs >> 1) & 1);
      DSV4_TRACE_STAMP(wg, kTraceNarrowPartialIn, tid == 0);
    }
    const bool has_sink = mqa512_sinks_with_q(p);
    float scale_own[4], scale_other[4], inv[4], lse[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int h = head_of(k, col_lane);
      // [0]: this consumer, [1]: the other (max -inf and sum 0 when it took no keys).
      float m_of[2], l_of[2], f[2];
      m_of[0] = m_run[k];
      l_of[0] = (own[0][h] + own[1][h]) + (own[2][h] + own[3][h]);
      m_of[1] = n >= 2 ? other[0][h] : __int_as_float(0xff800000);
      l_of[1] = n >= 2 ? (other[1][h] + other[2][h]) + (other[3][h] + other[4][h]) : 0.f;
      const float m = fmaxf(m_of[0], m_of[1]), base = softmax_base(m);
#pragma unroll
      for (int c = 0; c < 2; ++c) f[c] = ptx::exp2_approx(m_of[c] - base);
      const float l = __fadd_rn(__fmul_rn(l_of[0], f[0]), __fmul_rn(l_of[1], f[1]));
      scale_own[k] = f[0];
      scale_other[k] = f[1];
      // The sink came with this work tile's Q (its parity: before finish_keys); with no keys, no Q.
      const float* sink_src = n > 0 ? &s.sink[progress.q()][h] : p.sinks + w.head0 + h;
      const float sink = has_sink && h < p.tile_heads ? *sink_src : 0.f;
      finish_row_sum(l, m, has_sink, sink * kLog2e, inv[k], lse[k]);
    }
    const bool valid = w.tok0 < w.shape.seqlen_q;
    const size_t out_token = static_cast<size_t>(w.batch) * p.seqlen_q + w.q_start + w.tok0;
    if (valid && frag_row == 0) {  // lanes 0-3 of warp 0 hold all 16 heads
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int h = head_of(k, col_lane);
        if (h < p.tile_heads) {
          p.lse[(static_cast<size_t>(w.batch) * p.heads_q + w.head0 + h) * p.seqlen_q + w.q_start +
                w.tok0] = lse[k];
        }
      }
    }
    Element* out = static_cast<Element*>(p.out) + (out_token * p.heads_q + w.head0) * T::kHeadDim;
    // O^T's element e holds head k = 2 (e / 4) + e % 2.
    if (n < 2) {  // alone: no stage half to stage the rows in
#pragma unroll
      for (int cb = 0; cb < kCols; ++cb) {
        float fin[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const int k = 2 * (e / 4) + e % 2;
          fin[e] = __fadd_rn(__fmul_rn(o[cb][e], scale_own[k]), 0.f) * inv[k];
        }
        store_block(out, cb, fin, valid);
      }
      DSV4_TRACE_STAMP(wg, kTraceNarrowStored, tid == 0);
      return;
    }
    float4* partial = partial_of(ring, n);
#pragma unroll
    for (int cb = 0; cb < kCols; ++cb) {
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const float4 v = partial[(2 * cb + q) * 128 + tid];
        const float in[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int e = 4 * q + i, k = 2 * (e / 4) + e % 2;
          o[cb][e] = __fadd_rn(__fmul_rn(o[cb][e], scale_own[k]), __fmul_rn(in[i], scale_other[k]));
        }
      }
    }
    // The rows are staged where the partial was (every thread has read its part), then stored
    // 16 bytes a lane: 512 contiguous bytes a warp instead of eight heads' 16 each.
    ptx::named_barrier_sync(kNarrowSumsReady + wg, 128);
    uint8_t* staged = reinterpret_cast<uint8_t*>(partial);
#pragma unroll
    for (int cb = 0; cb < kCols; ++cb) {
      float fin[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) fin[e] = o[cb][e] * inv[2 * (e / 4) + e % 2];
      stage_block(staged, cb, fin);
    }
    ptx::named_barrier_sync(kNarrowSumsReady + wg, 128);
    constexpr int kChunks = T::kHeadDim * int(sizeof(Element)) / 16;  // per head row
#pragma unroll
    for (int k = 0; k < kHeads * kChunks / 128; ++k) {
      const int idx = k * 128 + tid, head = idx / kChunks, chunk = idx % kChunks;
      if (valid && head < p.tile_heads) {
        *reinterpret_cast<uint4*>(out + head * T::kHeadDim + chunk * 8) =
            *reinterpret_cast<const uint4*>(staged + head * kStagedRowBytes + chunk * 16);
      }
    }
    // Done with the other's stage half: the producer may refill it (by TMA or cp.async).
    ptx::fence_proxy_async_smem();
    ptx::mbarrier_arrive(ptx::smem_addr(&s.kv_empty[Mqa512Ring::set(ring.tile(n - 2))][1]));
    ++handoffs;
    DSV4_TRACE_STAMP(wg, kTraceNarrowStored, tid == 0);
  }

  // Staged rows: [head][512 dims], 16 bytes of pad a row so that a warp's eight heads of one
  // store fall in different banks.
  static constexpr int kStagedRowBytes = T::kHeadDim * int(sizeof(Element)) + 16;
  static_assert(kHeads * kStagedRowBytes <= T::kHalfBlocks * kBlockN * 64 * int(sizeof(Element)),
                "the staged rows fit in a stage half");

  // Block cb of the normalized O^T into the staged rows, two adjacent dims of one head a lane
  // (as store_block pairs them).
  __device__ __forceinline__ void stage_block(uint8_t* staged, int cb,
                                              const float (&fin)[8]) const {
    const bool upper = (lane & 4) != 0;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const float v0 = fin[4 * j + 2 * i], v1 = fin[4 * j + 2 * i + 1];
        const float got = __shfl_xor_sync(0xffffffff, upper ? v0 : v1, 4);
        const int head = 8 * j + col_lane + (upper ? 1 : 0);
        const int dim = 64 * cb + frag_row + 8 * i - (upper ? 1 : 0);
        *reinterpret_cast<uint32_t*>(staged + head * kStagedRowBytes + dim * int(sizeof(Element))) =
            upper ? ptx::pack2<Element>(got, v1) : ptx::pack2<Element>(v0, got);
      }
    }
  }

  // Block cb of the normalized O^T to out (the token's heads, 512 dims each): lanes 4 apart
  // hold dims d and d + 1 of the same heads, so each trades one value with the other and
  // stores two adjacent dims of one head (the lower lane head h, the upper h + 1).
  __device__ __forceinline__ void store_block(Element* out, int cb, const float (&fin)[8],
                                              bool valid) const {
    const bool upper = (lane & 4) != 0;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const float v0 = fin[4 * j + 2 * i], v1 = fin[4 * j + 2 * i + 1];
        const float got = __shfl_xor_sync(0xffffffff, upper ? v0 : v1, 4);
        const int head = 8 * j + col_lane + (upper ? 1 : 0);
        const int dim = 64 * cb + frag_row + 8 * i - (upper ? 1 : 0);
        if (valid && head < p.tile_heads) {
          *reinterpret_cast<uint32_t*>(out + head * T::kHeadDim + dim) =
              upper ? ptx::pack2<Element>(got, v1) : ptx::pack2<Element>(v0, got);
        }
      }
    }
  }
};

}  // namespace dsv4
