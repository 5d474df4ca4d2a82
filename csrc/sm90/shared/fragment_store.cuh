// Stores rows of an m64nN wgmma accumulator fragment (layout in online_softmax.cuh) to global
// memory as 16-bit elements, 16 bytes per lane. The fragment gives each lane of a row's quad two
// adjacent columns of every 8-column group, so direct stores move 4 bytes per lane and a warp
// store touches 8 rows x 16 bytes; the quad first trades values (quad_transpose) so that each
// lane holds 8 adjacent columns, and a warp store writes 8 rows x 64 contiguous bytes with a
// quarter of the instructions.
#pragma once

#include <cstdint>

#include "ptx/math.cuh"

namespace dsv4 {

// v[t] of quad lane q becomes v[q] of quad lane t (a 4 x 4 transpose of 32-bit values across
// the four lanes of each quad): two butterfly steps over lane bits 0 and 1. Every lane of the
// warp must call it.
__device__ __forceinline__ void quad_transpose(uint32_t (&v)[4], int lane) {
#pragma unroll
  for (int bit = 1; bit <= 2; bit <<= 1) {
    const bool upper = (lane & bit) != 0;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      if (t & bit) continue;  // pairs (t, t + bit)
      const uint32_t send = upper ? v[t] : v[t + bit];
      const uint32_t got = __shfl_xor_sync(0xffffffff, send, bit);
      if (upper) {
        v[t] = got;
      } else {
        v[t + bit] = got;
      }
    }
  }
}

// Row r + 8 i of the fragment (i = 0, 1; r = 16 warp + lane / 4), times `scale`, to
// row_ptr[0, kCols) when `valid`. Every lane of the warp must call it (the quad trades values
// first), with `valid` the same across each quad.
template <typename Element, int kCols>
__device__ __forceinline__ void store_fragment_row(const float (&acc)[kCols / 2], int i,
                                                   float scale, Element* row_ptr, bool valid,
                                                   int lane) {
  static_assert(kCols % 32 == 0, "whole 32-column groups (one 16-byte piece per quad lane)");
#pragma unroll
  for (int g = 0; g < kCols / 32; ++g) {
    uint32_t v[4];  // column group 4 g + t: columns 2 (lane % 4) + {0, 1}
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const int j = 4 * g + t;
      v[t] = ptx::pack2<Element>(acc[4 * j + 2 * i] * scale, acc[4 * j + 2 * i + 1] * scale);
    }
    quad_transpose(v, lane);  // now: columns 32 g + 8 (lane % 4) + [0, 8)
    if (valid) {
      *reinterpret_cast<uint4*>(row_ptr + 32 * g + 8 * (lane % 4)) =
          make_uint4(v[0], v[1], v[2], v[3]);
    }
  }
}

}  // namespace dsv4
