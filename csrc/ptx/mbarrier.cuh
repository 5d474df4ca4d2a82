// mbarrier: shared-memory barriers with a phase bit and a transaction-byte count (PTX ISA 9.7.13.15).
// Addresses are shared-space (32-bit) addresses from smem_addr().
#pragma once

#include <cstdint>

namespace dsv4::ptx {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// mbarrier.init: `count` arrivals complete a phase.
__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

// fence.mbarrier_init: make initialised barriers visible to the async (TMA) proxy.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// mbarrier.arrive.expect_tx: arrive once and expect `bytes` more transaction bytes this phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}

// mbarrier.arrive: one arrival.
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

// mbarrier.try_wait.parity: true once the phase with parity `phase` has completed.
__device__ __forceinline__ bool mbarrier_try_wait(uint32_t bar, uint32_t phase) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(phase)
      : "memory");
  return done != 0;
}

// Block until the phase with parity `phase` has completed.
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t phase) {
  while (!mbarrier_try_wait(bar, phase)) {
  }
}

}  // namespace dsv4::ptx
