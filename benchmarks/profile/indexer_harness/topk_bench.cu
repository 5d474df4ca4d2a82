// The indexer's top-k kernels alone, torch-free: the workspace of a dense causal call (one
// sequence of S queries, 64 heads, ratio 4) is filled with scores of a chosen distribution, its
// chunks planned as csrc/sm90/indexer/api.cpp plans them, and every chunk's top-k launched in
// turn, back to back on one stream (the real call overlaps them with the score kernels). The
// warp kernel runs wherever a warp's list fits (the plan also asks for four rows an SM). Prints
// the median time of a whole call's top-k launches and a hash of the picks, for bitwise A/Bs of
// two source trees (build.sh's CSRC).
//   bin/topk_bench S dist [reps] [topk] [context] [cta]
//     dist: gauss (N(0, 6^2), as bench_dsv4's scores), narrow (20 + N(0, 0.5^2)) or ties
//     (round(N(0, 3^2))); with `context`, S queries at its last position (a decode step's rows,
//     each context / 4 long) instead of a causal prompt of S tokens; `cta` takes the CTA
//     kernel where the plan would take the warp kernel.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "harness.h"

using namespace dsv4;

__global__ void fill(float* x, int64_t n, int dist, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float z = harness::normal(i, seed);
    x[i] = dist == 0 ? 6.0f * z : dist == 1 ? 20.0f + 0.5f * z : rintf(3.0f * z);
  }
}

__global__ void hash_out(const int32_t* x, int64_t n, unsigned long long* h) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    uint64_t v = 1469598103934665603ull;
    for (int64_t i = 0; i < n; ++i) v = (v ^ static_cast<uint32_t>(x[i])) * 1099511628211ull;
    *h = v;
  }
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s S gauss|narrow|ties [reps] [topk] [context] [cta]\n", argv[0]);
    return 2;
  }
  const int S = atoi(argv[1]);
  const std::string d = argv[2];
  const int dist = d == "gauss" ? 0 : d == "narrow" ? 1 : d == "ties" ? 2 : -1;
  if (dist < 0) { fprintf(stderr, "dist: gauss, narrow or ties\n"); return 2; }
  const int reps = argc > 3 ? atoi(argv[3]) : 20;
  const int topk = argc > 4 ? atoi(argv[4]) : 512;
  const int context = argc > 5 ? atoi(argv[5]) : 0;
  const int Sc = (context > 0 ? context : S) / 4;
  const harness::DensePlan plan = harness::dense_plan(S, Sc);
  const int num_chunks = plan.num_chunks, rows = plan.rows();
  const int64_t chunk_floats = plan.chunk_floats();
  const bool force_cta = argc > 6 && std::string(argv[6]) == "cta";
  const bool warp = !force_cta && plan.warp_topk(topk);

  std::vector<int32_t> pos(S);
  for (int i = 0; i < S; ++i) pos[i] = context > 0 ? context - 1 : i;
  int32_t* d_pos;
  float* d_scores;  // one workspace per chunk, so the timed loop only launches top-k kernels
  int32_t* d_out;
  unsigned long long* d_hash;
  CHECK(cudaMalloc(&d_pos, S * 4));
  CHECK(cudaMemcpy(d_pos, pos.data(), S * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMalloc(&d_scores, chunk_floats * num_chunks * 4));
  CHECK(cudaMalloc(&d_out, int64_t(S) * topk * 4));
  CHECK(cudaMalloc(&d_hash, 8));
  fill<<<1024, 256>>>(d_scores, chunk_floats * num_chunks, dist, 12345);
  CHECK(cudaGetLastError());

  const IndexerParams p = harness::dense_params(plan, S, Sc, topk, d_pos, d_out);
  const auto topk_kernel = harness::cta_topk_kernel(plan);
  const auto call = [&]() {
    for (int c = 0; c < num_chunks; ++c) {
      IndexerParams q = p;
      q.chunk = c;
      q.scores = d_scores + c * chunk_floats;
      if (warp) {
        using W = IndexerWarpTopkTraits;
        indexer_topk_warp_kernel<<<(rows + W::kWarps - 1) / W::kWarps, W::kThreads,
                                   W::kSmemBytes>>>(q);
      } else {
        topk_kernel<<<rows, IndexerTopkTraits::kThreads, p.smem_keys * 4>>>(q);
      }
    }
  };
  CHECK(cudaMemset(d_out, 0xff, int64_t(S) * topk * 4));
  call();
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  hash_out<<<1, 1>>>(d_out, int64_t(S) * topk, d_hash);
  unsigned long long h = 0;
  CHECK(cudaMemcpy(&h, d_hash, 8, cudaMemcpyDeviceToHost));
  const float ms = harness::median_ms(reps, call);
  printf("topk S=%d ctx=%d %s topk=%d kernel=%s chunks=%dx%d: %.4f ms (median of %d) "
         "hash %016llx\n",
         S, context, argv[2], topk, warp ? "warp" : "cta", num_chunks, rows, ms, reps, h);
  return 0;
}
