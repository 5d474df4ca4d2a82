// TMA: bulk tensor copies between global and shared memory described by a CUtensorMap (PTX ISA
// 9.7.9.25), and the bulk groups that track the stores.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace dsv4::ptx {

// prefetch.tensormap: pull a __grid_constant__ tensor map into the descriptor cache.
__device__ __forceinline__ void tma_prefetch_descriptor(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// cp.async.bulk.tensor.4d: copy the box at coordinates (c0 innermost .. c3) into shared memory;
// completion is signalled on `bar` as transaction bytes. Out-of-bounds elements are zero-filled.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar,
                                            int32_t c0, int32_t c1, int32_t c2, int32_t c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

// cp.async.bulk (no tensor map): copy `bytes` contiguous bytes (a multiple of 16, both addresses
// 16-byte aligned) from global into shared memory; completion is signalled on `bar` as
// transaction bytes.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes,
                                          uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(bar)
      : "memory");
}

// cp.async.bulk (no tensor map), shared -> global: copy `bytes` contiguous bytes (a multiple of
// 16, both addresses 16-byte aligned), tracked by this thread's bulk groups. The writers of
// `src` fence the proxies (fence_proxy_async_smem) before it is issued.
__device__ __forceinline__ void bulk_store(void* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(
                   reinterpret_cast<uint64_t>(dst)),
               "r"(src), "r"(bytes)
               : "memory");
}

// cp.async.bulk.tensor.4d, shared -> global: store the box at coordinates (c0 innermost .. c3)
// from shared memory, tracked by this thread's bulk groups. Box elements outside the tensor are
// not written. The writers of `src` fence the proxies (fence_proxy_async_smem) before it is issued.
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, uint32_t src, int32_t c0,
                                             int32_t c1, int32_t c2, int32_t c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

// cp.async.bulk.commit_group: close this thread's bulk stores issued so far into one group.
__device__ __forceinline__ void bulk_commit_group() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// cp.async.bulk.wait_group.read N: at most N of this thread's newest groups still read their
// shared-memory source; the rest may be overwritten.
template <int N>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}

// cp.async.bulk.wait_group N: at most N of this thread's newest groups are still in flight.
template <int N>
__device__ __forceinline__ void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(N) : "memory");
}

}  // namespace dsv4::ptx
