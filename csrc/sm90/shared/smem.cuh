// The dynamic shared memory of the sm90 kernels. A kernel's SharedStorage starts at its first
// 1024-byte boundary (what 128-byte-swizzled TMA boxes and wgmma operands need), reached as
// `*reinterpret_cast<SharedStorage*>(smem_raw + smem_align_offset())`: offsetting the __shared__
// array itself, not an integer, keeps shared-space addressing (an integer round trip makes the
// accesses generic).
#pragma once

#include <cstdint>

#include "ptx/mbarrier.cuh"

namespace dsv4 {

extern __shared__ uint8_t smem_raw[];

__device__ __forceinline__ uint32_t smem_align_offset() {
  return (1024 - (ptx::smem_addr(smem_raw) & 1023)) & 1023;
}

}  // namespace dsv4
