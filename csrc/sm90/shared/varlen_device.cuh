// Device helpers of the varlen work schedules (csrc/sm90/shared/varlen_schedule.cuh) that the
// kernels reading a schedule share: CTA-wide scans and the flat-index -> sequence lookup.
#pragma once

namespace dsv4 {

constexpr int kVarlenScheduleThreads = 1024;
constexpr int kVarlenCostBuckets = 2 * kVarlenScheduleThreads;  // key tiles, the last one open

namespace varlen_detail {

// Exclusive prefix sum over the CTA of one value per thread; `total` gets the sum.
__device__ __forceinline__ int block_exclusive_scan(int value, int& total, int* warp_sums) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int inclusive = value;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const int other = __shfl_up_sync(0xffffffffu, inclusive, d);
    if (lane >= d) inclusive += other;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    int w = warp_sums[lane];  // kVarlenScheduleThreads / 32 == 32 warps
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int other = __shfl_up_sync(0xffffffffu, w, d);
      if (lane >= d) w += other;
    }
    warp_sums[lane] = w;
  }
  __syncthreads();
  const int before = (warp > 0 ? warp_sums[warp - 1] : 0) + inclusive - value;
  total = warp_sums[31];
  __syncthreads();  // warp_sums is reused by the next scan
  return before;
}

// A counting sort's bucket counts become each bucket's first slot, the highest bucket first:
// thread t owns buckets top - 2t and top - 2t - 1. The caller syncs before reading them.
__device__ __forceinline__ void buckets_to_first_slots(int* bucket_next, int* warp_sums) {
  static_assert(kVarlenCostBuckets == 2 * kVarlenScheduleThreads, "two buckets per thread");
  const int hi = kVarlenCostBuckets - 1 - 2 * threadIdx.x, lo = hi - 1;
  const int count_hi = bucket_next[hi], count_lo = bucket_next[lo];
  int total;
  const int before = block_exclusive_scan(count_hi + count_lo, total, warp_sums);
  bucket_next[hi] = before;
  bucket_next[lo] = before + count_hi;
}

// Writes every b in [0, batch) into order, the highest cost(b) first: a counting sort into
// kVarlenCostBuckets buckets, costs clamped into them, ties in atomic order. Every thread of
// the CTA calls it; order is visible to all of them when it returns.
template <typename Cost>
__device__ __forceinline__ void sort_most_first(int batch, const Cost& cost, int* bucket_next,
                                                int* warp_sums, int* order) {
  auto bucket = [&](int b) { return min(max(cost(b), 0), kVarlenCostBuckets - 1); };
  for (int i = threadIdx.x; i < kVarlenCostBuckets; i += kVarlenScheduleThreads) bucket_next[i] = 0;
  __syncthreads();
  for (int b = threadIdx.x; b < batch; b += kVarlenScheduleThreads) {
    atomicAdd(&bucket_next[bucket(b)], 1);
  }
  __syncthreads();
  buckets_to_first_slots(bucket_next, warp_sums);
  __syncthreads();
  for (int b = threadIdx.x; b < batch; b += kVarlenScheduleThreads) {
    order[atomicAdd(&bucket_next[bucket(b)], 1)] = b;
  }
  __syncthreads();
}

// The sequence that holds flat tile i: the last b with tile_start[b] <= i.
__device__ __forceinline__ int sequence_of(const int* tile_start, int batch, int i) {
  int lo = 0, hi = batch - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (tile_start[mid] <= i) lo = mid; else hi = mid - 1;
  }
  return lo;
}

__device__ __forceinline__ int clamp_row(int v, int lo, int hi) { return min(max(v, lo), hi); }

}  // namespace varlen_detail

}  // namespace dsv4
