// What the indexer harnesses share (topk_bench.cu, score_bench.cu): CUDA error checks, a
// normal draw by index, and csrc/sm90/indexer/api.cpp's plan of a dense call of one sequence
// (64 heads, ratio 4) with the top-k kernel its launch.cu would take.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "sm90/indexer/params.h"
#include "sm90/indexer/topk.cuh"

#define CHECK(x)                                                                        \
  do {                                                                                  \
    cudaError_t e = (x);                                                                \
    if (e != cudaSuccess) {                                                             \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      exit(1);                                                                          \
    }                                                                                   \
  } while (0)

namespace harness {

// Element i of N(0, 1) draws under `seed` (splitmix64 and Box-Muller).
__device__ inline float normal(uint64_t i, uint64_t seed) {
  auto mix = [](uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  const uint64_t a = mix(i * 2 + seed), b = mix(i * 2 + 1 + seed);
  const float u1 = ((a >> 40) + 1) * (1.0f / 16777217.0f), u2 = (b >> 40) * (1.0f / 16777216.0f);
  return sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
}

// api.cpp's plan for one dense sequence of S queries over Sc compressed rows, 64 heads.
struct DensePlan {
  int heads = 64, ratio = 4;
  int queries_per_block, total_blocks, buffers, num_chunks, chunk_blocks, splits, smem_keys;
  int64_t row_stride;
  int rows() const { return chunk_blocks * queries_per_block; }  // a chunk's top-k rows
  int64_t chunk_floats() const { return int64_t(rows()) * row_stride; }
  // The warp top-k where a warp's list fits (the plan also asks for four rows an SM, which
  // the harnesses' prompts have).
  bool warp_topk(int topk) const {
    return row_stride <= dsv4::kIndexerWarpTopkRows && topk <= dsv4::kIndexerWarpTopkMax;
  }
};

inline DensePlan dense_plan(int S, int Sc) {
  using namespace dsv4;
  DensePlan d;
  d.queries_per_block = kIndexerConsumers * kIndexerColumns / d.heads;
  d.total_blocks = (S + d.queries_per_block - 1) / d.queries_per_block;
  d.row_stride = (int64_t(Sc) + 63) / 64 * 64;
  const IndexerChunks c =
      indexer_chunks(d.total_blocks, int64_t(d.queries_per_block) * d.row_stride * 4);
  d.buffers = c.buffers;
  d.num_chunks = c.num_chunks;
  d.chunk_blocks = c.chunk_blocks;
  d.splits = static_cast<int>((d.row_stride / 64 + kIndexerTilesPerSplit - 1) /
                              kIndexerTilesPerSplit);
  d.smem_keys = std::min<int>(Sc, kIndexerKeyCapacity);
  return d;
}

// The plain fields of IndexerParams for the plan (launch.cu's common_params); positions are
// int32 (1, S), out (S, topk).
inline dsv4::IndexerParams dense_params(const DensePlan& d, int S, int Sc, int topk,
                                        const int32_t* positions, int32_t* out) {
  dsv4::IndexerParams p{};
  p.positions = positions;
  p.pos_stride_b = S;
  p.pos_stride_s = 1;
  p.row_stride = d.row_stride;
  p.out = out;
  p.seq_q = S;
  p.seq_c = Sc;
  p.heads = d.heads;
  p.topk = topk;
  p.compress_ratio = d.ratio;
  while ((8 << p.head_levels) < d.heads) ++p.head_levels;
  p.queries_per_block = d.queries_per_block;
  p.blocks_per_seq = d.total_blocks;
  p.total_blocks = d.total_blocks;
  p.num_chunks = d.num_chunks;
  p.chunk_blocks = d.chunk_blocks;
  p.smem_keys = d.smem_keys;
  return p;
}

// The CTA top-k instantiation launch.cu takes for the plan; raises the shared-memory limits of
// both CTA instantiations and of the warp kernel.
inline void (*cta_topk_kernel(const DensePlan& d))(const dsv4::IndexerParams) {
  using namespace dsv4;
  CHECK(cudaFuncSetAttribute(indexer_topk_kernel<2>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             kIndexerKeyCapacity * 4));
  CHECK(cudaFuncSetAttribute(indexer_topk_kernel<3>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             kIndexerThreeCtaKeys * 4));
  CHECK(cudaFuncSetAttribute(indexer_topk_warp_kernel,
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             IndexerWarpTopkTraits::kSmemBytes));
  return d.smem_keys <= kIndexerThreeCtaKeys ? indexer_topk_kernel<3> : indexer_topk_kernel<2>;
}

// The median of `reps` timed calls of `call`, in ms (the caller has warmed it up).
template <typename Call>
float median_ms(int reps, const Call& call) {
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  float* ms = new float[reps];
  for (int r = 0; r < reps; ++r) {
    CHECK(cudaEventRecord(e0));
    call();
    CHECK(cudaEventRecord(e1));
    CHECK(cudaEventSynchronize(e1));
    CHECK(cudaEventElapsedTime(&ms[r], e0, e1));
  }
  CHECK(cudaGetLastError());
  std::sort(ms, ms + reps);
  const float m = ms[reps / 2];
  delete[] ms;
  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
  return m;
}

}  // namespace harness
