// The producer warpgroup of the head_dim-512 kernel (traits.h has the protocol): it decodes each
// work tile once for everyone, loads Q (and the rows' sinks), and fills the two key stages by
// TMA or, for CSA's listed rows, by a cp.async gather.
#pragma once

#include <cstdint>

#include "ptx/cp_async.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/tma.cuh"
#include "sm90/mqa512/traits.h"
#include "sm90/mqa512/work.cuh"
#include "sm90/shared/trace.cuh"

namespace dsv4 {

// Warps 2s and 2s + 1 fill stage s, each its alternate 64-column blocks (warp 0 also loads Q):
// each stage is refilled as soon as its own consumers release it, never behind the other
// stage's wait, and two warps issue its boxes.
template <typename Element>
struct Mqa512Producer {
  using T = Mqa512Sm90Traits<Element>;
  static constexpr int kBlockN = T::kBlockN, kHalf = T::kHalfBlocks;

  typename T::SharedStorage& s;
  const Mqa512Sm90Params& p;
  const int stage = threadIdx.x / 64, sub = (threadIdx.x / 32) % 2;
  const int lane = threadIdx.x % 32;

  __device__ __forceinline__ uint32_t kv_full(int st, int cb) const {
    return ptx::smem_addr(&s.kv_full[st][cb]);
  }

  __device__ __forceinline__ void prefetch_descriptors(const CUtensorMap& tmap_q,
                                                       const CUtensorMap& tmap_kv,
                                                       const CUtensorMap& tmap_c) const {
    if (threadIdx.x == 0) {
      ptx::tma_prefetch_descriptor(&tmap_q);
      ptx::tma_prefetch_descriptor(&tmap_kv);
      if (p.compress_ratio > 0 && p.topk == nullptr) ptx::tma_prefetch_descriptor(&tmap_c);
    }
  }

  // Thread 0 publishes the work tile to the ring: the consumers decode nothing.
  __device__ __forceinline__ void publish_tile(const Mqa512Progress& progress,
                                               const Mqa512WorkTile& w,
                                               const Mqa512KeySegments& seg,
                                               const SplitRange& range, int n) const {
    if (threadIdx.x != 0) return;
    ptx::mbarrier_wait(ptx::smem_addr(&s.tile_empty[progress.slot()]), progress.slot_phase() ^ 1);
    Mqa512TileInfo& t = *reinterpret_cast<Mqa512TileInfo*>(&s.tile_ring[progress.slot()][0]);
    t.w = w;
    t.seg = seg;
    t.seg.kv_key0 += range.begin * kBlockN;  // index the split's tiles from 0 (mask_tile)
    t.seg.num_kv -= range.begin;
    t.n = n;
    ptx::mbarrier_arrive(ptx::smem_addr(&s.tile_full[progress.slot()]));
  }

  // Warp 0 fills the Q buffer: lane 0 its TMA boxes and, with sinks, every lane two rows'
  // sinks (each lane waits for the buffers' release itself).
  __device__ __forceinline__ void load_q(const CUtensorMap& tmap_q, const Mqa512Progress& progress,
                                         const Mqa512WorkTile& w) const {
    if (threadIdx.x >= 32) return;
    const uint32_t q_full = ptx::smem_addr(&s.q_full);
    const bool sinks_with_q = mqa512_sinks_with_q(p);
    if (threadIdx.x == 0 || sinks_with_q) {
      ptx::mbarrier_wait(ptx::smem_addr(&s.q_empty), progress.q() ^ 1);
      DSV4_TRACE_STAMP(2, kTraceQEmptyWait, lane == 0);
      if (threadIdx.x == 0) {
        ptx::mbarrier_arrive_expect_tx(q_full, T::kQBytes);
        for (int cb = 0; cb < T::kColBlocks; ++cb) {  // box (64 dims, tile_tokens, tile_heads)
          ptx::tma_load_4d(ptx::smem_addr(&s.q[cb][0][0]), &tmap_q, q_full, cb * 64,
                           w.q_start + w.tok0, w.head0, w.batch);
        }
        DSV4_TRACE_STAMP(2, kTraceQIssued, true);
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
  }

  // This warp's key tiles of the work tile: the tiles r = stage, stage + 2, ... of the split's n
  // (kv rows first, then compressed rows), each half of head_dim once its readers released it.
  __device__ __forceinline__ void load_key_tiles(const CUtensorMap& tmap_kv,
                                                 const CUtensorMap& tmap_c,
                                                 const Mqa512Progress& progress,
                                                 const Mqa512WorkTile& w,
                                                 const Mqa512KeySegments& seg,
                                                 const SplitRange& range, int n) const {
    // Per work tile: the row where each segment's boxes would start for r = 0 (tile
    // it = range.begin + r is the kv tile at key seg.kv_key0 + 64 it, or compressed tile
    // it - num_kv); for CSA the rows' base, token 0's list, and in lane j token j's closed rows
    // (a CSA work tile has at most 32 tokens).
    const int kv_row0 = w.k_start + seg.kv_key0 + range.begin * kBlockN;
    const int c_row0 = w.c_start + (range.begin - seg.num_kv) * kBlockN;
    const int kv_tiles = seg.num_kv - range.begin;  // tiles r < kv_tiles are kv rows
    const Element* rows = static_cast<const Element*>(p.compressed) +
                          w.batch * p.c_batch_stride + w.c_start * p.c_row_stride;
    const int list_row0 = w.batch * p.seqlen_q + w.q_start + w.tok0;
    const int closed_lane = p.topk != nullptr ? mqa512_closed_rows(p, w, seg.kv.pos_lo + lane) : 0;
#pragma unroll 1
    for (int r = stage; r < n; r += 2) {  // this stage's tiles
      const uint32_t phase = progress.stage(stage, r >> 1);
      const bool compressed = r >= kv_tiles;
      const bool gathered = compressed && p.topk != nullptr;
      // Lane l reads the list entries of slots l and l + 32 now, before the stage is free (the
      // gather broadcasts them), and the warp's ballots give the tile's visible slots.
      int listed_lo = -1, listed_hi = -1, token = 0;
      if (gathered) {
        // Compressed tile r - kv_tiles is a tile of token `token`'s list.
        const int c_tile = r - kv_tiles;
        token = c_tile / seg.c_per_token;
        const int slot0 = (c_tile - token * seg.c_per_token) * kBlockN + lane;
        const int* listed = p.topk + static_cast<int64_t>(list_row0 + token) * p.topk_k;
        const int closed = __shfl_sync(0xffffffff, closed_lane, token);
        listed_lo = mqa512_listed_row(listed, p.topk_k, closed, slot0);
        listed_hi = mqa512_listed_row(listed, p.topk_k, closed, slot0 + 32);
      }
      const uint32_t valid_lo = __ballot_sync(0xffffffff, listed_lo >= 0);
      const uint32_t valid_hi = __ballot_sync(0xffffffff, listed_hi >= 0);
      // Stage w's consumer multiplies its own half of head_dim first: load that half first.
#pragma unroll 1
      for (int k = 0; k < 2; ++k) {
        const int half = stage ^ k;
        ptx::mbarrier_wait(ptx::smem_addr(&s.kv_empty[stage][half]), phase ^ 1);
        DSV4_TRACE_STAMP(2 + threadIdx.x / 32, kTraceKvEmptyWait + stage * 2 + half, lane == 0);
        if (gathered) {
          // The slots' validity and token for the consumer's mask (written once the half its
          // reader releases last is free, published by this warp's kv_full arrivals).
          if (k == 0 && sub == 0 && lane == 0) {
            *reinterpret_cast<uint4*>(&s.csa_slots[stage][0]) =
                make_uint4(valid_lo, valid_hi, uint32_t(token), 0u);
          }
          gather_blocks(rows, half, listed_lo, listed_hi);
        } else if (lane == 0) {
          for (int cb = kHalf * half + sub; cb < kHalf * (half + 1); cb += 2) {
            const uint32_t dst = ptx::smem_addr(&s.kv[stage][cb][0][0]), full = kv_full(stage, cb);
            ptx::mbarrier_arrive_expect_tx(full, T::kBlockBytes);
            DSV4_TRACE_STAMP(2 + threadIdx.x / 32, kTraceKvIssued + stage * 2 + half, true);
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
  }

  // CSA: this warp's two 64-column blocks of half `half` of its stage, gathered from the listed
  // rows (lane l holds the rows of slots l and l + 32; -1: not visible, zero-filled). Lane
  // 8q + part copies 16-byte part `part` of rows q + 4i, the 16 steps unrolled.
  __device__ __forceinline__ void gather_blocks(const Element* rows, int half, int listed_lo,
                                                int listed_hi) const {
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
    // The blocks complete as the copies land, without waiting here, so the next half's copies
    // go out at once: every lane holds both blocks' phases open until its own copies have
    // landed, then lane 0 gives the one arrival each barrier counts. (The consumers fence the
    // proxies before their wgmmas read the tile.)
    ptx::cp_async_mbarrier_arrive(kv_full(stage, cb));
    ptx::cp_async_mbarrier_arrive(kv_full(stage, cb + 2));
    __syncwarp();  // every lane's copies are tracked before lane 0 arrives
    if (lane == 0) {
      ptx::mbarrier_arrive(kv_full(stage, cb));
      ptx::mbarrier_arrive(kv_full(stage, cb + 2));
    }
  }
};

}  // namespace dsv4
