// The two consumer warpgroups of the head_dim-512 kernel (traits.h has the protocol). Consumer
// wg multiplies Q by the key tiles of stage wg and owns O[:, 256 wg : 256 wg + 256]. Pairs of
// key tiles (2i in stage 0, 2i + 1 in stage 1) go through one softmax chain: consumer 0 folds its
// tile into the row max first (consumer0_pair), consumer 1 then its own (consumer1_pair), and
// each P is rescaled to the pair's max before the other consumer adds its P V.
#pragma once

#include <cstdint>
#include <type_traits>

#include "ptx/math.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/sync.cuh"
#include "ptx/wgmma.cuh"
#include "sm90/mqa512/paged_convert.cuh"
#include "sm90/mqa512/traits.h"
#include "sm90/mqa512/work.cuh"
#include "sm90/shared/online_softmax.cuh"
#include "sm90/shared/trace.cuh"

namespace dsv4 {

template <typename Element, Mqa512Keys kKeys>
struct Mqa512Consumer {
  using T = Mqa512Sm90Traits<Element>;
  static constexpr bool kPaged = mqa512_paged_keys(kKeys);
  static constexpr bool kConvertsPaged = kKeys == Mqa512Keys::kPagedStaged;
  static constexpr int kBlockN = T::kBlockN, kHalf = T::kHalfBlocks;
  using PTile = Element[T::kBlockM][kBlockN];

  typename T::SharedStorage& s;
  const Mqa512Sm90Params& p;
  const int wg;
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  // Accumulator fragment: this thread holds rows r and r + 8 (r = 16 warp + lane / 4) and in
  // each 8-column group j the columns 8j + 2 (lane % 4) + {0, 1}:
  //   acc[4j + 2i + c] = (row r + 8i, col 8j + 2 (lane % 4) + c).
  const int col_lane = 2 * (lane % 4);
  const int frag_row = warp * 16 + lane / 4;
  // This warp's copy of the current work tile and its key segments (rebased to the split).
  Mqa512TileInfo& info;
  const Mqa512WorkTile& w;
  const Mqa512KeySegments& seg;

  float o[128];     // this consumer's 256 columns of O
  float sacc[32];   // S, then P, of this consumer's current key tile
  uint32_t pfrag[kBlockN / 16][4];
  float m_run[2];   // reference max (log2 domain, lazily raised), shared by both consumers
  float l_run[2];   // this thread's partial sum of 2^(x - m_run) over this consumer's tiles

  __device__ __forceinline__ Mqa512Consumer(typename T::SharedStorage& storage,
                                            const Mqa512Sm90Params& params, int warpgroup)
      : s(storage),
        p(params),
        wg(warpgroup),
        info(*reinterpret_cast<Mqa512TileInfo*>(&storage.tile_info[warpgroup * 4 + warp][0])),
        w(info.w),
        seg(info.seg) {}

  __device__ __forceinline__ uint32_t kv_full(int stage, int cb) const {
    return ptx::smem_addr(&s.kv_full[stage][cb]);
  }
  __device__ __forceinline__ uint32_t kv_empty(int stage, int half) const {
    return ptx::smem_addr(&s.kv_empty[stage][half]);
  }
  __device__ __forceinline__ void wait_handoff(int handoff, uint32_t phase) const {
    ptx::mbarrier_wait(ptx::smem_addr(&s.handoff[handoff]), phase);
  }
  // A CSA tile's cp.async writes (generic proxy) complete on the barrier with no thread after
  // them, so its readers fence the proxies before their wgmmas; a paged tile's producer lanes
  // fence after their own writes, before the arrival.
  __device__ __forceinline__ bool fence_after_wait() const {
    return !kPaged && mqa512_gathers(p);
  }

  // This warp's copy of the work tile the producer published, 16 bytes per lane; each copying
  // lane releases the ring slot itself. Then O and the softmax state start over. Returns the
  // split's key tiles.
  __device__ __forceinline__ int take_tile(const Mqa512Progress& progress) {
    mqa512_copy_tile_info<T::kTileCopyLanes>(s, progress, wg * 4 + warp, lane);
    DSV4_TRACE_STAMP(wg, kTraceTileStart, tid == 0);
    const int n = info.n;
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
    m_run[0] = m_run[1] = __int_as_float(0xff800000);
    l_run[0] = l_run[1] = 0.f;
    return n;
  }

  // The QK^T and P V addressing below takes the consumer index as a template argument (kWg ==
  // wg): with the runtime index, consumer 1's wgmma descriptors were built in vector registers
  // and moved to uniform ones (R2UR) for every wgmma. Each descriptor is built once and
  // advanced by one add (smem_desc_advance).

  // Half kHalfIdx of S = Q K^T for consumer kWg's tile (issued, not waited on), each 64-column
  // block as soon as it has landed (fill parity `phase`); a paged block the consumers convert
  // is converted first, under the previous block's wgmmas, and once the other half (the other
  // consumer's P V reads it) is, thread 0 says so on paged_converted.
  template <int kWg, int kHalfIdx>
  __device__ __forceinline__ void issue_qk_half(bool overwrite, uint32_t phase) {
    const uint64_t q_desc =
        ptx::smem_desc_sw128(ptx::smem_addr(&s.q[kHalf * kHalfIdx][0][0]), 0, 1024);
    const uint64_t k_desc =
        ptx::smem_desc_sw128(ptx::smem_addr(&s.kv[kWg][kHalf * kHalfIdx][0][0]), 0, 1024);
#pragma unroll
    for (int cb = 0; cb < kHalf; ++cb) {
      ptx::mbarrier_wait(kv_full(kWg, kHalf * kHalfIdx + cb), phase);
      if (fence_after_wait()) ptx::fence_proxy_async_smem();
      if constexpr (kConvertsPaged) convert_paged_block<kWg>(kHalf * kHalfIdx + cb);
      ptx::wgmma_fence();  // after a spin-wait, or ptxas serializes every wgmma (C7520)
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {  // 16 elements = 32 bytes per k-step
        const uint64_t da = ptx::smem_desc_advance(q_desc, cb * T::kBlockM * 128 + kk * 32);
        const uint64_t db = ptx::smem_desc_advance(k_desc, cb * kBlockN * 128 + kk * 32);
        ptx::WgmmaSS<kBlockN, Element>::run(sacc, da, db, overwrite && (cb | kk) == 0 ? 0 : 1);
      }
    }
    if constexpr (kConvertsPaged && kHalfIdx != kWg) {
      if (tid == 0) ptx::mbarrier_arrive(ptx::smem_addr(&s.paged_converted[kWg]));
    }
  }

  // Paged, where the consumers convert (kPagedStaged): block cb of this consumer's stage, by the
  // warpgroup (paged_convert.cuh), its named barrier between the staged bytes' reads and the
  // rows stored on them, and again after every thread fenced its writes, before the wgmmas.
  // The bf16 tail (block 7) was copied in place: bf16 needs only the proxy fence.
  template <int kWg>
  __device__ __forceinline__ void convert_paged_block(int cb) {
    char* tile = reinterpret_cast<char*>(&s.kv[kWg][cb][0][0]);
    constexpr uint32_t kBar = kPagedBlockConverted + kWg;
    if (cb == kKvTiles) {
      mqa512_convert_tail_block<Element, 128>(tile, tid);
      ptx::fence_proxy_async_smem();  // the producer's copies (and these writes) to wgmma
      if constexpr (!std::is_same_v<Element, __nv_bfloat16>) ptx::named_barrier_sync(kBar, 128);
      return;
    }
    // Block cb was copied by the stage's producer warp cb % 2, with its scale rows.
    mqa512_convert_staged_block<Element, 128>(tile, s.paged_scale[kWg][cb % 2], cb, tid,
                                              [] { ptx::named_barrier_sync(kBar, 128); });
    ptx::fence_proxy_async_smem();  // these writes to the wgmmas (this and the other consumer's)
    ptx::named_barrier_sync(kBar, 128);
  }

  // O += P V for consumer kWg's 256 columns of the tile in stage kStage, the tile read MN-major
  // (head_dim contiguous): P from registers (this consumer's tile) or from shared memory (the
  // other consumer's, stored by it).
  template <int kWg, int kStage>
  __device__ __forceinline__ uint64_t v_desc() const {
    return ptx::smem_desc_sw128(ptx::smem_addr(&s.kv[kStage][kWg * kHalf][0][0]), kBlockN * 128,
                                1024);
  }
  template <int kWg>
  __device__ __forceinline__ void issue_pv_regs() {
    const uint64_t vd = v_desc<kWg, kWg>();
#pragma unroll
    for (int t = 0; t < kBlockN / 16; ++t) {
      ptx::WgmmaRS<256, Element, 1>::run(o, pfrag[t], ptx::smem_desc_advance(vd, t * 16 * 128), 1);
    }
  }
  // Before a P V over the other consumer's tile: its half `half` has landed (where the
  // consumers convert paged blocks: and that consumer has converted it).
  __device__ __forceinline__ void wait_half(int stage, int half, uint32_t phase) const {
    if constexpr (kConvertsPaged) {
      ptx::mbarrier_wait(ptx::smem_addr(&s.paged_converted[stage]), phase);
      ptx::fence_proxy_async_smem();
    } else {
#pragma unroll
      for (int cb = 0; cb < kHalf; ++cb) {
        ptx::mbarrier_wait(kv_full(stage, kHalf * half + cb), phase);
      }
      if (fence_after_wait()) ptx::fence_proxy_async_smem();
    }
  }
  template <int kWg, int kStage>
  __device__ __forceinline__ void issue_pv_smem(const PTile& pt) {
    const uint64_t pd = ptx::smem_desc_sw128(ptx::smem_addr(&pt[0][0]), 0, 1024);
    const uint64_t vd = v_desc<kWg, kStage>();
#pragma unroll
    for (int t = 0; t < kBlockN / 16; ++t) {
      ptx::WgmmaSS<256, Element, 1>::run(o, ptx::smem_desc_advance(pd, t * 32),
                                         ptx::smem_desc_advance(vd, t * 16 * 128), 1);
    }
  }
  // pfrag -> pt, the 128-byte-swizzled K-major layout of a wgmma A operand. Each warp writes
  // only its own 16 rows.
  __device__ __forceinline__ void store_p(PTile& pt) const {
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
  }
  // This consumer's row sums over the work tile, for the epilogue: published in the last pair,
  // so the other consumer's epilogue does not wait for this one to finish its last P V.
  __device__ __forceinline__ void publish_row_sums(const Mqa512Progress& progress) {
    float total[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) total[i] = quad_sum(l_run[i]);
    if (lane % 4 == 0) {
#pragma unroll
      for (int i = 0; i < 2; ++i) s.row_sum[progress.slot()][wg][frag_row + 8 * i] = total[i];
    }
    ptx::mbarrier_arrive(ptx::smem_addr(&s.handoff[kRowSums]));
  }
  // Writes one value per row to `dst` (one lane per quad), arrives on `handoff`, and reads the
  // values back: what uses them cannot be scheduled ahead of the arrive. (ptxas moved such an
  // arrive below the register-only work after it, and the other consumer waited through this
  // one's exps or O rescale.)
  __device__ __forceinline__ void publish(float (&dst)[T::kBlockM], float (&v)[2], int handoff) {
    if (lane % 4 == 0) {
      dst[frag_row] = v[0];
      dst[frag_row + 8] = v[1];
    }
    __syncwarp();
    ptx::mbarrier_arrive(ptx::smem_addr(&s.handoff[handoff]));
    v[0] = dst[frag_row];
    v[1] = dst[frag_row + 8];
  }
  // The rows' new reference max: the exponent base for this tile's scores, and the factor
  // what was accumulated against the old one must be multiplied by.
  __device__ __forceinline__ void adopt_max(const float (&m_new)[2], float (&base)[2],
                                            float (&factor)[2]) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      base[i] = softmax_base(m_new[i]);
      factor[i] = ptx::exp2_approx(m_run[i] - base[i]);
      m_run[i] = m_new[i];
    }
  }
  // Tile `it` of the split's key sequence (kv rows, then compressed rows; seg rebased to the
  // split's first tile): mask it (boundary tiles and CSA tiles only). Each row's visible keys
  // are one range, so the per-score test is a compare and a select (mask_outside).
  __device__ __forceinline__ void mask_tile(int it) {
    const float neg_inf = __int_as_float(0xff800000);
    const int num_kv = seg.num_kv;
    const bool compressed = it >= num_kv;
    if (compressed && mqa512_gathers(p)) {
      // CSA or paged: the slots the producer found visible in one token's list (csa_slots: the two
      // mask words, then the token), seen only by that token's rows (row = head *
      // tile_tokens + token). Own tile: stage wg.
      const uint4 slots = *reinterpret_cast<const uint4*>(&s.csa_slots[wg][0]);
      uint32_t valid[2][2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {  // tile_tokens is a power of two
        const bool own = ((frag_row + 8 * i) & (p.tile_tokens - 1)) == int(slots.z);
        valid[i][0] = own ? slots.x : 0u;
        valid[i][1] = own ? slots.y : 0u;
      }
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int bit = (8 * j + col_lane + c) % 32;
          sacc[4 * j + c] = (valid[0][j / 4] >> bit) & 1u ? sacc[4 * j + c] : neg_inf;
          sacc[4 * j + 2 + c] = (valid[1][j / 4] >> bit) & 1u ? sacc[4 * j + 2 + c] : neg_inf;
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
      const int pos = kv.pos_lo + ((frag_row + 8 * i) & (p.tile_tokens - 1));
      const KeySpan span = compressed ? KeySpan{0, mqa512_closed_rows(p, w, pos)}
                                      : visible_keys(shape, pos);
      lo[i] = span.lo - n0 - col_lane;
      hi[i] = span.hi - n0 - col_lane;
    }
    mask_outside<kBlockN>(sacc, lo, hi);
  }

  // Q K^T of this consumer's tile r = 2 i + wg (the i-th use of its stage in this work tile) out
  // of the split's n. It multiplies its own half of head_dim first (released by its own P V); in
  // between, `between` runs (consumer 0 releases the other stage there).
  template <int kWg, typename Between>
  __device__ __forceinline__ void qk_own(const Mqa512Progress& progress, int r, int n,
                                         Between&& between) {
    const uint32_t phase = progress.stage(kWg, r >> 1);
    issue_qk_half<kWg, kWg>(true, phase);
    ptx::wgmma_commit();
    DSV4_TRACE_STAMP(wg, kTraceQkFirstHalf, tid == 0);
    between();
    DSV4_TRACE_STAMP(wg, kTraceQkBetween, tid == 0);
    issue_qk_half<kWg, 1 - kWg>(false, phase);
    ptx::wgmma_commit();
    DSV4_TRACE_STAMP(wg, kTraceQkSecondHalf, tid == 0);
    ptx::wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 32; ++i) ptx::fence_operand(sacc[i]);
    DSV4_TRACE_STAMP(wg, kTraceQkDone, tid == 0);
    ptx::mbarrier_arrive(kv_empty(kWg, 1 - kWg));  // the other half's other reader: the other consumer's P V
    if (r + 2 >= n) ptx::mbarrier_arrive(ptx::smem_addr(&s.q_empty));  // last read of Q in this work tile
  }

  // The key tiles of a work tile (n > 0): the first Q K^T, then pair after pair.
  __device__ __forceinline__ void run_keys(const Mqa512Progress& progress, int n) {
    ptx::mbarrier_wait(ptx::smem_addr(&s.q_full), progress.q());
    DSV4_TRACE_STAMP(wg, kTraceQFull, tid == 0);
    if (wg == 0) {
      qk_own<0>(progress, 0, n, [] {});  // n > 0
    } else if (n > 1) {
      qk_own<1>(progress, 1, n, [] {});
    } else {
      ptx::mbarrier_arrive(ptx::smem_addr(&s.q_empty));  // consumer 1 of a one-tile work tile reads no Q
    }
    for (int pair = 0; 2 * pair < n; ++pair) {
      if (wg == 0) {
        consumer0_pair(progress, pair, n);
      } else {
        consumer1_pair(progress, pair, n);
      }
    }
  }

  // Consumer 0's step of pair `pair`: its S is in sacc.
  __device__ __forceinline__ void consumer0_pair(const Mqa512Progress& progress, int pair, int n) {
    const bool has_odd = 2 * pair + 1 < n;  // consumer 1 has a tile in this pair
    const uint32_t phase0 = progress.stage(0, pair), phase1 = progress.stage(1, pair);
    float base[2], factor[2], sum[2];
    // 1. Fold S into the running max, publish it, exponentiate.
    DSV4_TRACE_STAMP(0, kTrace0Exp, tid == 0);
    float mx[2];
    mask_tile(2 * pair);
    row_max_scores<kBlockN>(sacc, mx);
    float m_new[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) m_new[i] = raise_lazily(m_run[i], mx[i] * p.scale_log2, kLazyMaxSlack);
    publish(s.row_max[0], m_new, kMax0Ready);
    DSV4_TRACE_STAMP(0, kTrace0MaxPublished, tid == 0);
    adopt_max(m_new, base, factor);
    exp2_scores<kBlockN>(sacc, p.scale_log2, base, sum);
#pragma unroll
    for (int i = 0; i < 2; ++i) l_run[i] = l_run[i] * factor[i] + sum[i];
    // O is zero until the first P V: the first pair's factor (0, from the -inf start) would
    // defeat the all-ones test for nothing.
    if (pair > 0) rescale_rows_unless_one<256>(o, factor);
    // 2. O += P V for the own tile, with P through shared memory: keeping the fp32 P (rescaled
    //    below) and its A fragment in registers during this wgmma spilled.
    scores_to_a_fragment<Element, kBlockN>(sacc, pfrag);
    store_p(s.p_own0);
    ptx::fence_proxy_async_smem();
    ptx::named_barrier_sync(kPOwn0Ready, 128);
    DSV4_TRACE_STAMP(0, kTrace0POwnStored, tid == 0);
    ptx::wgmma_fence();
    issue_pv_smem<0, 0>(s.p_own0);
    ptx::wgmma_commit();
    // 3. While that P V runs: the pair's max from consumer 1, P rescaled to it and handed over
    //    (consumer 1's P V with it is the longest chain of the pair), then O rescaled once the
    //    P V has landed. Its stage's half 0 is free once the P V lands: gathered keys free it
    //    before the handover, so their slower refill starts earlier; TMA boxes after it, so the
    //    handover overlaps the P V.
    const auto release_own_half = [&] {
      ptx::wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < 128; ++i) ptx::fence_operand(o[i]);
      ptx::mbarrier_arrive(kv_empty(0, 0));
      DSV4_TRACE_STAMP(0, kTrace0KvReleased, tid == 0);
    };
    wait_handoff(kMax1Ready, phase0);
    DSV4_TRACE_STAMP(0, kTrace0PairMax, tid == 0);
    if constexpr (kKeys == Mqa512Keys::kGathered) release_own_half();
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
    DSV4_TRACE_STAMP(0, kTrace0PPublished, tid == 0);
#pragma unroll
    for (int i = 0; i < 2; ++i) l_run[i] *= factor[i];
    if (2 * pair + 2 >= n) publish_row_sums(progress);
    if constexpr (kKeys != Mqa512Keys::kGathered) release_own_half();
    rescale_rows_unless_one<256>(o, factor);
    // 4. O += P V for consumer 1's tile, with its P from shared memory.
    if (has_odd) {
      wait_handoff(kP1Ready, phase1);
      DSV4_TRACE_STAMP(0, kTrace0P1Ready, tid == 0);
      wait_half(1, 0, phase1);
      ptx::wgmma_fence();
      issue_pv_smem<0, 1>(s.p[1]);
      ptx::wgmma_commit();
      DSV4_TRACE_STAMP(0, kTrace0PvOtherIssued, tid == 0);
    }
    // Consumer 1's tile, half 0: the P V above was its last reader. The waits stay
    // unconditional (with fewer groups in flight they return at once): a wait that ptxas sees
    // only on some paths makes it serialize every wgmma.
    auto release_odd = [&] {
      ptx::wgmma_wait<1>();
      if (has_odd) ptx::mbarrier_arrive(kv_empty(1, 0));
    };
    // 5. S of the next own tile; the P V above finishes behind its first half.
    if (2 * pair + 2 < n) {
      qk_own<0>(progress, 2 * pair + 2, n, release_odd);
    } else {
      ptx::wgmma_wait<0>();
      if (has_odd) ptx::mbarrier_arrive(kv_empty(1, 0));
    }
#pragma unroll
    for (int i = 0; i < 128; ++i) ptx::fence_operand(o[i]);
  }

  // Consumer 1's step of pair `pair`: its S (if it has a tile in the pair) is in sacc.
  __device__ __forceinline__ void consumer1_pair(const Mqa512Progress& progress, int pair, int n) {
    const bool has_odd = 2 * pair + 1 < n;  // this consumer has a tile in this pair
    const uint32_t phase0 = progress.stage(0, pair);
    float base[2], factor[2], sum[2];
    // 1. Mask and take the row max of the own tile (none: -inf) while consumer 0 works, then
    //    fold in consumer 0's max: that is the pair's max.
    float mx[2] = {__int_as_float(0xff800000), __int_as_float(0xff800000)};
    DSV4_TRACE_STAMP(1, kTrace1Start, tid == 0);
    if (has_odd) {
      mask_tile(2 * pair + 1);
      row_max_scores<kBlockN>(sacc, mx);
    }
    wait_handoff(kMax0Ready, phase0);
    DSV4_TRACE_STAMP(1, kTrace1Max0Ready, tid == 0);
    float m_new[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      m_new[i] = raise_lazily(s.row_max[0][frag_row + 8 * i], mx[i] * p.scale_log2, kLazyMaxSlack);
    }
    publish(s.row_max[1], m_new, kMax1Ready);
    DSV4_TRACE_STAMP(1, kTrace1MaxPublished, tid == 0);
    adopt_max(m_new, base, factor);
    if (pair > 0) rescale_rows_unless_one<256>(o, factor);  // O is zero until the first P V
    sum[0] = sum[1] = 0.f;
    // 2. Exponentiate, hand P over, O += P V for the own tile.
    if (has_odd) {
      exp2_scores<kBlockN>(sacc, p.scale_log2, base, sum);
      scores_to_a_fragment<Element, kBlockN>(sacc, pfrag);
      store_p(s.p[1]);
      ptx::fence_proxy_async_smem();
      ptx::mbarrier_arrive(ptx::smem_addr(&s.handoff[kP1Ready]));
      DSV4_TRACE_STAMP(1, kTrace1PPublished, tid == 0);
      ptx::wgmma_fence();
      issue_pv_regs<1>();
      ptx::wgmma_commit();
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) l_run[i] = l_run[i] * factor[i] + sum[i];
    if (2 * pair + 2 >= n) publish_row_sums(progress);
    // 3. O += P V for consumer 0's tile, with its P from shared memory.
    wait_handoff(kP0Ready, phase0);
    DSV4_TRACE_STAMP(1, kTrace1P0Ready, tid == 0);
    wait_half(0, 1, phase0);
    ptx::wgmma_fence();
    issue_pv_smem<1, 0>(s.p[0]);
    ptx::wgmma_commit();
    DSV4_TRACE_STAMP(1, kTrace1PvOtherIssued, tid == 0);
    ptx::wgmma_wait<1>();  // the own P V, if any (unconditional: see consumer0_pair)
    if (has_odd) ptx::mbarrier_arrive(kv_empty(1, 1));
    DSV4_TRACE_STAMP(1, kTrace1OwnPvDone, tid == 0);
    ptx::wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 128; ++i) ptx::fence_operand(o[i]);
    ptx::mbarrier_arrive(kv_empty(0, 1));
    DSV4_TRACE_STAMP(1, kTrace1KvReleased, tid == 0);
    // 4. S of the next own tile.
    if (2 * pair + 3 < n) qk_own<1>(progress, 2 * pair + 3, n, [] {});
  }
};

}  // namespace dsv4
