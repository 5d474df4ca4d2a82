// The shell of the sm90a head_dim-512 shared-KV kernel: barrier init, the register split, the
// role dispatch and the work loops. traits.h describes the roles and the barrier protocol;
// producer.cuh, consumer.cuh and epilogue.cuh hold the roles.
//
// Keys come in two segments, walked as one sequence of tiles in one online softmax: the rows
// of kv (fmha's visibility: causal, window) and, for dsv4_attention, the closed rows of
// compressed_kv (row w is closed for position t iff w < min(Sc, (t + 1) / r)): all of them
// (HCA, TMA tiles), or the K listed for the tile's token (CSA: one token per tile, 64 listed
// slots per tile; a slot is visible iff its index is closed).
// Split-KV: when the work tiles cannot fill the SMs, each is cut into num_splits ranges of its
// key tiles (work = tile * num_splits + split); a split writes fp32 partial rows and their lse,
// and the combine kernel (csrc/sm90/shared/split_kv_combine.cuh) folds in the sink; or, launched
// as clusters of two CTAs (split_merge), two splits merge in shared memory (split_merge.cuh).
// Masking: key tiles no row can see are never loaded; only boundary tiles are masked, per
// element, from each row's token position (csrc/sm90/shared/key_range.cuh). Rows that see
// nothing end with out = 0 and lse = -inf, or the sink-only value with a sink.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "ptx/cluster.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/sync.cuh"
#include "ptx/tma.cuh"
#include "sm90/mqa512/consumer.cuh"
#include "sm90/mqa512/epilogue.cuh"
#include "sm90/mqa512/narrow_consumer.cuh"
#include "sm90/mqa512/params.h"
#include "sm90/mqa512/producer.cuh"
#include "sm90/mqa512/traits.h"
#include "sm90/mqa512/work.cuh"
#include "sm90/shared/smem.cuh"

namespace dsv4 {

// kKeys: where the key tiles come from (params.h).
template <typename Element, Mqa512Keys kKeys>
__global__ void __launch_bounds__(Mqa512Sm90Traits<Element>::kThreads, 1)
    mqa512_sm90_kernel(const __grid_constant__ CUtensorMap tmap_q,
                       const __grid_constant__ CUtensorMap tmap_kv,
                       const __grid_constant__ CUtensorMap tmap_c, const Mqa512Sm90Params p) {
  using T = Mqa512Sm90Traits<Element>;
  constexpr bool kPaged = mqa512_paged_keys(kKeys);
  // Aligned by offsetting the __shared__ array itself (not through an integer), so the
  // compiler keeps the shared address space: 32-bit LDS/STS instead of generic accesses.
  auto& s = *reinterpret_cast<typename T::SharedStorage*>(smem_raw + smem_align_offset());
  static_assert(sizeof(Mqa512TileInfo) <= sizeof(s.tile_ring[0]), "tile_ring too small");
  const int num_work = p.num_work;
  if (p.tile_tokens * p.tile_heads < T::kBlockM) {  // padded tiles: Q's rows past them read 0
    for (int i = threadIdx.x; i < int(sizeof(s.q) / 16); i += T::kThreads) {
      reinterpret_cast<uint4*>(&s.q[0][0][0])[i] = make_uint4(0u, 0u, 0u, 0u);
    }
    ptx::fence_proxy_async_smem();
  }
  if (threadIdx.x == 0) {
    // Paged: Q's map (its only one; the keys come by cp.async) on its way into the descriptor
    // cache before the first issue (a parameter: fine before griddep_wait). Elsewhere the
    // prefetch cost the prefill rows up to 1-3% (docs/mqa512.md).
    if constexpr (kPaged) ptx::tma_prefetch_descriptor(&tmap_q);
    mqa512_init_barriers<T>(s, mqa512_sinks_with_q(p), p.split_merge > 1);
    if constexpr (kKeys == Mqa512Keys::kPagedStaged) {
      for (int stage = 0; stage < 2; ++stage) {
        ptx::mbarrier_init(ptx::smem_addr(&s.paged_converted[stage]), 1);
      }
      ptx::fence_barrier_init();
    }
  }
  // The kernel after this one (a split call's combine, or the next call's kernel), queued by
  // programmatic dependent launch, may take the SMs this grid leaves from now on, and waits for
  // this grid itself.
  ptx::griddep_launch_dependents();
  if (p.split_merge > 1) {
    ptx::cluster_sync();  // the other CTA's merge barriers are initialised before any arrival
  } else {
    __syncthreads();
  }
  // Queued by programmatic dependent launch (launch.cuh): the kernel before this one on the
  // stream has finished and its writes are visible past this point, and nothing above touched
  // global memory (the tensor maps prefetched are parameters).
  ptx::griddep_wait();

  if (threadIdx.x / 128 == 0) {
    ptx::setmaxnreg_dec<kPaged ? T::kPagedProducerRegs : T::kProducerRegs>();
    const Mqa512Producer<Element> producer{s, p};
    for (Mqa512Progress progress(blockIdx.x); progress.work() < num_work;
         progress.next_work(ptx::grid_ctas())) {
      const int list_tiles = mqa512_planned_list_tiles(p, progress.work());  // under the decode
      const Mqa512WorkTile w = mqa512_decode_tile(p, progress.work());
      const Mqa512KeySegments seg = mqa512_key_segments(p, w, T::kBlockN, kPaged, list_tiles);
      const SplitRange range = split_key_range(seg.num_kv + seg.num_c, w.split, p.num_splits);
      const int n = range.end - range.begin;
      producer.publish_tile(progress, w, seg, range, n);
      __syncwarp();  // converged (see the Q load)
      progress.next_slot();
      if (n == 0) continue;  // the consumers write the empty rows, no loads
      producer.load_q(tmap_q, progress, w);
      // Each producer warp stays converged: the lanes that skip a single-lane issue wait for
      // it here instead of spinning in the next try_wait beside it.
      __syncwarp();
      if constexpr (kPaged) {
        producer.template load_paged_tiles<kKeys == Mqa512Keys::kPagedStaged>(progress, w, seg,
                                                                              range, n);
      } else {
        producer.load_key_tiles(tmap_kv, tmap_c, progress, w, seg, range, n);
      }
      progress.finish_keys(n);
    }
    if (p.split_merge > 1) mqa512_producer_leaves_stages(s);
    mqa512_leave_cluster(p);
    return;
  }

  ptx::setmaxnreg_inc<kPaged ? T::kPagedConsumerRegs : T::kConsumerRegs>();
  Mqa512Consumer<Element, kKeys> consumer{s, p, static_cast<int>(threadIdx.x / 128) - 1};
  for (Mqa512Progress progress(blockIdx.x); progress.work() < num_work;  // as in the producer
       progress.next_work(ptx::grid_ctas())) {
    const int n = consumer.take_tile(progress);  // this split's key tiles
    if (n > 0) consumer.run_keys(progress, n);
    progress.finish_keys(n);
    mqa512_epilogue(consumer, progress, n);
    progress.next_slot();
  }
  mqa512_leave_cluster(p);
}

// The narrow form (traits.h: Mqa512NarrowTraits): CSA work tiles of one token's heads, no
// split-KV. The producers share the seesaw kernel's per-tile body; the key tiles go round a
// ring of three stages (Mqa512Ring).
template <typename Element>
__global__ void __launch_bounds__(Mqa512NarrowTraits<Element>::kThreads, 1)
    mqa512_narrow_sm90_kernel(const __grid_constant__ CUtensorMap tmap_q,
                              const __grid_constant__ CUtensorMap tmap_kv,
                              const __grid_constant__ CUtensorMap tmap_c,
                              const Mqa512Sm90Params p) {
  using T = Mqa512NarrowTraits<Element>;
  auto& s = *reinterpret_cast<typename T::SharedStorage*>(smem_raw + smem_align_offset());
  static_assert(sizeof(Mqa512TileInfo) <= sizeof(s.tile_ring[0]), "tile_ring too small");
  const int num_work = p.num_work;
  // Q's rows past the group's heads are never loaded: zero once, for the wgmmas to read.
  for (int i = threadIdx.x; i < int(sizeof(s.q) / 16); i += T::kThreads) {
    reinterpret_cast<uint4*>(&s.q[0][0][0])[i] = make_uint4(0u, 0u, 0u, 0u);
  }
  ptx::fence_proxy_async_smem();
  if (threadIdx.x == 0) mqa512_narrow_init_barriers<T>(s, mqa512_sinks_with_q(p));
  __syncthreads();

  if (threadIdx.x / 128 == 0) {
    ptx::setmaxnreg_dec<T::kProducerRegs>();
    const Mqa512Producer<Element, T> producer{s, p};
    Mqa512Ring ring;
    for (Mqa512Progress progress(blockIdx.x); progress.work() < num_work;
         progress.next_work(ptx::grid_ctas())) {
      const int list_tiles = mqa512_planned_list_tiles(p, progress.work());
      const Mqa512WorkTile w = mqa512_decode_tile(p, progress.work());
      const Mqa512KeySegments seg = mqa512_key_segments(p, w, T::kBlockN, false, list_tiles);
      const SplitRange range{0, seg.num_kv + seg.num_c};  // no split-KV
      const int n = range.end;
      producer.publish_tile(progress, w, seg, range, n);
      __syncwarp();
      progress.next_slot();
      if (n == 0) continue;
      producer.load_q(tmap_q, progress, w);
      __syncwarp();
      producer.load_ring_tiles(tmap_kv, tmap_c, ring, w, seg, range, n);
      ring.finish_keys(n);
      progress.finish_keys(n);
    }
    return;
  }

  ptx::setmaxnreg_inc<T::kConsumerRegs>();
  Mqa512NarrowConsumer<Element> consumer{s, p, static_cast<int>(threadIdx.x / 128) - 1};
  Mqa512Ring ring;
  for (Mqa512Progress progress(blockIdx.x); progress.work() < num_work;
       progress.next_work(ptx::grid_ctas())) {
    const int n = consumer.take_tile(progress);
    if (n > 0) consumer.run_keys(progress, ring, n);
    consumer.finish_tile(progress, ring, n);
    ring.finish_keys(n);
    progress.finish_keys(n);
    progress.next_slot();
  }
}

}  // namespace dsv4
