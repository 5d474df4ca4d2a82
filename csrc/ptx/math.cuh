// Fast math instructions and the fp32 -> 16-bit packing that wgmma A fragments use.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace dsv4::ptx {

// ex2.approx.ftz.f32: 2^x; ex2(-inf) = 0.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Two floats -> one 32-bit register of two bf16 or fp16 values (lo in the low half).
template <typename Element>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

// ReLU of two floats, rounded to bf16 and packed (lo in the low half). cvt.rn.relu keeps a NaN;
// max with 0 (which returns the non-NaN operand) makes it 0, as fmaxf(x, 0) does.
__device__ __forceinline__ uint32_t pack2_relu_bf16(float lo, float hi) {
  uint32_t r;
  asm("{\n.reg .b32 t;\ncvt.rn.relu.bf16x2.f32 t, %1, %2;\nmax.bf16x2 %0, t, %3;\n}"
      : "=r"(r)
      : "f"(hi), "f"(lo), "r"(0u));
  return r;
}

// One bf16, fp16 or fp32 value <-> float, explicitly (torch builds disable the implicit
// conversions); rounding to nearest even.
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(float x) { return x; }
template <typename Element>
__device__ __forceinline__ Element from_float(float x) {
  if constexpr (std::is_same_v<Element, float>) {
    return x;
  } else if constexpr (std::is_same_v<Element, __nv_bfloat16>) {
    return __float2bfloat16_rn(x);
  } else {
    return __float2half_rn(x);
  }
}

}  // namespace dsv4::ptx
