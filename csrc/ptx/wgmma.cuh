// wgmma control and shared-memory matrix descriptors (PTX ISA 9.7.15). The instructions
// themselves are generated into wgmma_ops.cuh.
#pragma once

#include <cstdint>

#include "ptx/wgmma_ops.cuh"

namespace dsv4::ptx {

// Matrix descriptor for a tile stored with the 128-byte swizzle (PTX ISA 9.7.15.5.1.2):
//   bits  0-13 start address >> 4, 16-29 leading byte offset >> 4,
//   bits 32-45 stride byte offset >> 4, 62-63 swizzle mode (1 = 128B).
// K-major: rows of 128 bytes, 8-row groups `sbo` bytes apart (lbo unused).
// MN-major: 64-element MN blocks `lbo` bytes apart, 8-row K groups `sbo` bytes apart.
// The tile base must be 1024-byte aligned (base offset field 0).
__device__ __forceinline__ uint64_t smem_desc_sw128(uint32_t smem_addr, uint32_t lbo,
                                                    uint32_t sbo) {
  uint64_t desc = (smem_addr & 0x3FFFFu) >> 4;
  desc |= static_cast<uint64_t>((lbo >> 4) & 0x3FFFu) << 16;
  desc |= static_cast<uint64_t>((sbo >> 4) & 0x3FFFu) << 32;
  desc |= static_cast<uint64_t>(1) << 62;
  return desc;
}

// The descriptor of the tile `bytes` further on in shared memory (same layout): one 32-bit add
// on the start-address field, where building each descriptor afresh costs five instructions
// (mask, shift, or, and the high word) per wgmma. No carry leaves the field: shared addresses
// stay below 2^18 bytes, so (address >> 4) + (bytes >> 4) fits its 14 bits.
__device__ __forceinline__ uint64_t smem_desc_advance(uint64_t desc, uint32_t bytes) {
  const uint32_t lo = static_cast<uint32_t>(desc) + (bytes >> 4);
  return (desc & 0xFFFFFFFF00000000ull) | lo;
}

// wgmma.fence: order register writes (accumulators, A fragments) before the next wgmma.
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}

// wgmma.commit_group: close the group of wgmmas issued so far.
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}

// wgmma.wait_group: wait until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  static_assert(N >= 0 && N <= 7, "wgmma.wait_group takes 0..7");
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// Pins a register at this point so the compiler cannot move its uses across a wgmma wait.
__device__ __forceinline__ void fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void fence_operand(uint32_t& r) {
  asm volatile("" : "+r"(r)::"memory");
}

}  // namespace dsv4::ptx
