// The paged FP8 KV cache kernels (format.h): quantize rows into their slots, and read slots
// back as rows. One warp per row: lanes 0-27 hold 16 dims of the fp8 part each (lanes 4t to
// 4t + 3 make up tile t), lanes 28-31 16 dims of the bf16 part each, so every lane moves 16
// bytes of fp8 or 32 of bf16 with vector accesses.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "ptx/math.cuh"
#include "sm90/kv_cache/dequant.cuh"
#include "sm90/kv_cache/format.h"

namespace dsv4 {

constexpr int kKvCacheRowsPerBlock = 8;  // warps per CTA
constexpr int kKvQuantLanes = kKvQuantDims / 16;  // 28

// The record of `slot` in the cache, or nullptr for -1 and slots past the cache.
template <typename Slot>
__device__ __forceinline__ uint8_t* kv_page(const KvCacheLayout& c, Slot slot, int64_t& row) {
  if (slot < 0 || static_cast<int64_t>(slot) >= c.num_blocks * c.page_rows) return nullptr;
  const int64_t block = static_cast<int64_t>(slot) / c.page_rows;
  row = static_cast<int64_t>(slot) - block * c.page_rows;
  return c.base + block * c.block_stride;
}

template <typename Element, typename Slot>
__global__ void __launch_bounds__(kKvCacheRowsPerBlock * 32)
    kv_cache_insert_fp8_kernel(const Element* __restrict__ kv, int64_t kv_row_stride,
                               const Slot* __restrict__ slots, int64_t rows, KvCacheLayout cache) {
  const int64_t row = int64_t(blockIdx.x) * kKvCacheRowsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  // The row is loaded whatever its slot, so its loads go out with the slot's, not behind it;
  // a skipped slot only drops the stores.
  union {
    uint4 v[2];
    Element e[16];
  } in;
  const uint4* src = reinterpret_cast<const uint4*>(kv + row * kv_row_stride + lane * 16);
  in.v[0] = src[0];
  in.v[1] = src[1];
  int64_t r = 0;
  uint8_t* page = kv_page(cache, slots[row], r);
  uint8_t* data = page + r * kKvDataBytes;
  float x[16], amax = 0.f;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    x[i] = ptx::to_float(in.e[i]);
    amax = fmaxf(amax, fabsf(x[i]));
  }
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffff, amax, 1));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffff, amax, 2));
  const int e = kv_scale_exponent(amax);
  // Lane 0 gathers the tiles' exponents (lane 4t has tile t's) into the scale row.
  uint32_t scale_lo = 0, scale_hi = 0;
#pragma unroll
  for (int t = 0; t < kKvTiles; ++t) {
    const uint32_t byte = static_cast<uint32_t>(__shfl_sync(0xffffffff, e, 4 * t) + 127) & 0xff;
    if (t < 4) {
      scale_lo |= byte << (8 * t);
    } else {
      scale_hi |= byte << (8 * (t - 4));
    }
  }
  if (page == nullptr) return;  // the whole warp: one slot per warp
  if (lane < kKvQuantLanes) {
    const float inv = kv_exp2i(-e);  // x / 2^e, exact
    union {
      uint4 v;
      __nv_fp8x2_storage_t pair[8];
    } out;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      out.pair[i] = __nv_cvt_float2_to_fp8x2(make_float2(x[2 * i] * inv, x[2 * i + 1] * inv),
                                             __NV_SATFINITE, __NV_E4M3);
    }
    *reinterpret_cast<uint4*>(data + lane * 16) = out.v;
    if (lane == 0) {
      *reinterpret_cast<uint2*>(page + int64_t(cache.page_rows) * kKvDataBytes + r * kKvScaleBytes) =
          make_uint2(scale_lo, scale_hi);
    }
  } else {  // dims 448-511 as bf16
    union {
      uint4 v[2];
      __nv_bfloat16 b[16];
    } out;
    if constexpr (std::is_same_v<Element, __nv_bfloat16>) {
      out.v[0] = in.v[0];
      out.v[1] = in.v[1];
    } else {
#pragma unroll
      for (int i = 0; i < 16; ++i) out.b[i] = __float2bfloat16_rn(x[i]);
    }
    uint4* dst = reinterpret_cast<uint4*>(data + kKvQuantDims + (lane - kKvQuantLanes) * 32);
    dst[0] = out.v[0];
    dst[1] = out.v[1];
  }
}

template <typename Element, typename Slot>
__global__ void __launch_bounds__(kKvCacheRowsPerBlock * 32)
    kv_cache_gather_fp8_kernel(KvCacheLayout cache, const Slot* __restrict__ slots, int64_t rows,
                               Element* __restrict__ out) {
  const int64_t row = int64_t(blockIdx.x) * kKvCacheRowsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  int64_t r;
  const uint8_t* page = kv_page(cache, slots[row], r);
  union {
    uint4 v[2];
    Element e[16];
  } res;
  if (page == nullptr) {
    res.v[0] = res.v[1] = make_uint4(0, 0, 0, 0);
  } else if (lane < kKvQuantLanes) {
    const uint8_t* data = page + r * kKvDataBytes;
    const float scale =
        kv_scale_of(page[int64_t(cache.page_rows) * kKvDataBytes + r * kKvScaleBytes + lane / 4]);
    kv_dequant16<Element>(*reinterpret_cast<const uint4*>(data + lane * 16), scale, res.v);
  } else {
    const uint4* src =
        reinterpret_cast<const uint4*>(page + r * kKvDataBytes + kKvQuantDims + (lane - kKvQuantLanes) * 32);
    res.v[0] = kv_tail8<Element>(src[0]);
    res.v[1] = kv_tail8<Element>(src[1]);
  }
  uint4* dst = reinterpret_cast<uint4*>(out + row * kKvDims + lane * 16);
  dst[0] = res.v[0];
  dst[1] = res.v[1];
}

}  // namespace dsv4
