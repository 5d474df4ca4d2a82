// TMA: bulk tensor copies global -> shared described by a CUtensorMap (PTX ISA 9.7.9.25).
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

}  // namespace dsv4::ptx
