// DeepSeek-V4's paged FP8 KV cache record (vLLM's fp8_ds_mla, FlashMLA's "MODEL1"), shared by
// the kernels and the reference path; no torch. README.md ("The paged FP8 KV cache") states it
// as the contract.
//
// A page of P rows is one block of block_stride bytes (P * 584 rounded up to a multiple of 576):
// P data rows of 576 bytes, then P scale rows of 8 bytes. Row r of block b has the global slot
// b * P + r.
//   data row:  448 float8_e4m3 (dims 0-447, 7 tiles of 64), then dims 448-511 as bf16
//   scale row: 7 UE8M0 bytes, tile t's scale 2^e stored as e + 127, then one zero byte
// with e = ceil(log2(max(amax_t, 1e-4) / 448)) for amax_t, tile t's largest |x| (fp32
// arithmetic: the quotient is rounded to fp32 first), and each fp8 value x / 2^e rounded to
// nearest even.
#pragma once

#include <cstdint>

#include "sm90/shared/host_device.h"

namespace dsv4 {

constexpr int kKvDims = 512;          // a row's dims
constexpr int kKvQuantDims = 448;     // the fp8 part
constexpr int kKvTileDims = 64;       // one scale per 64 dims
constexpr int kKvTiles = kKvQuantDims / kKvTileDims;  // 7
constexpr int kKvDataBytes = 576;     // 448 fp8 + 64 bf16
constexpr int kKvScaleBytes = 8;      // 7 UE8M0 + one zero byte
constexpr int kKvRecordBytes = kKvDataBytes + kKvScaleBytes;  // 584
constexpr float kKvFp8Max = 448.f;    // float8_e4m3's largest finite value
constexpr float kKvAmaxFloor = 1e-4f;

// A cache as the kernels address it.
struct KvCacheLayout {
  uint8_t* base;          // block 0
  int64_t num_blocks;
  int page_rows;          // P
  int64_t block_stride;   // bytes between blocks
};

// The padded bytes of a block of P rows.
inline constexpr int64_t kv_block_bytes(int64_t page_rows) {
  return (page_rows * kKvRecordBytes + kKvDataBytes - 1) / kKvDataBytes * kKvDataBytes;
}

// e = ceil(log2(max(amax, 1e-4) / 448)), exactly, from the bits of the fp32 quotient v (finite
// amax; v >= 2^-23 is a normal number): 1.m * 2^k gives k when m = 0, else k + 1.
DSV4_HOST_DEVICE inline int kv_scale_exponent(float amax) {
  const float v = (amax > kKvAmaxFloor ? amax : kKvAmaxFloor) / kKvFp8Max;
  uint32_t bits;
  __builtin_memcpy(&bits, &v, 4);
  return static_cast<int>((bits >> 23) & 0xff) - 127 + ((bits & 0x7fffff) != 0 ? 1 : 0);
}

}  // namespace dsv4
