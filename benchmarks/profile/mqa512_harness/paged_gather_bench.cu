// The paged producer's gather alone (build.sh -> bin/paged_gather_bench): how long a warp takes
// to copy an 8 KB half (two 64-byte blocks of 64 records of 576 bytes) from DRAM into shared
// memory by 16-byte cp.async, and the bytes a second on every SM. A group of four warps shares
// each key tile's 64 rows (random, from 2 GB of records; no tile read twice), warp w taking
// the blocks of half w / 2, as the producer's four warps do. Lane maps:
//   0  the producer's: lane 4q + part copies 16 B of rows q + 8i, blocks 128 bytes apart
//   1  the same map, the warp's two blocks adjacent (64 bytes apart)
//   2  8 lanes a row's 128 contiguous bytes (both blocks), 4 rows a copy
//   3, 4  map 0 with cp.async's L2 prefetch hint, .L2::256B and .L2::128B: the aligned block
//      around each copy comes into L2, so the record's other pieces (the other warps') hit
#include "common.cuh"
#include "ptx/cp_async.cuh"
#include "ptx/mbarrier.cuh"

constexpr int kRecord = 576, kHalf = 8192, kListLen = 1 << 22;

// A 16-byte cp.async with L2 prefetch size kPrefetch (0: none).
template <int kPrefetch>
__device__ __forceinline__ void copy16(uint32_t dst, const void* src) {
  if constexpr (kPrefetch == 256) {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(dst), "l"(src)
                 : "memory");
  } else if constexpr (kPrefetch == 128) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;" ::"r"(dst), "l"(src)
                 : "memory");
  } else {
    dsv4::ptx::cp_async_16_zfill(dst, src, true);
  }
}

template <int kMap>
__global__ void gather(const uint8_t* table, const int* lists, int iters, long long* cycles) {
  extern __shared__ __align__(1024) uint8_t smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const uint32_t base = dsv4::ptx::smem_addr(smem + warp * 2 * kHalf);
  const int half = (warp % 4) / 2, sub = warp % 2;
  // Where this warp's first block starts in a record; its second is `apart` bytes further.
  constexpr bool kProducerMap = kMap == 0 || kMap >= 3;
  constexpr int kPrefetch = kMap == 3 ? 256 : kMap == 4 ? 128 : 0;
  const int col = kProducerMap ? (4 * half + sub) * 64 : (4 * half + 2 * sub) * 64;
  const int apart = kProducerMap ? 128 : 64;
  const long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
    const long long tile_index = static_cast<long long>(blockIdx.x * (warps / 4) + warp / 4) * iters + it;
    const int* list = lists + (tile_index * 64) % (kListLen - 64);
    const int lo = list[lane], hi = list[lane + 32];
    const uint32_t tile = base + (it & 1) * kHalf;
    if constexpr (kMap == 2) {
      const int part = lane % 8, q = lane / 8;
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const int row = q + 4 * i;
        const int r = __shfl_sync(0xffffffff, i < 8 ? lo : hi, row % 32);
        dsv4::ptx::cp_async_16_zfill(tile + (part / 4) * 4096 + row * 64 + (part % 4) * 16,
                                     table + static_cast<long long>(r) * kRecord + col + part * 16,
                                     true);
      }
    } else {
      const int part = lane % 4, q = lane / 4;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int row = q + 8 * i;
        const int r = __shfl_sync(0xffffffff, i < 4 ? lo : hi, row % 32);
        const uint8_t* src = table + static_cast<long long>(r) * kRecord + col + part * 16;
#pragma unroll
        for (int b = 0; b < 2; ++b) {
          copy16<kPrefetch>(tile + b * 4096 + row * 64 + part * 16, src + apart * b);
        }
      }
    }
    dsv4::ptx::cp_async_wait_all();
    __syncwarp();
  }
  if (lane == 0) cycles[blockIdx.x * warps + warp] = clock64() - t0;
}

template <int kMap>
void run(const uint8_t* table, const int* lists, long long* cycles, int warps, int ctas) {
  const int iters = std::min(40, int((kListLen - 64) / (64LL * ctas * std::max(warps / 4, 1))));
  const int smem = warps * 2 * kHalf;
  CK(cudaFuncSetAttribute(gather<kMap>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  double mean;
  const float ms = time_warp_spans(
      [&] { gather<kMap><<<ctas, 32 * warps, smem>>>(table, lists, iters, cycles); }, cycles,
      size_t(ctas) * warps, mean);
  const double bytes = double(ctas) * warps * iters * kHalf;
  printf("map %d: %2d warps an SM, %3d CTAs: %5.0f cycles a half (%4.1f B/clk a warp, %4.1f an SM), "
         "%5.0f GB/s\n", kMap, warps, ctas, mean / iters, kHalf / (mean / iters),
         warps * kHalf / (mean / iters), bytes / ms / 1e6);
}

int main() {
  const long long rows = (2ll << 30) / kRecord;
  uint8_t* table;
  int* lists;
  long long* cycles;
  int sms;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaMalloc(&table, rows * kRecord));
  CK(cudaMemset(table, 1, rows * kRecord));
  std::vector<int> h(kListLen);
  unsigned x = 12345;
  for (int& v : h) {
    x = x * 1664525u + 1013904223u;
    v = static_cast<int>(static_cast<unsigned long long>(x) * rows >> 32);
  }
  CK(cudaMalloc(&lists, h.size() * 4));
  CK(cudaMemcpy(lists, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMalloc(&cycles, sms * 8 * 8));
  run<0>(table, lists, cycles, 4, 1);  // one CTA alone
  for (int warps : {4, 8}) {
    run<0>(table, lists, cycles, warps, sms);
    run<1>(table, lists, cycles, warps, sms);
    run<2>(table, lists, cycles, warps, sms);
    run<3>(table, lists, cycles, warps, sms);
    run<4>(table, lists, cycles, warps, sms);
  }
  return 0;
}
