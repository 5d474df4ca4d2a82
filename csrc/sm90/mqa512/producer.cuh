// The producer warpgroup of the head_dim-512 kernel (traits.h has the protocol): it decodes each
// work tile once for everyone, loads Q (and the rows' sinks), and fills the two key stages by
// TMA, for CSA's listed rows by a cp.async gather, or for a paged call's rows by a cp.async gather
// of the FP8 records' bytes, converted in place by the producer or the stage's consumer.
#pragma once

#include <cstdint>
#include <type_traits>

#include "ptx/cp_async.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/sync.cuh"
#include "ptx/tma.cuh"
#include "sm90/kv_cache/format.h"
#include "sm90/mqa512/paged_convert.cuh"
#include "sm90/mqa512/traits.h"
#include "sm90/mqa512/work.cuh"
#include "sm90/shared/trace.cuh"

namespace dsv4 {

// Where one key tile goes: its stage, the barrier set whose kv_full its 64-column blocks
// complete, the set whose kv_empty halves it waits for first with that parity, and the half it
// loads first.
struct Mqa512KeySlot {
  int stage, full_set, empty_set;
  uint32_t empty_parity;
  int first_half;
};

// Per work tile: the row where each segment's boxes would start for r = 0 (tile
// it = range.begin + r is the kv tile at key seg.kv_key0 + 64 it, or compressed tile
// it - num_kv), tiles r < kv_tiles being kv rows; for CSA the rows' base, token 0's list, and in
// lane j token j's closed rows (a CSA work tile has at most 32 tokens).
template <typename Element>
struct Mqa512KeyRows {
  int kv_row0, c_row0, kv_tiles, list_row0, closed_lane;
  const Element* rows;
};

// Warps 2s and 2s + 1 fill stage s, each its alternate 64-column blocks (warp 0 also loads Q):
// each stage is refilled as soon as its own consumers release it, never behind the other
// stage's wait, and two warps issue its boxes. The narrow form (Traits = Mqa512NarrowTraits)
// shares the per-tile body: there warps 2c and 2c + 1 fill the ring's tiles of consumer c.
template <typename Element, typename Traits = Mqa512Sm90Traits<Element>>
struct Mqa512Producer {
  using T = Traits;
  static constexpr int kBlockN = T::kBlockN, kHalf = T::kHalfBlocks;
  // Paged: where a 64-column block stages its fp8 bytes (its upper half: 64 rows x 64 bytes).
  static constexpr uint32_t kPagedStagingOffset = T::kBlockBytes / 2;
  static_assert(kPagedStagingOffset == 64 * 64, "paged_convert.cuh reads row r at 4096 + 64 r");

  typename T::SharedStorage& s;
  const Mqa512Sm90Params& p;
  // stage: the seesaw kernel's stage this warp fills; the narrow form's consumer whose tiles.
  const int stage = threadIdx.x / 64, sub = (threadIdx.x / 32) % 2;
  const int lane = threadIdx.x % 32;

  __device__ __forceinline__ uint32_t kv_full(int st, int cb) const {
    return ptx::smem_addr(&s.kv_full[st][cb]);
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
        // The tile's rows: 64, or fewer (the narrow form, a padded paged decode tile); the
        // rows past them stay zero.
        ptx::mbarrier_arrive_expect_tx(
            q_full, uint32_t(p.tile_tokens * p.tile_heads) * (T::kHeadDim * sizeof(Element)));
        for (int cb = 0; cb < T::kColBlocks; ++cb) {  // box (64 dims, tile_tokens, tile_heads)
          ptx::tma_load_4d(ptx::smem_addr(&s.q[cb][0][0]), &tmap_q, q_full, cb * 64,
                           w.q_start + w.tok0, w.head0, w.batch);
        }
        DSV4_TRACE_STAMP(2, kTraceQIssued, true);
      }
      if (sinks_with_q) {
#pragma unroll
        for (int i = 0; i < (T::kBlockM + 31) / 32; ++i) {
          const int row = lane + 32 * i;  // padding rows take 0
          if (row < T::kBlockM) {
            ptx::cp_async_4_zfill(ptx::smem_addr(&s.sink[progress.q()][row]),
                                  p.sinks + w.head0 + row / p.tile_tokens,
                                  row < p.tile_tokens * p.tile_heads);
          }
        }
        ptx::cp_async_mbarrier_arrive_noinc(q_full);
      }
    }
  }

  __device__ __forceinline__ Mqa512KeyRows<Element> key_rows(const Mqa512WorkTile& w,
                                                            const Mqa512KeySegments& seg,
                                                            const SplitRange& range) const {
    Mqa512KeyRows<Element> k;
    k.kv_row0 = w.k_start + seg.kv_key0 + range.begin * kBlockN;
    k.c_row0 = w.c_start + (range.begin - seg.num_kv) * kBlockN;
    k.kv_tiles = seg.num_kv - range.begin;
    k.rows = static_cast<const Element*>(p.compressed) + w.batch * p.c_batch_stride +
             w.c_start * p.c_row_stride;
    k.list_row0 = w.batch * p.seqlen_q + w.q_start + w.tok0;
    k.closed_lane = p.topk != nullptr ? mqa512_closed_rows(p, w, seg.kv.pos_lo + lane) : 0;
    return k;
  }

  // This warp's key tiles of the work tile: the tiles r = stage, stage + 2, ... of the split's n
  // (kv rows first, then compressed rows).
  __device__ __forceinline__ void load_key_tiles(const CUtensorMap& tmap_kv,
                                                 const CUtensorMap& tmap_c,
                                                 const Mqa512Progress& progress,
                                                 const Mqa512WorkTile& w,
                                                 const Mqa512KeySegments& seg,
                                                 const SplitRange& range, int n) const {
    const Mqa512KeyRows<Element> k = key_rows(w, seg, range);
#pragma unroll 1
    for (int r = stage; r < n; r += 2) {  // this stage's tiles
      // Stage w's consumer multiplies its own half of head_dim first: load that half first.
      const Mqa512KeySlot slot{stage, stage, stage, progress.stage(stage, r >> 1) ^ 1, stage};
      load_key_tile(tmap_kv, tmap_c, w, seg, k, r, slot);
    }
  }

  // The narrow form's: the ring's tiles of this pair's consumer, half 0 first (its consumer
  // reads the column blocks in order).
  __device__ __forceinline__ void load_ring_tiles(const CUtensorMap& tmap_kv,
                                                  const CUtensorMap& tmap_c,
                                                  const Mqa512Ring& ring,
                                                  const Mqa512WorkTile& w,
                                                  const Mqa512KeySegments& seg,
                                                  const SplitRange& range, int n) const {
    const Mqa512KeyRows<Element> k = key_rows(w, seg, range);
#pragma unroll 1
    for (int r = ring.first_of(stage); r < n; r += 2) {
      const int g = ring.tile(r);
      const Mqa512KeySlot slot{Mqa512Ring::stage(g), Mqa512Ring::set(g),
                               Mqa512Ring::previous_set(g), Mqa512Ring::previous_release_parity(g),
                               0};
      load_key_tile(tmap_kv, tmap_c, w, seg, k, r, slot);
    }
  }

  // Key tile r of the split into `slot`, each half of head_dim once its readers released it.
  __device__ __forceinline__ void load_key_tile(const CUtensorMap& tmap_kv,
                                                const CUtensorMap& tmap_c,
                                                const Mqa512WorkTile& w,
                                                const Mqa512KeySegments& seg,
                                                const Mqa512KeyRows<Element>& k, int r,
                                                const Mqa512KeySlot& slot) const {
    const bool compressed = r >= k.kv_tiles;
    const bool gathered = compressed && p.topk != nullptr;
    // Lane l reads the list entries of slots l and l + 32 now, before the stage is free (the
    // gather broadcasts them), and the warp's ballots give the tile's visible slots.
    int listed_lo = -1, listed_hi = -1, token = 0;
    if (gathered) {
      // Compressed tile r - kv_tiles is a tile of token `token`'s list.
      const int c_tile = r - k.kv_tiles;
      token = p.tile_tokens == 1 ? 0 : c_tile / seg.c_per_token;  // 64+ heads: one token
      const int slot0 = (c_tile - token * seg.c_per_token) * kBlockN + lane;
      const int* listed = p.topk + static_cast<int64_t>(k.list_row0 + token) * p.topk_k;
      const int closed = __shfl_sync(0xffffffff, k.closed_lane, token);
      listed_lo = mqa512_listed_row(listed, p.topk_k, closed, slot0);
      listed_hi = mqa512_listed_row(listed, p.topk_k, closed, slot0 + 32);
    }
    const uint32_t valid_lo = __ballot_sync(0xffffffff, listed_lo >= 0);
    const uint32_t valid_hi = __ballot_sync(0xffffffff, listed_hi >= 0);
#pragma unroll 1
    for (int j = 0; j < 2; ++j) {
      const int half = slot.first_half ^ j;
      ptx::mbarrier_wait(ptx::smem_addr(&s.kv_empty[slot.empty_set][half]), slot.empty_parity);
      DSV4_TRACE_STAMP(2 + threadIdx.x / 32, kTraceKvEmptyWait + slot.stage * 2 + half, lane == 0);
      if (gathered) {
        // The slots' validity and token for the consumer's mask (written once the half its
        // reader releases last is free, published by this warp's kv_full arrivals).
        if (j == 0 && sub == 0 && lane == 0) {
          *reinterpret_cast<uint4*>(&s.csa_slots[slot.stage][0]) =
              make_uint4(valid_lo, valid_hi, uint32_t(token), 0u);
        }
        gather_blocks(k.rows, slot, half, listed_lo, listed_hi);
      } else if (lane == 0) {
        for (int cb = kHalf * half + sub; cb < kHalf * (half + 1); cb += 2) {
          const uint32_t dst = ptx::smem_addr(&s.kv[slot.stage][cb][0][0]);
          const uint32_t full = ptx::smem_addr(&s.kv_full[slot.full_set][cb]);
          ptx::mbarrier_arrive_expect_tx(full, T::kBlockBytes);
          DSV4_TRACE_STAMP(2 + threadIdx.x / 32, kTraceKvIssued + slot.stage * 2 + half, true);
          if (compressed) {
            ptx::tma_load_4d(dst, &tmap_c, full, cb * 64, k.c_row0 + r * kBlockN, 0, w.batch);
          } else {
            ptx::tma_load_4d(dst, &tmap_kv, full, cb * 64, k.kv_row0 + r * kBlockN, w.kv_head,
                             w.batch);
          }
        }
      }
      __syncwarp();  // converged before the next wait (see the Q load)
    }
  }

  // Paged: this warp's key tiles of the work tile (r = stage, stage + 2, ... of the split's n):
  // each token's window-list tiles, then its compressed-list tiles (csa_slots carries each
  // tile's visible slots and token, as for CSA). Its own loop, apart from load_key_tiles, so
  // that neither's registers weigh on the other. kStaged: the stage's consumer converts the
  // blocks (Mqa512Keys::kPagedStaged).
  template <bool kStaged>
  __device__ __forceinline__ void load_paged_tiles(const Mqa512Progress& progress,
                                                   const Mqa512WorkTile& w,
                                                   const Mqa512KeySegments& seg,
                                                   const SplitRange& range, int n) const {
    // No L2 prefetch of later tiles' records: it made every row slower (docs/mqa512.md).
#pragma unroll 1
    for (int r = stage; r < n; r += 2) {
      const uint32_t phase = progress.stage(stage, r >> 1);
      int listed_lo, listed_hi, token, list;
      paged_tile_slots(w, seg, range.begin + r, listed_lo, listed_hi, token, list);
      const uint32_t valid_lo = __ballot_sync(0xffffffff, listed_lo >= 0);
      const uint32_t valid_hi = __ballot_sync(0xffffffff, listed_hi >= 0);
      // The tile's scale rows, once for both halves: where this warp converts, at once (it has
      // converted the stage's last tile); where the consumer does, once the first half is
      // released (after that consumer converted the whole of the stage's last tile).
      if (!kStaged) issue_tile_scales(list, listed_lo, listed_hi);
#pragma unroll 1
      for (int k = 0; k < 2; ++k) {  // the consumer's own half first, as in load_key_tiles
        const int half = stage ^ k;
        ptx::mbarrier_wait(ptx::smem_addr(&s.kv_empty[stage][half]), phase ^ 1);
        DSV4_TRACE_STAMP(2 + threadIdx.x / 32, kTraceKvEmptyWait + stage * 2 + half, lane == 0);
        if (kStaged && k == 0) issue_tile_scales(list, listed_lo, listed_hi);
        if (k == 0 && sub == 0 && lane == 0) {
          *reinterpret_cast<uint4*>(&s.csa_slots[stage][0]) =
              make_uint4(valid_lo, valid_hi, uint32_t(token), 0u);
        }
        if (list == 0) {
          gather_paged_blocks<0, kStaged>(half, listed_lo, listed_hi);
        } else {
          gather_paged_blocks<1, kStaged>(half, listed_lo, listed_hi);
        }
        __syncwarp();
      }
    }
  }

  // Key tile c_tile of the work tile (no kv tiles: every tile is a listed one): its token, its
  // list, and lane l's slots l and l + 32 of it.
  __device__ __forceinline__ void paged_tile_slots(const Mqa512WorkTile& w,
                                                   const Mqa512KeySegments& seg, int c_tile,
                                                   int& lo, int& hi, int& token, int& list) const {
    token = p.tile_tokens == 1 ? 0 : c_tile / seg.c_per_token;  // 64+ heads: one token
    const int j = c_tile - token * seg.c_per_token;
    const int row = w.tok0 + token;  // a paged call is one batch: token t's lists are row t's
    list = j < p.page_list[0].tiles ? 0 : 1;
    if (list == 0) {
      paged_slots<0>(row, j * kBlockN + lane, lo, hi);
    } else {
      paged_slots<1>(row, (j - p.page_list[0].tiles) * kBlockN + lane, lo, hi);
    }
  }

  // Lane l's entries l and l + 32 of the 64 slots from `slot0 - lane` on in list kList of token
  // row `row` (-1 where not read).
  template <int kList>
  __device__ __forceinline__ void paged_slots(int row, int slot0, int& lo, int& hi) const {
    const Mqa512PagedList& l = p.page_list[kList];
    const int* listed = l.slots + static_cast<int64_t>(row) * l.len;
    const int length = l.lengths != nullptr ? l.lengths[row] : l.len;
    lo = mqa512_paged_slot(listed, l.len, l.capacity, length, slot0);
    hi = mqa512_paged_slot(listed, l.len, l.capacity, length, slot0 + 32);
  }

  // This warp's two 64-column blocks (cb0 = 4 half + sub, cb0 + 2) of half `half` of its stage,
  // from the FP8 records of list kList's listed slots (-1: zeros): the fp8 bytes staged in each
  // block's upper 4 KB, and the bf16 tail (block 7) straight to its place (the scale rows:
  // issue_tile_scales). Each lane finds the records of its own rows (lane, lane + 32) once; the
  // copy steps take each row's record address from its lane, and every copy is issued by
  // cp.async (no registers held: all of them in flight at once). Then, where the stage's
  // consumer converts the blocks (kStaged), they complete as the copies land, as
  // gather_blocks' do, and the warp goes on to the next half at once. Elsewhere each lane waits
  // for its own copies, the warp syncs and converts both blocks (paged_convert.cuh), each lane
  // fences the proxies after its writes, and after a warp sync lane 0 gives each block's one
  // arrival.
  template <int kList, bool kStaged>
  __device__ __forceinline__ void gather_paged_blocks(int half, int listed_lo, int listed_hi) const {
    const int cb0 = kHalf * half + sub;
    const PagedRows rows = paged_rows<kList>(listed_lo, listed_hi);
    if (cb0 + 2 == kKvTiles) {  // this warp's second block is the bf16 tail
      issue_paged_fp8<1>(cb0, rows);
      issue_paged_tail(cb0 + 2, rows);
    } else {
      issue_paged_fp8<2>(cb0, rows);
    }
    DSV4_TRACE_STAMP(2 + threadIdx.x / 32, kTraceKvIssued + stage * 2 + half, lane == 0);
    if constexpr (kStaged) {
      complete_on_landing(kv_full(stage, cb0));
      return;
    }
    ptx::cp_async_wait_all();
    __syncwarp();  // the rows are converted by other lanes than copied them
    DSV4_TRACE_STAMP(2 + threadIdx.x / 32, kTracePagedLanded + stage * 2 + half, lane == 0);
#pragma unroll 1
    for (int b = 0; b < 2; ++b) {
      const int cb = cb0 + 2 * b;
      char* tile = reinterpret_cast<char*>(&s.kv[stage][cb][0][0]);
      if (cb == kKvTiles) {
        mqa512_convert_tail_block<Element, 32>(tile, lane);
      } else {
        mqa512_convert_staged_block<Element, 32>(tile, s.paged_scale[stage][sub], cb, lane,
                                                 [] { __syncwarp(); });
      }
      ptx::fence_proxy_async_smem();  // this lane's writes (stores and waited copies) to wgmma
      __syncwarp();  // every lane's stores of the block before lane 0's arrival
      if (lane == 0) ptx::mbarrier_arrive(kv_full(stage, cb));
    }
    DSV4_TRACE_STAMP(2 + threadIdx.x / 32, kTracePagedConverted + stage * 2 + half, lane == 0);
  }

  // A lane's two rows of a paged tile (lane, lane + 32): their slots (-1: not listed), and the
  // addresses of their records' data rows (slot 0's where not listed, never read).
  struct PagedRows {
    int slot[2];
    const uint8_t* data[2];
  };
  template <int kList>
  __device__ __forceinline__ PagedRows paged_rows(int listed_lo, int listed_hi) const {
    const Mqa512PagedList& l = p.page_list[kList];
    PagedRows rows;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      rows.slot[i] = i == 0 ? listed_lo : listed_hi;
      const int safe = max(rows.slot[i], 0);
      const int r = safe & ((1 << l.page_shift) - 1);
      rows.data[i] = l.base + static_cast<int64_t>(safe >> l.page_shift) * l.block_stride +
                     r * kKvDataBytes;
    }
    return rows;
  }

  // Row 32 h + j's slot and record data address, from lane j, which holds them.
  __device__ __forceinline__ const uint8_t* paged_row(const PagedRows& rows, int h, int j,
                                                      int& slot) const {
    slot = __shfl_sync(0xffffffff, rows.slot[h], j);
    return reinterpret_cast<const uint8_t*>(
        __shfl_sync(0xffffffff, reinterpret_cast<unsigned long long>(rows.data[h]), j));
  }

  // Each of the tile's rows' scale row into paged_scale[stage][sub] (this warp's copy: its
  // blocks' barriers track it), lane l's rows l and l + 32: two copies with every lane active
  // (a scale word a half from the copy steps' part-0 lanes took eight copies of eight lanes).
  __device__ __forceinline__ void issue_tile_scales(int list, int listed_lo, int listed_hi) const {
    if (list == 0) {
      issue_paged_scales<0>(paged_rows<0>(listed_lo, listed_hi));
    } else {
      issue_paged_scales<1>(paged_rows<1>(listed_lo, listed_hi));
    }
  }
  template <int kList>
  __device__ __forceinline__ void issue_paged_scales(const PagedRows& rows) const {
    const Mqa512PagedList& l = p.page_list[kList];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int safe = max(rows.slot[h], 0);
      const uint8_t* block = l.base + static_cast<int64_t>(safe >> l.page_shift) * l.block_stride;
      ptx::cp_async_8_zfill(ptx::smem_addr(&s.paged_scale[stage][sub][lane + 32 * h][0]),
                            block + (kKvDataBytes << l.page_shift) +
                                (safe & ((1 << l.page_shift) - 1)) * kKvScaleBytes,
                            rows.slot[h] >= 0);
    }
  }

  // The fp8 bytes of kBlocks blocks cb0 (and cb0 + 2), row r at byte 4096 + 64 r of each block
  // (lane 4 q + part copies 16 bytes of rows q + 8 i), all from one record address a row.
  template <int kBlocks>
  __device__ __forceinline__ void issue_paged_fp8(int cb0, const PagedRows& rows) const {
    const int part = lane % 4, row_sub = lane / 4;
    const uint32_t staging = ptx::smem_addr(&s.kv[stage][cb0][0][0]) + kPagedStagingOffset;
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // rows 0-31 from rows.*[0], 32-63 from rows.*[1]
#pragma unroll 2  // (unrolled further, the producer spilled)
      for (int i = 4 * h; i < 4 * h + 4; ++i) {
        const int row = row_sub + 8 * i;
        int slot;
        const uint8_t* src = paged_row(rows, h, row % 32, slot) + cb0 * 64 + part * 16;
#pragma unroll
        for (int b = 0; b < kBlocks; ++b) {  // block cb0 + 2 b: 2 x 8 KB further in the stage
          ptx::cp_async_16_unless_negative(staging + 2 * b * T::kBlockBytes + row * 64 + part * 16,
                                           src + 2 * b * 64, slot);
        }
      }
    }
  }

  // Block 7 (dims 448-511, the record's bf16 part) straight to its swizzled place: lane
  // 8 q + part copies 16-byte chunk `part` of rows q + 4 i, as gather_blocks does.
  __device__ __forceinline__ void issue_paged_tail(int cb, const PagedRows& rows) const {
    const int part = lane % 8, row_sub = lane / 8;
    const uint32_t dst0 =
        ptx::smem_addr(&s.kv[stage][cb][0][0]) + row_sub * 128 + ((part ^ row_sub) << 4);
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // rows 0-31 from rows.*[0], 32-63 from rows.*[1]
#pragma unroll 2
      for (int i = 8 * h; i < 8 * h + 8; ++i) {
        int slot;
        const uint8_t* rec = paged_row(rows, h, (row_sub + 4 * i) % 32, slot);
        ptx::cp_async_16_unless_negative((dst0 ^ (i % 2 ? 64u : 0u)) + 4 * 128 * i,
                                         rec + kKvQuantDims + part * 16, slot);
      }
    }
  }

  // CSA: this warp's two 64-column blocks of half `half` of the slot's stage, gathered from the
  // listed rows (lane l holds the rows of slots l and l + 32; -1: not visible, zero-filled).
  // Lane 8q + part copies 16-byte part `part` of rows q + 4i, the 16 steps unrolled.
  __device__ __forceinline__ void gather_blocks(const Element* rows, const Mqa512KeySlot& slot,
                                                int half, int listed_lo, int listed_hi) const {
    const int cb = kHalf * half + sub, part = lane % 8, row_sub = lane / 8;
    const uint32_t tile = ptx::smem_addr(&s.kv[slot.stage][cb][0][0]) + row_sub * 128;
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
      ptx::cp_async_16_unless_negative(dst, src, src_row);
      ptx::cp_async_16_unless_negative(dst + 2 * kBlockN * 128, src + 2 * 64 * sizeof(Element),
                                       src_row);
    }
    // The blocks complete as the copies land, without waiting here, so the next half's copies
    // go out at once. (The consumers fence the proxies before their wgmmas read the tile.)
    complete_on_landing(ptx::smem_addr(&s.kv_full[slot.full_set][cb]));
  }

  // A warp's two blocks (kv_full barriers `full` and `full + 16`: blocks cb and cb + 2) complete
  // as its copies land: every lane holds both phases open until its own cp.async copies have
  // landed, then lane 0 gives the one arrival each barrier counts.
  __device__ __forceinline__ void complete_on_landing(uint32_t full) const {
    ptx::cp_async_mbarrier_arrive(full);
    ptx::cp_async_mbarrier_arrive(full + 16);
    __syncwarp();  // every lane's copies are tracked before lane 0 arrives
    if (lane == 0) {
      ptx::mbarrier_arrive(full);
      ptx::mbarrier_arrive(full + 16);
    }
  }
};

}  // namespace dsv4
