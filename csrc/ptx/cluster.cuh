// Thread-block clusters: the CTA's rank, the cluster barrier, and another CTA's shared memory
// (distributed shared memory: mapa addresses, stores, and mbarrier arrivals across CTAs;
// PTX ISA 9.7.13.15 and 9.7.9.x). Addresses are 32-bit shared-space addresses.
#pragma once

#include <cstdint>

namespace dsv4::ptx {

// %cluster_ctarank: this CTA's rank within its cluster (0 outside a cluster launch).
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// Every thread of every CTA of the cluster: the barrier.cluster pair, release then acquire, so
// that what each CTA wrote before it (barrier inits included) is visible to the others after,
// and no CTA passes it while another may still touch its shared memory. (Not .aligned: callers
// need not be converged.)
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
}

// mapa: the address of the same shared-memory location in CTA `rank` of the cluster.
__device__ __forceinline__ uint32_t map_to_rank(uint32_t addr, uint32_t rank) {
  uint32_t out;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(out) : "r"(addr), "r"(rank));
  return out;
}

// A 16-byte store to a (possibly remote) address from map_to_rank.
__device__ __forceinline__ void st_cluster_v4(uint32_t addr, float a, float b, float c, float d) {
  asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "f"(a), "f"(b),
               "f"(c), "f"(d)
               : "memory");
}

// One arrival on a (possibly remote) mbarrier from map_to_rank, releasing this thread's earlier
// writes at cluster scope to whoever acquires the phase (mbarrier_wait_cluster).
__device__ __forceinline__ void mbarrier_arrive_cluster(uint32_t remote_bar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(remote_bar)
               : "memory");
}

// Block until the phase with parity `phase` of this CTA's mbarrier has completed, acquiring at
// cluster scope what the arrivals from other CTAs released.
__device__ __forceinline__ void mbarrier_wait_cluster(uint32_t bar, uint32_t phase) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(phase)
        : "memory");
  }
}

}  // namespace dsv4::ptx
