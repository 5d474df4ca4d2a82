// Gather microbenchmark (build.sh -> bin/gather_bench): each warp copies 64 random rows x 256 B
// (two 128-byte blocks per row) of a 2048-row x 1 KB table into shared memory with 16-byte
// cp.async, as the head_dim-512 producer's CSA gather does, and reports the cycles per 16 KB
// half-stage per warp alone on an SM and on all of them; then, from a 16 MB table, the rates
// on every SM with more warps an SM than the kernel has (the ceiling of a gather from L2).
// Modes 0-2 use the producer's first lane map (16 lanes per row, one shuffled index per copy):
// 0 plain cp.async.cg, 1 with the L2::256B prefetch hint, 2 with it and an evict_last cache
// policy. Mode 3 is the producer's lane map now (8 lanes per 128-byte block row, 16 rows per
// lane, unrolled). Mode 4 copies whole 1 KB rows by bulk copies (cp.async.bulk, no swizzle).
#include "common.cuh"
#include "ptx/cp_async.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/tma.cuh"

constexpr int kRows = 64, kRowElems = 512, kHalfBytes = kRows * 256;

template <int kMode>
__device__ __forceinline__ void copy16(uint32_t dst, const void* src, uint64_t policy) {
  if (kMode == 0) {
    dsv4::ptx::cp_async_16_zfill(dst, src, true);  // the producer's copy
  } else if (kMode == 1) {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, 16;" ::"r"(dst), "l"(src)
                 : "memory");
  } else {
    asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::256B [%0], [%1], 16, 16, %2;"
                 ::"r"(dst), "l"(src), "l"(policy) : "memory");
  }
}

// Each warp gathers `iters` half-stages into its own 16 KB, as the producer does: lane l holds
// the list entries of rows l and l + 32, and the copies land in the 128-byte-swizzled layout a
// TMA box would write.
template <int kMode, int kWarps>
__global__ void __launch_bounds__(32 * kWarps)
    gather(const uint16_t* table, int table_rows, const int* lists, int iters, long long* cycles) {
  extern __shared__ __align__(1024) uint8_t smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  const uint32_t tile = dsv4::ptx::smem_addr(smem + warp * kHalfBytes);
  if (kMode == 4 && lane == 0) {
    dsv4::ptx::mbarrier_init(dsv4::ptx::smem_addr(smem + kWarps * kHalfBytes + 8 * warp), 1);
    dsv4::ptx::fence_barrier_init();
  }
  __syncwarp();
  const long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
    const int* list = lists + ((blockIdx.x * kWarps + warp) * kRows + it * 131) % (1 << 20);
    const int lo = list[lane] % table_rows, hi = list[lane + 32] % table_rows;
    if constexpr (kMode == 4) {
      // Not the kernel's layout (no swizzle): whole 1 KB rows by bulk copies, lane 0 issuing
      // 16 of them, the same bytes as a half. The rate of L2 to shared memory without cp.async.
      const uint32_t bar = dsv4::ptx::smem_addr(smem + kWarps * kHalfBytes + 8 * warp);
      if (lane == 0) {
        dsv4::ptx::mbarrier_arrive_expect_tx(bar, kHalfBytes);
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          const int src_row = list[i] % table_rows;
          dsv4::ptx::bulk_load(tile + 1024 * i, table + static_cast<long long>(src_row) * kRowElems,
                               1024, bar);
        }
        dsv4::ptx::mbarrier_wait(bar, it & 1);
      }
    } else if constexpr (kMode == 3) {
      // Lane 8 q + part copies 16-byte part `part` of rows q + 4 i in both blocks.
      const int part = lane % 8, row_sub = lane / 8;
      const uint32_t dst_even = tile + row_sub * 128 + ((part ^ row_sub) << 4);
      const uint32_t dst_odd = tile + row_sub * 128 + ((part ^ (row_sub + 4)) << 4);
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const int src_row = __shfl_sync(0xffffffff, i < 8 ? lo : hi, (row_sub + 4 * i) % 32);
        const uint16_t* src = table + static_cast<long long>(src_row) * kRowElems + part * 8;
        const uint32_t dst = (i % 2 ? dst_odd : dst_even) + 512 * i;
        dsv4::ptx::cp_async_16_zfill(dst, src, true);
        dsv4::ptx::cp_async_16_zfill(dst + kRows * 128, src + 128, true);
      }
    } else {
      const int block = 2 * ((lane % 16) / 8), part = lane % 8;
#pragma unroll 2
      for (int row0 = 0; row0 < kRows; row0 += 2) {
        const int row = row0 + lane / 16;
        const int src_row = __shfl_sync(0xffffffff, row0 < 32 ? lo : hi, row % 32);
        const uint16_t* src = table + static_cast<long long>(src_row) * kRowElems;
        const uint32_t dst =
            tile + (block / 2) * (kRows * 128) + row * 128 + ((part ^ (row % 8)) << 4);
        copy16<kMode>(dst, src + block * 64 + part * 8, policy);
      }
    }
    dsv4::ptx::cp_async_wait_all();
    __syncwarp();
  }
  if (lane == 0) cycles[blockIdx.x * kWarps + warp] = clock64() - t0;
}

template <int kMode, int kWarps>
int run(const uint16_t* table, int table_rows, const int* lists, long long* cycles, int iters,
        int ctas) {
  auto kernel = gather<kMode, kWarps>;
  const int smem = kWarps * kHalfBytes + 8 * kWarps;  // + mode 4's barriers
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  double mean;
  const float ms = time_warp_spans(
      [&] { kernel<<<ctas, 32 * kWarps, smem>>>(table, table_rows, lists, iters, cycles); },
      cycles, size_t(ctas) * kWarps, mean);
  const double bytes = static_cast<double>(ctas) * kWarps * iters * kHalfBytes;
  printf("mode %d, %5d-row table, %d warps per CTA, %3d CTAs: %.0f cycles per 16 KB half (%.1f B/clk per warp), "
         "%.0f GB/s in all\n",
         kMode, table_rows, kWarps, ctas, mean / iters, kHalfBytes / (mean / iters), bytes / ms / 1e6);
  return 0;
}

int main() {
  uint16_t* table;
  int* lists;
  long long* cycles;
  // 16,384 rows (16 MB) is the compressed KV of a CSA layer at 64k context; both fit in L2.
  constexpr int kSmallTable = 2048, kLargeTable = 16384;
  CK(cudaMalloc(&table, kLargeTable * kRowElems * 2));
  CK(cudaMemset(table, 1, kLargeTable * kRowElems * 2));
  std::vector<int> host_lists(1 << 20);
  unsigned x = 12345;
  for (int& v : host_lists) {
    x = x * 1664525u + 1013904223u;
    v = static_cast<int>(x >> 8);
  }
  CK(cudaMalloc(&lists, host_lists.size() * 4 + 4096));  // + the last warp's overrun
  CK(cudaMemcpy(lists, host_lists.data(), host_lists.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMalloc(&cycles, 3 * 132 * 8 * 8));
  const int t = kSmallTable;
  for (int ctas : {1, 132}) {
    if (run<0, 1>(table, t, lists, cycles, 200, ctas) || run<3, 1>(table, t, lists, cycles, 200, ctas) ||
        run<0, 2>(table, t, lists, cycles, 200, ctas) || run<3, 2>(table, t, lists, cycles, 200, ctas) ||
        run<0, 4>(table, t, lists, cycles, 200, ctas) || run<3, 4>(table, t, lists, cycles, 200, ctas) ||
        run<1, 2>(table, t, lists, cycles, 200, ctas) || run<2, 4>(table, t, lists, cycles, 200, ctas)) {
      return 1;
    }
  }
  // The ceiling of the gather on every SM at once: the producer's lane map, more warps (and
  // CTAs) per SM than the kernel has, the 16 MB table.
  const int big = kLargeTable;
  for (int ctas : {132, 264, 396}) {
    if (run<3, 2>(table, big, lists, cycles, 400, ctas) || run<3, 4>(table, big, lists, cycles, 400, ctas) ||
        run<4, 4>(table, big, lists, cycles, 400, ctas) ||
        (ctas == 132 && run<3, 8>(table, big, lists, cycles, 400, ctas))) {
      return 1;
    }
  }
  return 0;
}
