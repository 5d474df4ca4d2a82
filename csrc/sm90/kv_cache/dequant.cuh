// Reading the paged FP8 record (format.h) on the device, shared by the gather kernel and the
// head_dim-512 attention kernel's paged producer: where a slot's record lives, and one 16-byte
// chunk of fp8 dims as 16 values of the compute type.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "ptx/math.cuh"
#include "sm90/kv_cache/format.h"

namespace dsv4 {

// 2^e for |e| < 127, exactly.
__device__ __forceinline__ float kv_exp2i(int e) { return __int_as_float((127 + e) << 23); }

// A tile's scale from its UE8M0 byte (2^(byte - 127); byte 0 gives 0).
__device__ __forceinline__ float kv_scale_of(uint8_t byte) {
  return __int_as_float(static_cast<int>(byte) << 23);
}

// 16 float8_e4m3 values times `scale`, as 16 Elements (bf16 values of this format are exact).
template <typename Element>
__device__ __forceinline__ void kv_dequant16(uint4 fp8, float scale, uint4 (&out)[2]) {
  union {
    uint4 v;
    __nv_fp8x2_storage_t pair[8];
  } in;
  in.v = fp8;
  uint32_t* words = reinterpret_cast<uint32_t*>(out);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(in.pair[i], __NV_E4M3)));
    if constexpr (std::is_same_v<Element, __nv_bfloat16>) {
      // Pack first (e4m3 values are exact in bf16), then one bf16x2 multiply by the power of
      // two, exact while the product stays normal: 5 instructions a pair instead of 6.
      const __nv_bfloat162 v =
          __hmul2(__floats2bfloat162_rn(f.x, f.y), __float2bfloat162_rn(scale));
      words[i] = *reinterpret_cast<const uint32_t*>(&v);
    } else {
      words[i] = ptx::pack2<Element>(f.x * scale, f.y * scale);
    }
  }
}

// 8 bf16 values of a data row's last 64 dims (one 16-byte chunk) as 8 Elements.
template <typename Element>
__device__ __forceinline__ uint4 kv_tail8(uint4 bf16) {
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) {
    return bf16;
  } else {
    const __nv_bfloat162* in = reinterpret_cast<const __nv_bfloat162*>(&bf16);
    uint4 out;
    uint32_t* words = reinterpret_cast<uint32_t*>(&out);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(in[i]);
      words[i] = ptx::pack2<Element>(f.x, f.y);
    }
    return out;
  }
}

}  // namespace dsv4
