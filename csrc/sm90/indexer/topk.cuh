// The lightning indexer's top-k: one CTA per query of the chunk (or a warp, for short rows:
// indexer_topk_warp_kernel) reads the query's closed rows' scores from the workspace and writes
// its `topk` best rows, best first, ties to the lower row, -1 past the closed rows
// (dsv4_indexer_topk's contract).
//
// Scores become order-preserving 32-bit keys. A radix select over bits 31-20, 19-8 and 7-0
// finds the topk-th largest key T: the first pass is counted while the keys are read, then the
// rows of its chosen 12-bit bin (a few hundred) are compacted and the later passes read only
// them. The rows above T and the first rows equal to T (in row order) make the list, which a
// bitonic sort on (key, row) puts in order. The keys sit in shared memory when they fit
// (smem_keys), else every pass reads them from the workspace.
#pragma once

#include <cstdint>

#include "ptx/sync.cuh"
#include "sm90/indexer/params.h"
#include "sm90/indexer/work.cuh"

namespace dsv4 {

struct IndexerTopkTraits {
  static constexpr int kThreads = 512;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kMaxTopk = kIndexerMaxTopk;
  static constexpr int kBins = 8 * kThreads;  // 12-bit radix digits
  static constexpr int kCandidates = 2048;    // rows of the first pass's bin, compacted
};

// Larger scores give larger keys; -0 ranks as +0 (equal scores tie on the row).
__device__ __forceinline__ uint32_t indexer_score_key(float x) {
  uint32_t u = __float_as_uint(x);
  if (u == 0x80000000u) u = 0;
  // Negative: all bits flipped; else the sign bit set.
  return u ^ (static_cast<uint32_t>(static_cast<int32_t>(u) >> 31) | 0x80000000u);
}

// Ascending order of (~key, row) is best first, ties to the lower row.
__device__ __forceinline__ uint64_t indexer_rank_key(uint32_t key, int row) {
  return (static_cast<uint64_t>(~key) << 32) | static_cast<uint32_t>(row);
}

// Element i of a key list: row i, or row rows[i] of a compacted list.
struct IndexerKeys {
  const uint32_t* staged;  // or nullptr: read the scores
  const float* scores;
  const int* rows;         // or nullptr
  __device__ __forceinline__ int row(int i) const { return rows != nullptr ? rows[i] : i; }
  __device__ __forceinline__ uint32_t operator()(int i) const {
    const int r = row(i);
    return staged != nullptr ? staged[r] : indexer_score_key(scores[r]);
  }
};

struct alignas(16) IndexerSelectShared {
  uint64_t list[IndexerTopkTraits::kMaxTopk];
  uint32_t hist[IndexerTopkTraits::kBins];
  int candidates[IndexerTopkTraits::kCandidates];
  uint32_t warp_sum[IndexerTopkTraits::kWarps];
  int bin, need, bin_count, listed, compacted;
};

// Adds the keys whose higher bits are `prefix` to the histogram of bits [shift, shift + bits).
__device__ __forceinline__ void indexer_count(uint32_t u, uint32_t prefix, uint32_t mask, int shift,
                                              int bits, IndexerSelectShared& sh) {
  if ((u & mask) == prefix) atomicAdd(&sh.hist[(u >> shift) & ((1u << bits) - 1)], 1u);
}

// Thread t owns bins [8t, 8t + 8): two 16-byte words.
static_assert(IndexerTopkTraits::kBins == 8 * IndexerTopkTraits::kThreads, "8 bins a thread");

__device__ __forceinline__ void indexer_clear_histogram(IndexerSelectShared& sh) {
  uint4* bins = reinterpret_cast<uint4*>(sh.hist) + 2 * threadIdx.x;
  bins[0] = bins[1] = make_uint4(0, 0, 0, 0);
}

// The bin of the histogram holding the need-th largest key (sh.bin; sh.need: how many to take
// from it; sh.bin_count). Thread t owns bins [8t, 8t + 8): a block-wide suffix sum finds it,
// and only the thread whose bins hold it searches them.
__device__ __forceinline__ void indexer_find_bin(int need, IndexerSelectShared& sh) {
  using T = IndexerTopkTraits;
  static_assert(T::kWarps <= 32, "one lane a warp sum");
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const uint4* bins = reinterpret_cast<const uint4*>(sh.hist) + 2 * tid;
  const uint4 b0 = bins[0], b1 = bins[1];
  const uint32_t local[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
  uint32_t sum = 0;
#pragma unroll
  for (int e = 0; e < 8; ++e) sum += local[e];
  uint32_t from_here = sum;  // this thread's bins and the warp's higher ones
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const uint32_t v = __shfl_down_sync(0xffffffffu, from_here, off);
    if (lane + off < 32) from_here += v;
  }
  if (lane == 0) sh.warp_sum[warp] = from_here;
  __syncthreads();
  uint32_t higher = lane > warp && lane < T::kWarps ? sh.warp_sum[lane] : 0;  // the warps above
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) higher += __shfl_xor_sync(0xffffffffu, higher, off);
  uint32_t above = from_here - sum + higher;
  const uint32_t un = static_cast<uint32_t>(need);
  if (above < un && above + sum >= un) {
#pragma unroll
    for (int e = 7; e >= 0; --e) {
      if (above < un && above + local[e] >= un) {
        sh.bin = 8 * tid + e;
        sh.need = need - static_cast<int>(above);
        sh.bin_count = static_cast<int>(local[e]);
      }
      above += local[e];
    }
  }
  __syncthreads();
}

// One radix pass over keys[0, n): the histogram of bits [shift, shift + bits) of the keys whose
// higher bits are `prefix`, then its bin holding the need-th largest.
__device__ __forceinline__ void indexer_radix_pass(IndexerKeys keys, int n, uint32_t prefix,
                                                   uint32_t mask, int shift, int bits, int need,
                                                   IndexerSelectShared& sh) {
  indexer_clear_histogram(sh);
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += IndexerTopkTraits::kThreads) {
    indexer_count(keys(i), prefix, mask, shift, bits, sh);
  }
  __syncthreads();
  indexer_find_bin(need, sh);
}

// The first pass's bits: 31-20 into 4096 bins.
constexpr int kIndexerFirstShift = 20, kIndexerFirstBits = 12;

// The list for n > topk rows: those above the topk-th largest key T, then the first rows equal
// to T in row order (all of them, in any order, where exactly the needed number are equal).
// The histogram of the first pass is already counted (sh.hist, with sh.listed and
// sh.compacted zero), while the keys were staged.
__device__ __forceinline__ void indexer_select(IndexerKeys all, int n, int topk,
                                               IndexerSelectShared& sh) {
  using T = IndexerTopkTraits;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  indexer_find_bin(topk, sh);
  const uint32_t top_bin = static_cast<uint32_t>(sh.bin);
  int need = sh.need;
  const int in_bin = sh.bin_count;
  uint32_t prefix = top_bin << kIndexerFirstShift, mask = 0xFFF00000u;
  IndexerKeys keys = all;
  int m = n;
  if (in_bin <= T::kCandidates) {  // list the rows above the bin; the later passes read its rows
    const auto list = [&](uint32_t u, int i) {
      const uint32_t digit = u >> kIndexerFirstShift;
      if (digit > top_bin) {
        sh.list[atomicAdd(&sh.listed, 1)] = indexer_rank_key(u, i);
      } else if (digit == top_bin) {
        sh.candidates[atomicAdd(&sh.compacted, 1)] = i;
      }
    };
    if (all.staged != nullptr) {  // four keys a load; most fours lie wholly below the bin
      const int whole = n & ~3;
      for (int i = 4 * tid; i < whole; i += 4 * T::kThreads) {
        const uint4 u = *reinterpret_cast<const uint4*>(all.staged + i);
        if (max(max(u.x, u.y), max(u.z, u.w)) >> kIndexerFirstShift < top_bin) continue;
        list(u.x, i);
        list(u.y, i + 1);
        list(u.z, i + 2);
        list(u.w, i + 3);
      }
      if (whole + tid < n) list(all.staged[whole + tid], whole + tid);
    } else {
      for (int i = tid; i < n; i += T::kThreads) list(all(i), i);
    }
    __syncthreads();
    keys.rows = sh.candidates;
    m = in_bin;
  }
  indexer_radix_pass(keys, m, prefix, mask, 8, 12, need, sh);
  prefix |= static_cast<uint32_t>(sh.bin) << 8;
  mask |= 0xFFFu << 8;
  need = sh.need;
  __syncthreads();  // sh.bin is rewritten by the next pass
  indexer_radix_pass(keys, m, prefix, mask, 0, 8, need, sh);
  const uint32_t threshold = prefix | static_cast<uint32_t>(sh.bin);
  need = sh.need;
  const bool take_equal = sh.bin_count == need;
  for (int i = tid; i < m; i += T::kThreads) {
    const uint32_t u = keys(i);
    if (u > threshold || (take_equal && u == threshold)) {
      sh.list[atomicAdd(&sh.listed, 1)] = indexer_rank_key(u, keys.row(i));
    }
  }
  if (take_equal) return;
  // More rows equal T than the list takes: the first `need` of them, in row order.
  const int first_equal = topk - need;
  for (int base = 0, taken = 0; base < n && taken < need; base += T::kThreads) {
    const int i = base + tid;
    const bool is_equal = i < n && all(i) == threshold;
    const uint32_t ballot = __ballot_sync(0xffffffffu, is_equal);
    if (lane == 0) sh.warp_sum[warp] = __popc(ballot);
    __syncthreads();
    int before = 0, total = 0;
#pragma unroll
    for (int w = 0; w < T::kWarps; ++w) {
      before += w < warp ? static_cast<int>(sh.warp_sum[w]) : 0;
      total += static_cast<int>(sh.warp_sum[w]);
    }
    const int rank = taken + before + __popc(ballot & ((1u << lane) - 1));
    if (is_equal && rank < need) sh.list[first_equal + rank] = indexer_rank_key(threshold, i);
    taken += total;
    __syncthreads();
  }
}

// Ascending bitonic sort of list[0, count) for count <= 128 * kWarps by the first kWarps warps,
// four entries a thread in registers (thread t: entries 4t to 4t + 3), whose rows it then
// writes to out[0, count). Partners in one thread compare in place, in one warp through
// shuffles, farther ones through shared memory (named barrier 1). Each pair is compared once,
// not by both partners, and a stage takes the warps that hold the list, not all sixteen. The
// rows leave from registers: nothing reads the list after the sort, so no CTA-wide barrier
// follows it.
template <int kWarps>
__device__ __forceinline__ void indexer_sort_and_write(IndexerSelectShared& sh, int count,
                                                       int32_t* out) {
  constexpr int kPerThread = 4, kThreads = 32 * kWarps, kSize = kPerThread * kThreads;
  constexpr uint32_t kBarrier = 1;
  static_assert(kSize <= IndexerTopkTraits::kMaxTopk && kThreads <= IndexerTopkTraits::kThreads,
                "the list and the CTA hold it");
  const int t = threadIdx.x;
  uint64_t v[kPerThread];
  const auto load = [&](int thread) {  // two 16-byte words
    const ulonglong2* from = reinterpret_cast<const ulonglong2*>(sh.list + kPerThread * thread);
    const ulonglong2 a = from[0], b = from[1];
    v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
  };
  load(t);
#pragma unroll
  for (int e = 0; e < kPerThread; ++e) {
    if (kPerThread * t + e >= count) v[e] = ~0ull;  // padding sorts last
  }
#pragma unroll
  for (int k = 2; k <= kSize; k <<= 1) {
#pragma unroll
    for (int j = k >> 1; j > 0; j >>= 1) {
      if (j < kPerThread) {
#pragma unroll
        for (int e = 0; e < kPerThread; ++e) {
          if ((e & j) != 0) continue;
          const bool up = ((kPerThread * t + e) & k) == 0;
          const uint64_t a = v[e], b = v[e | j];
          const bool swap = (a > b) == up;
          v[e] = swap ? b : a;
          v[e | j] = swap ? a : b;
        }
        continue;
      }
      // Partner thread t ^ tj holds the same e; k > j >= 4, so all four share one direction.
      const int tj = j / kPerThread;
      const bool take_min = ((t & tj) == 0) == (((kPerThread * t) & k) == 0);
      uint64_t other[kPerThread];
      if (tj < 32) {
#pragma unroll
        for (int e = 0; e < kPerThread; ++e) other[e] = __shfl_xor_sync(0xffffffffu, v[e], tj);
      } else {
        ptx::named_barrier_sync(kBarrier, kThreads);  // the list and the last exchange are read
        ulonglong2* to = reinterpret_cast<ulonglong2*>(sh.list + kPerThread * t);
        to[0] = make_ulonglong2(v[0], v[1]);
        to[1] = make_ulonglong2(v[2], v[3]);
        ptx::named_barrier_sync(kBarrier, kThreads);
        const uint64_t mine[kPerThread] = {v[0], v[1], v[2], v[3]};
        load(t ^ tj);
#pragma unroll
        for (int e = 0; e < kPerThread; ++e) {
          other[e] = v[e];
          v[e] = mine[e];
        }
      }
#pragma unroll
      for (int e = 0; e < kPerThread; ++e) {
        const bool less = v[e] < other[e];
        v[e] = less == take_min ? v[e] : other[e];
      }
    }
  }
#pragma unroll
  for (int e = 0; e < kPerThread; ++e) {
    const int i = kPerThread * t + e;
    if (i < count) out[i] = static_cast<int32_t>(static_cast<uint32_t>(v[e]));
  }
}

// out[0, topk): the rows of list[0, count) (count <= kMaxTopk), best first, sorted by as few
// warps as hold them, then -1.
__device__ __forceinline__ void indexer_write_sorted(IndexerSelectShared& sh, int count, int topk,
                                                     int32_t* out) {
  static_assert(IndexerTopkTraits::kMaxTopk == 128 * 16, "16 warps hold the longest list");
  const int warps_needed = count <= 512 ? 4 : count <= 1024 ? 8 : 16;
  if (static_cast<int>(threadIdx.x) < 32 * warps_needed) {
    if (warps_needed == 4) {
      indexer_sort_and_write<4>(sh, count, out);
    } else if (warps_needed == 8) {
      indexer_sort_and_write<8>(sh, count, out);
    } else {
      indexer_sort_and_write<16>(sh, count, out);
    }
  }
  for (int i = count + threadIdx.x; i < topk; i += IndexerTopkTraits::kThreads) out[i] = -1;
}

// A workspace row of the chunk and its query: the closed rows' scores and the query's output.
struct IndexerTopkRow {
  const float* scores;
  int n;  // closed rows
  int32_t* out;
};

// Row `slot` of the chunk, or false past the chunk's queries.
__device__ __forceinline__ bool indexer_topk_row(const IndexerParams& p, int slot,
                                                 IndexerTopkRow& row) {
  IndexerBlock blk;
  if (!indexer_block(p, slot / p.queries_per_block, blk)) return false;
  const int q = blk.first_query + slot % p.queries_per_block;
  if (q >= blk.seq_q) return false;
  row.scores = p.scores + static_cast<int64_t>(slot) * p.row_stride;
  row.n = indexer_visible_rows(indexer_position(p, blk, q), p.compress_ratio, blk.seq_c);
  row.out = p.out + (blk.token0 + q) * p.topk;
  return true;
}

// Grid: one CTA per workspace row of the chunk (chunk_blocks * queries_per_block). Shared
// memory allows kCtasPerSm CTAs an SM (launch.cu's choice: three where the rows stage at most
// kIndexerThreeCtaKeys keys, else two), and the registers are bounded to match (the default
// spills). Three where they fit: the top-k of a 32k prompt 1.40 -> 1.25 ms (topk_bench, H200);
// bounded for three, the longer rows were 1-2% slower than with two.
template <int kCtasPerSm>
__global__ void __launch_bounds__(IndexerTopkTraits::kThreads, kCtasPerSm)
    indexer_topk_kernel(const IndexerParams p) {
  using T = IndexerTopkTraits;
  extern __shared__ uint32_t staged[];
  __shared__ IndexerSelectShared sh;
  ptx::griddep_wait();  // queued behind the chunk's score kernel (launch.cu)
  IndexerTopkRow row;
  if (!indexer_topk_row(p, blockIdx.x, row)) return;
  const int n = row.n;
  const bool select = n > p.topk;
  const float* scores = row.scores;
  IndexerKeys keys{nullptr, scores, nullptr};
  // The first radix pass is counted as the keys are read (also where every row is listed and
  // the counts go unused: no per-key branch).
  indexer_clear_histogram(sh);
  if (threadIdx.x == 0) sh.listed = sh.compacted = 0;
  __syncthreads();
  const auto count_key = [&](uint32_t u) {
    indexer_count(u, 0, 0, kIndexerFirstShift, kIndexerFirstBits, sh);
  };
  if (n <= p.smem_keys) {  // whole float4s (rows are 256-byte aligned), then the last few
    const int whole = n & ~3;
    constexpr int kLoads = 4;  // float4s a thread has in flight
    for (int first = 4 * threadIdx.x; first < whole; first += 4 * T::kThreads * kLoads) {
      float4 v[kLoads];
#pragma unroll
      for (int b = 0; b < kLoads; ++b) {
        const int i = first + 4 * T::kThreads * b;
        if (i < whole) v[b] = *reinterpret_cast<const float4*>(scores + i);
      }
#pragma unroll
      for (int b = 0; b < kLoads; ++b) {
        const int i = first + 4 * T::kThreads * b;
        if (i >= whole) break;
        const uint4 u = make_uint4(indexer_score_key(v[b].x), indexer_score_key(v[b].y),
                                   indexer_score_key(v[b].z), indexer_score_key(v[b].w));
        *reinterpret_cast<uint4*>(staged + i) = u;
        count_key(u.x);
        count_key(u.y);
        count_key(u.z);
        count_key(u.w);
      }
    }
    const int i = whole + static_cast<int>(threadIdx.x);
    if (i < n) {
      staged[i] = indexer_score_key(scores[i]);
      count_key(staged[i]);
    }
    keys.staged = staged;
  } else if (select) {
    for (int i = threadIdx.x; i < n; i += T::kThreads) count_key(keys(i));
  }
  __syncthreads();
  int count = n;
  if (!select) {
    for (int i = threadIdx.x; i < n; i += T::kThreads) sh.list[i] = indexer_rank_key(keys(i), i);
  } else {
    indexer_select(keys, n, p.topk, sh);
    count = p.topk;
  }
  __syncthreads();
  indexer_write_sorted(sh, count, p.topk, row.out);
}

// Short rows (at most kIndexerWarpTopkRows closed rows, topk at most kIndexerWarpTopkMax), many
// of them: a warp per query, one to a CTA, without the block-wide barriers, 4096-bin scans and
// fixed costs that indexer_topk_kernel pays per query. The same list: a radix select over four
// 8-bit digits on the warp's own histogram, the rows above T and the first rows equal to T in
// row order (by ballots), and a stable radix sort of that list by key (the order of (key, row)).
struct IndexerWarpTopkTraits {
  // One warp a CTA: each row's slot frees as soon as it is done (eight to a CTA: an 8k
  // prompt's top-k 0.189 -> 0.174 ms, topk_bench, H200, the same picks).
  static constexpr int kWarps = 1;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kBins = 256;  // 8-bit radix digits: 8 a lane
  struct Shared {
    uint32_t keys[kIndexerWarpTopkRows];
    uint64_t list[kIndexerWarpTopkMax];
    uint32_t hist[kBins];
  };
  static constexpr int kSmemBytes = kWarps * static_cast<int>(sizeof(Shared));
};

// The topk-th largest key T of keys[0, n) for n > topk; need: how many rows equal to T the list
// takes.
__device__ __forceinline__ uint32_t indexer_warp_select(IndexerWarpTopkTraits::Shared& sh, int n,
                                                        int topk, int& need) {
  const int lane = threadIdx.x % 32;
  uint32_t prefix = 0, mask = 0;
  need = topk;
  for (int shift = 24; shift >= 0; shift -= 8) {
#pragma unroll
    for (int e = 0; e < 8; ++e) sh.hist[8 * lane + e] = 0;
    __syncwarp();
    const auto count = [&](uint32_t u) {
      if ((u & mask) == prefix) atomicAdd(&sh.hist[(u >> shift) & 255u], 1u);
    };
    const int whole = n & ~3;  // four keys a load, then the last few
    for (int i = 4 * lane; i < whole; i += 128) {
      const uint4 u = *reinterpret_cast<const uint4*>(sh.keys + i);
      count(u.x);
      count(u.y);
      count(u.z);
      count(u.w);
    }
    if (whole + lane < n) count(sh.keys[whole + lane]);
    __syncwarp();
    // Lane l owns bins [8l, 8l + 8): a suffix sum over the lanes finds the need-th largest.
    uint32_t local[8], sum = 0;
#pragma unroll
    for (int e = 0; e < 8; ++e) sum += local[e] = sh.hist[8 * lane + e];
    uint32_t from_here = sum;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const uint32_t v = __shfl_down_sync(0xffffffffu, from_here, off);
      if (lane + off < 32) from_here += v;
    }
    uint32_t above = from_here - sum;
    int bin = -1, bin_need = 0;
#pragma unroll
    for (int e = 7; e >= 0; --e) {
      const uint32_t un = static_cast<uint32_t>(need);
      if (above < un && above + local[e] >= un) {
        bin = 8 * lane + e;
        bin_need = need - static_cast<int>(above);
      }
      above += local[e];
    }
    const int src = __ffs(__ballot_sync(0xffffffffu, bin >= 0)) - 1;
    bin = __shfl_sync(0xffffffffu, bin, src);
    need = __shfl_sync(0xffffffffu, bin_need, src);
    prefix |= static_cast<uint32_t>(bin) << shift;
    mask |= 255u << shift;
  }
  return prefix;
}

// The list[0, count), in row order, best first: a stable radix sort by one warp over the four
// 8-bit digits of ~key, low to high, so that equal keys keep their row order (ties to the lower
// row, the order of (~key, row)). A pass whose digit all entries share is skipped. The keys'
// shared memory, no longer needed, is the second buffer.
__device__ __forceinline__ void indexer_warp_sort(IndexerWarpTopkTraits::Shared& sh, int count) {
  static_assert(sizeof(sh.keys) >= sizeof(sh.list), "the keys' memory holds a second list");
  const int lane = threadIdx.x % 32;
  const uint32_t lanes_before = (1u << lane) - 1;
  uint64_t* from = sh.list;
  uint64_t* to = reinterpret_cast<uint64_t*>(sh.keys);
  for (int shift = 32; shift < 64; shift += 8) {  // the rank key's upper half is ~key
#pragma unroll
    for (int e = 0; e < 8; ++e) sh.hist[8 * lane + e] = 0;
    __syncwarp();
    for (int i = lane; i < count; i += 32) atomicAdd(&sh.hist[(from[i] >> shift) & 255u], 1u);
    __syncwarp();
    // Lane l owns bins [8l, 8l + 8): their counts become the digits' first places.
    uint32_t local[8], sum = 0;
    bool one_digit = false;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      local[e] = sh.hist[8 * lane + e];
      sum += local[e];
      one_digit |= local[e] == static_cast<uint32_t>(count);
    }
    if (__any_sync(0xffffffffu, one_digit)) continue;  // the order stands
    uint32_t place = sum;  // inclusive prefix over the lanes
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const uint32_t v = __shfl_up_sync(0xffffffffu, place, off);
      if (lane >= off) place += v;
    }
    place -= sum;
    __syncwarp();
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      sh.hist[8 * lane + e] = place;
      place += local[e];
    }
    __syncwarp();
    for (int base = 0; base < count; base += 32) {  // in order, a lane per entry: stable
      const int i = base + lane;
      const bool valid = i < count;
      const uint64_t x = valid ? from[i] : 0;
      const uint32_t digit = valid ? static_cast<uint32_t>(x >> shift) & 255u : 256u + lane;
      const uint32_t peers = __match_any_sync(0xffffffffu, digit);
      const uint32_t rank = __popc(peers & lanes_before);
      const uint32_t first = valid ? sh.hist[digit] : 0;
      if (valid) to[first + rank] = x;
      __syncwarp();
      if (valid && rank == 0) sh.hist[digit] = first + __popc(peers);
      __syncwarp();
    }
    uint64_t* const t = from;
    from = to;
    to = t;
  }
  if (from != sh.list) {
    for (int i = lane; i < count; i += 32) sh.list[i] = from[i];
  }
  __syncwarp();
}

// Grid: one warp per workspace row of the chunk, kWarps to a CTA.
__global__ void __launch_bounds__(IndexerWarpTopkTraits::kThreads)
    indexer_topk_warp_kernel(const IndexerParams p) {
  using T = IndexerWarpTopkTraits;
  extern __shared__ uint8_t warp_smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  auto& sh = reinterpret_cast<T::Shared*>(warp_smem)[warp];
  const int slot = blockIdx.x * T::kWarps + warp;
  ptx::griddep_wait();  // queued behind the chunk's score kernel (launch.cu)
  IndexerTopkRow row;
  if (slot >= p.chunk_blocks * p.queries_per_block || !indexer_topk_row(p, slot, row)) return;
  const int n = min(row.n, kIndexerWarpTopkRows);  // the route keeps it so
  const int whole = n & ~3;  // whole float4s (rows are 256-byte aligned), then the last few
#pragma unroll 4
  for (int j = 0; j < kIndexerWarpTopkRows / 128; ++j) {
    const int i = 4 * lane + 128 * j;
    if (i < whole) {
      const float4 v = *reinterpret_cast<const float4*>(row.scores + i);
      *reinterpret_cast<uint4*>(sh.keys + i) =
          make_uint4(indexer_score_key(v.x), indexer_score_key(v.y), indexer_score_key(v.z),
                     indexer_score_key(v.w));
    }
  }
  if (whole + lane < n) sh.keys[whole + lane] = indexer_score_key(row.scores[whole + lane]);
  __syncwarp();
  int count = n;
  if (n <= p.topk) {
    for (int i = lane; i < n; i += 32) sh.list[i] = indexer_rank_key(sh.keys[i], i);
  } else {
    int need;
    const uint32_t threshold = indexer_warp_select(sh, n, p.topk, need);
    const uint32_t lanes_before = (1u << lane) - 1;
    int listed = 0, equal_seen = 0;
    for (int base = 0; base < n; base += 32) {  // in row order
      const int i = base + lane;
      const uint32_t u = i < n ? sh.keys[i] : 0;
      const bool is_equal = i < n && u == threshold;
      const uint32_t equal_lanes = __ballot_sync(0xffffffffu, is_equal);
      const bool take = (i < n && u > threshold) ||
                        (is_equal && equal_seen + __popc(equal_lanes & lanes_before) < need);
      const uint32_t take_lanes = __ballot_sync(0xffffffffu, take);
      if (take) sh.list[listed + __popc(take_lanes & lanes_before)] = indexer_rank_key(u, i);
      listed += __popc(take_lanes);
      equal_seen += __popc(equal_lanes);
    }
    count = p.topk;
  }
  __syncwarp();
  indexer_warp_sort(sh, count);
  for (int i = lane; i < p.topk; i += 32) {
    row.out[i] = i < count ? static_cast<int32_t>(static_cast<uint32_t>(sh.list[i])) : -1;
  }
}

}  // namespace dsv4
