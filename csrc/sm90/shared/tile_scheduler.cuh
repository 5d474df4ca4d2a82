// Which work tile a CTA of the sm90 attention kernels takes next. Its producer thread draws it;
// under the dynamic grid only the producer knows the draw, so the kernel publishes the index to
// its consumers (fmha: FmhaSm90Traits::kPublishWorkTiles).
//
// Three grids, the launcher's choice:
//   one CTA per work tile   the hardware starts CTAs as SMs free up (in blockIdx order);
//   static persistent       one CTA per SM, each striding over the work tiles by gridDim.x;
//   dynamic persistent      one CTA per SM, each starting at blockIdx.x and then drawing
//                           gridDim.x + atomicAdd(counter, 1) from a per-call counter that the
//                           launcher zeroes in the same stream, so a CTA that drew cheap tiles
//                           takes more of them. With the costliest tiles first, the tail balances.
// Both persistent grids overlap a tile's Q load with the previous tile's last PV and epilogue.
#pragma once

#include <cstdint>

#include "ptx/sync.cuh"

namespace dsv4 {

// The work tile after `work` for this CTA: counter == nullptr strides statically.
__device__ __forceinline__ int next_work_tile(int* counter, int work) {
  return counter != nullptr ? atomicAdd(counter, 1) + ptx::grid_ctas() : work + ptx::grid_ctas();
}

}  // namespace dsv4
