// A paged key block's conversion in shared memory, shared by the two roles that may do it (the
// producer warp that staged it, or the stage's consumer warpgroup: Mqa512Keys, plan.h): the
// float8_e4m3 bytes staged in the block's upper 4 KB (row r at byte 4096 + 64 r) times each
// row's tile scale, into the block's 128-byte-swizzled rows, in place.
#pragma once

#include <cstdint>
#include <type_traits>

#include "sm90/kv_cache/dequant.cuh"

namespace dsv4 {

// kThreads threads convert the block together: thread t takes 16 bytes (part t % 4) of rows
// t / 4 + (kThreads / 4) i, two rows at a time. Rows 0-31 land below the staging, rows 32-63 on
// it, so before each pair of steps that stores rows 32-63 every thread has read its staged bytes
// of them: `sync()` (the group's barrier) between the loads and those stores. scale_rows[r] is
// row r's scale row; the block's UE8M0 byte is its byte `byte`.
template <typename Element, int kThreads, typename Sync>
__device__ __forceinline__ void mqa512_convert_staged_block(
    char* tile, const uint8_t (*scale_rows)[kKvScaleBytes], int byte, int t, Sync&& sync) {
  constexpr int kRows = 64, kStaging = kRows * 64, kRowStep = kThreads / 4;
  constexpr int kSteps = kRows / kRowStep;
  static_assert(kSteps % 2 == 0, "two rows a thread at a time");
  const int part = t % 4, row0 = t / 4;
  const uint8_t* scale0 = &scale_rows[row0][byte];  // then at immediate offsets
#pragma unroll
  for (int k = 0; k < kSteps / 2; ++k) {
    uint4 raw[2];
    uint8_t scale[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int r = row0 + kRowStep * (2 * k + j);
      raw[j] = *reinterpret_cast<const uint4*>(tile + kStaging + r * 64 + part * 16);
      scale[j] = scale0[kKvScaleBytes * kRowStep * (2 * k + j)];
    }
    if (kRowStep * (2 * k + 1) >= kRows / 2) sync();  // these steps store rows 32-63
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int r = row0 + kRowStep * (2 * k + j);
      uint4 out[2];
      kv_dequant16<Element>(raw[j], kv_scale_of(scale[j]), out);
      char* dst = tile + r * 128;
      *reinterpret_cast<uint4*>(dst + (((2 * part) ^ (r % 8)) << 4)) = out[0];
      *reinterpret_cast<uint4*>(dst + (((2 * part + 1) ^ (r % 8)) << 4)) = out[1];
    }
  }
}

// Block 7 (dims 448-511, copied as bf16 straight to its place) for an fp16 tile: thread t's
// 16-byte chunks t + kThreads i from bf16 to fp16 in place (nothing to do for bf16).
template <typename Element, int kThreads>
__device__ __forceinline__ void mqa512_convert_tail_block(char* tile, int t) {
  if constexpr (!std::is_same_v<Element, __nv_bfloat16>) {
#pragma unroll 2
    for (int i = 0; i < 512 / kThreads; ++i) {
      uint4* chunk = reinterpret_cast<uint4*>(tile) + t + kThreads * i;
      *chunk = kv_tail8<Element>(*chunk);
    }
  }
}

}  // namespace dsv4
