// cp.async: small asynchronous global -> shared copies (PTX ISA 9.7.9.3), for data too narrow or
// too strided for a TMA box, with completion reported on an mbarrier.
#pragma once

#include <cstdint>

namespace dsv4::ptx {

// Copies 4 bytes from `src` when `valid`, else writes 4 zero bytes (src-size 0 reads nothing).
__device__ __forceinline__ void cp_async_4_zfill(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src),
               "r"(valid ? 4 : 0)
               : "memory");
}

// Copies 8 bytes from `src` when `valid`, else writes 8 zero bytes.
__device__ __forceinline__ void cp_async_8_zfill(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(dst), "l"(src),
               "r"(valid ? 8 : 0)
               : "memory");
}

// Copies 16 bytes from `src` when `valid`, else writes 16 zero bytes; bypasses L1 (.cg).
__device__ __forceinline__ void cp_async_16_zfill(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}

// The same for a list entry `listed`: 16 zero bytes where it is negative (ignore-src, nothing
// read). The sign test is the copy's predicate: a src-size of 16 or 0 cost three instructions.
__device__ __forceinline__ void cp_async_16_unless_negative(uint32_t dst, const void* src,
                                                            int listed) {
  asm volatile(
      "{\n\t.reg .pred ignore;\n\t"
      "setp.lt.s32 ignore, %2, 0;\n\t"
      "cp.async.cg.shared.global [%0], [%1], 16, ignore;\n\t}" ::"r"(dst),
      "l"(src), "r"(listed)
      : "memory");
}

// cp.async.wait_all: this thread's earlier cp.async copies have landed.
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;" ::: "memory");
}

// The mbarrier's pending count goes up by one now and back down once all of this thread's
// earlier cp.async copies have landed: the phase cannot complete before they have.
__device__ __forceinline__ void cp_async_mbarrier_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}

// The mbarrier receives one arrival once all of this thread's earlier cp.async copies have
// landed. noinc: the arrival is counted in the barrier's initial count.
__device__ __forceinline__ void cp_async_mbarrier_arrive_noinc(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}

}  // namespace dsv4::ptx
