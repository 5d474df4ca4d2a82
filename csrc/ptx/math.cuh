// Fast math instructions used by the softmax.
#pragma once

#include <cstdint>

namespace dsv4::ptx {

// ex2.approx.ftz.f32: 2^x; ex2(-inf) = 0.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace dsv4::ptx
