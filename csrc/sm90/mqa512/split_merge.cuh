// A work tile's two splits merged in a cluster of two CTAs (Mqa512Sm90Params::split_merge; plan.h
// says where). CTA k ran split k of the work tile's key tiles and ends with O unnormalised
// against its reference max m_run, and each row's sum. It owns out's columns [256 k, 256 k +
// 256), consumer k's in either CTA: the other CTA's consumer k sends its O and each row's
// (m_run, sum) through distributed shared memory into this CTA's key stages (free once both
// its consumers' last P V is done and its producer's copies have landed), and consumer k here
// folds them in as the split-KV combine would. No fp32 partials reach global memory, and no
// combine kernel runs.
#pragma once

#include <cstdint>

#include "ptx/cluster.cuh"
#include "ptx/cp_async.cuh"
#include "ptx/math.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/sync.cuh"
#include "sm90/mqa512/consumer.cuh"
#include "sm90/shared/online_softmax.cuh"
#include "sm90/shared/trace.cuh"

namespace dsv4 {

// Every thread of the CTA, once it is done with this CTA's key stages (a consumer: its last
// wgmma; the producer: its copies landed), tells the other CTA, whose sender will store there:
// merge_free counts all of them, and each thread releases its own accesses at cluster scope.
// (compute-sanitizer's racecheck flags the gathered keys' cp.async writes against the sender's
// stores under any barrier, a whole-cluster one too: benchmarks/profile/racecheck.)
template <typename Storage>
__device__ __forceinline__ void mqa512_release_stages_to_peer(Storage& s, uint32_t rank) {
  ptx::mbarrier_arrive_cluster(ptx::map_to_rank(ptx::smem_addr(&s.merge_free), rank ^ 1));
}

// The producer's part, after its one work tile (plan.h: a merging CTA holds one).
template <typename Storage>
__device__ __forceinline__ void mqa512_producer_leaves_stages(Storage& s) {
  ptx::cp_async_wait_all();
  mqa512_release_stages_to_peer(s, ptx::cluster_ctarank());
}

// Consumer c's part of the merge; total: its rows' sums over this CTA's split (both consumers',
// against c.m_run). Returns whether c owns its columns: then c.o, c.m_run and total hold both
// splits; else c sent them to the other CTA.
template <typename Element, Mqa512Keys kKeys>
__device__ __forceinline__ bool mqa512_merge_splits(Mqa512Consumer<Element, kKeys>& c,
                                                    float (&total)[2]) {
  auto& s = c.s;
  const int tid = c.tid;
  const uint32_t rank = ptx::cluster_ctarank();
  // In the owner's stages, 16 bytes a thread: the sender's columns [8-column group][thread],
  // then its rows' (m_run, sum) [thread].
  float4* const rows = reinterpret_cast<float4*>(&s.kv[0][0][0][0]);
  float4* const record = rows + 32 * 128;
  static_assert(sizeof(s.kv) >= 33 * 128 * 16, "a consumer's columns fit the stages");

  // This consumer's wgmmas are done: its part of this CTA's stages is free.
  mqa512_release_stages_to_peer(s, rank);
  if (c.wg != static_cast<int>(rank)) {  // the other CTA owns these columns: send them
    ptx::mbarrier_wait_cluster(ptx::smem_addr(&s.merge_free), 0);
    DSV4_TRACE_STAMP(c.wg, kTraceMergeFree, tid == 0);
    const uint32_t dst = ptx::map_to_rank(ptx::smem_addr(rows + tid), rank ^ 1);
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      ptx::st_cluster_v4(dst + j * 128 * 16, c.o[4 * j], c.o[4 * j + 1], c.o[4 * j + 2],
                         c.o[4 * j + 3]);
    }
    ptx::st_cluster_v4(ptx::map_to_rank(ptx::smem_addr(record + tid), rank ^ 1), c.m_run[0],
                       c.m_run[1], total[0], total[1]);
    ptx::mbarrier_arrive_cluster(ptx::map_to_rank(ptx::smem_addr(&s.merge_full), rank ^ 1));
    DSV4_TRACE_STAMP(c.wg, kTraceMergeSent, tid == 0);
    return false;
  }
  ptx::mbarrier_wait_cluster(ptx::smem_addr(&s.merge_full), 0);
  DSV4_TRACE_STAMP(c.wg, kTraceMergeIn, tid == 0);
  // Both splits' rows against their common reference max (a split that saw no key has
  // m_run = -inf and adds 0).
  const float4 r = record[tid];
  float own[2], other[2];
  const float m_other[2] = {r.x, r.y}, sum_other[2] = {r.z, r.w};
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float m_new = fmaxf(c.m_run[i], m_other[i]);
    const float base = softmax_base(m_new);
    own[i] = ptx::exp2_approx(c.m_run[i] - base);
    other[i] = ptx::exp2_approx(m_other[i] - base);
    total[i] = total[i] * own[i] + sum_other[i] * other[i];
    c.m_run[i] = m_new;
  }
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    const float4 v = rows[j * 128 + tid];
    c.o[4 * j] = c.o[4 * j] * own[0] + v.x * other[0];
    c.o[4 * j + 1] = c.o[4 * j + 1] * own[0] + v.y * other[0];
    c.o[4 * j + 2] = c.o[4 * j + 2] * own[1] + v.z * other[1];
    c.o[4 * j + 3] = c.o[4 * j + 3] * own[1] + v.w * other[1];
  }
  DSV4_TRACE_STAMP(c.wg, kTraceMergeFolded, tid == 0);
  return true;
}

// Every thread, before it exits: in a merging cluster no CTA may leave while the other may still
// store into its shared memory (the merge's own barriers order the data; compute-sanitizer's
// racecheck asks for this one too).
__device__ __forceinline__ void mqa512_leave_cluster(const Mqa512Sm90Params& p) {
  if (p.split_merge > 1) ptx::cluster_sync();
}

}  // namespace dsv4
