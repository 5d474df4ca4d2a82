// The indexer's score kernel alone, or the whole call's kernels, torch-free: a dense causal
// prompt of S tokens (64 heads x 128, ratio 4, top-512, as bench_dsv4's indexer rows: q, k and
// the weights drawn N(0, 1), FP8 keys with power-of-two row scales), planned as
// csrc/sm90/indexer/api.cpp plans it. Prints the median time and a hash of the output, for
// bitwise A/Bs of source trees (build.sh's CSRC, benchmarks/ab/ab_indexer.sh with
// BENCH=score_bench).
//   bin/score_bench S fp8|bf16 [reps] [scores|call]
//     scores: every chunk's score kernel back to back on one stream, the hash over each
//       chunk's workspace (zeroed first); call: as launch.cu queues a call, each buffer's
//       chunks on a stream of its own, each chunk's top-k after its scores by programmatic
//       dependent launch, the hash over the picks.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "harness.h"
#include "sm90/indexer/score.cuh"
#include "sm90/shared/queue_kernel.h"

using namespace dsv4;

template <typename Element>
__global__ void fill_normal(Element* x, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    x[i] = Element(harness::normal(i, seed));
  }
}

// Row scales 2^e, e in {-3, ..., 0}.
__global__ void fill_row_scales(float* x, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float u = fabsf(harness::normal(i, seed));
    x[i] = exp2f(-static_cast<float>(static_cast<int>(u * 2.f) % 4));
  }
}

// h += Σ_i mix(salt, i, x[i]) (mod 2^64): order-free, so the kernel's own order does not matter.
__global__ void hash_add(const uint32_t* x, int64_t n, uint64_t salt, unsigned long long* h) {
  uint64_t acc = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t z = (salt * 0x9e3779b97f4a7c15ull) ^ (uint64_t(i) << 32) ^ x[i];
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    acc += z ^ (z >> 31);
  }
  atomicAdd(h, static_cast<unsigned long long>(acc));
}

static PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status;
  CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &status));
  return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
}

// host.cu's make_tensor_map_bshd for a contiguous (1, rows, 1, 128) tensor of `elem`-byte
// elements: box one 128-byte atom by box_rows rows, 128-byte swizzle.
static CUtensorMap row_map(const void* base, int64_t rows, int elem, unsigned box_rows) {
  cuuint64_t dims[4] = {128, static_cast<cuuint64_t>(rows), 1, 1};
  cuuint64_t strides[3] = {static_cast<cuuint64_t>(128 * elem),
                           static_cast<cuuint64_t>(128 * elem),
                           static_cast<cuuint64_t>(rows * 128 * elem)};
  cuuint32_t box[4] = {static_cast<cuuint32_t>(128 / elem), box_rows, 1, 1};
  cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  CUtensorMap map;
  const CUresult r = encoder()(
      &map, elem == 1 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4,
      const_cast<void*>(base), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    fprintf(stderr, "cuTensorMapEncodeTiled failed (%d)\n", static_cast<int>(r));
    exit(1);
  }
  return map;
}

template <typename Element>
int run(int S, int reps, bool whole_call, const char* dtype_name) {
  using T = IndexerScoreTraits<Element>;
  constexpr int kTopk = 512;
  const int Sc = S / 4;
  const harness::DensePlan plan = harness::dense_plan(S, Sc);
  const int heads = plan.heads, dim = T::kHeadDim, elem = sizeof(Element);
  const bool fp8 = elem == 1;
  const int64_t buffer_floats = plan.chunk_floats();

  Element *d_q, *d_k;
  float *d_w, *d_k_scale = nullptr, *d_ws;
  int32_t *d_pos, *d_out;
  unsigned long long* d_hash;
  CHECK(cudaMalloc(&d_q, int64_t(S) * heads * dim * elem));
  CHECK(cudaMalloc(&d_k, int64_t(Sc) * dim * elem));
  CHECK(cudaMalloc(&d_w, int64_t(S) * heads * 4));
  CHECK(cudaMalloc(&d_ws, buffer_floats * plan.buffers * 4));
  CHECK(cudaMalloc(&d_pos, int64_t(S) * 4));
  CHECK(cudaMalloc(&d_out, int64_t(S) * kTopk * 4));
  CHECK(cudaMalloc(&d_hash, 8));
  fill_normal<<<1024, 256>>>(d_q, int64_t(S) * heads * dim, 1);
  fill_normal<<<1024, 256>>>(d_k, int64_t(Sc) * dim, 2);
  fill_normal<<<1024, 256>>>(d_w, int64_t(S) * heads, 3);
  if (fp8) {
    CHECK(cudaMalloc(&d_k_scale, int64_t(Sc) * 4));
    fill_row_scales<<<256, 256>>>(d_k_scale, Sc, 4);
  }
  std::vector<int32_t> pos(S);
  for (int i = 0; i < S; ++i) pos[i] = i;
  CHECK(cudaMemcpy(d_pos, pos.data(), int64_t(S) * 4, cudaMemcpyHostToDevice));
  CHECK(cudaGetLastError());

  // q as (1, S H, 1, D): a consumer's (query, head) rows in boxes of kIndexerColumns.
  const CUtensorMap tq = row_map(d_q, int64_t(S) * heads, elem, kIndexerColumns);
  const CUtensorMap tk = row_map(d_k, Sc, elem, 64);
  IndexerParams p = harness::dense_params(plan, S, Sc, kTopk, d_pos, d_out);
  const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
  p.weights = d_w;
  p.weight_scale = static_cast<float>(scale);
  p.sign = 1.f;
  p.k_scale = d_k_scale;
  p.k_scale_stride_b = fp8 ? Sc : 0;
  p.k_scale_stride_s = fp8 ? 1 : 0;

  const auto score_kernel = indexer_score_kernel<Element>;
  CHECK(cudaFuncSetAttribute(score_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             T::kSmemBytes));
  const auto topk_kernel = harness::cta_topk_kernel(plan);
  const bool warp = plan.warp_topk(kTopk);
  const int rows = plan.rows();
  cudaStream_t streams[2];
  cudaEvent_t fork, join;
  CHECK(cudaStreamCreateWithFlags(&streams[0], cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&streams[1], cudaStreamNonBlocking));
  CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));

  // Chunk c's scores into buffer c % buffers on `on`, then (with_topk) its top-k behind them.
  const auto launch_chunk = [&](int c, cudaStream_t on, bool with_topk) {
    IndexerParams q = p;
    q.chunk = c;
    q.scores = d_ws + (c % plan.buffers) * buffer_floats;
    CHECK(queue_kernel(score_kernel, dim3(plan.splits, plan.chunk_blocks), T::kThreads,
                       T::kSmemBytes, on, false, tq, tk, q));
    if (!with_topk) return;
    if (warp) {
      using W = IndexerWarpTopkTraits;
      CHECK(queue_kernel(indexer_topk_warp_kernel, (rows + W::kWarps - 1) / W::kWarps,
                         W::kThreads, W::kSmemBytes, on, true, q));
    } else {
      CHECK(queue_kernel(topk_kernel, rows, IndexerTopkTraits::kThreads, p.smem_keys * 4, on,
                         true, q));
    }
  };
  const auto call = [&]() {
    if (!whole_call) {
      for (int c = 0; c < plan.num_chunks; ++c) launch_chunk(c, 0, false);
      return;
    }
    // launch.cu's launch_chunks: the side stream starts after the work queued so far and the
    // default stream waits for it at the end.
    CHECK(cudaEventRecord(fork, 0));
    CHECK(cudaStreamWaitEvent(streams[0], fork));
    CHECK(cudaStreamWaitEvent(streams[1], fork));
    for (int c = 0; c < plan.num_chunks; ++c) launch_chunk(c, streams[c % plan.buffers], true);
    for (int s = 0; s < 2; ++s) {
      CHECK(cudaEventRecord(join, streams[s]));
      CHECK(cudaStreamWaitEvent(0, join));
    }
  };

  // The hash pass: every chunk's workspace (zeroed before its scores) or the whole call's picks.
  CHECK(cudaMemset(d_hash, 0, 8));
  if (whole_call) {
    CHECK(cudaMemset(d_out, 0xff, int64_t(S) * kTopk * 4));
    call();
    hash_add<<<256, 256>>>(reinterpret_cast<const uint32_t*>(d_out), int64_t(S) * kTopk, 0,
                           d_hash);
  } else {
    for (int c = 0; c < plan.num_chunks; ++c) {
      float* ws = d_ws + (c % plan.buffers) * buffer_floats;
      CHECK(cudaMemset(ws, 0, buffer_floats * 4));
      launch_chunk(c, 0, false);
      hash_add<<<256, 256>>>(reinterpret_cast<const uint32_t*>(ws), buffer_floats, c + 1, d_hash);
    }
  }
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  unsigned long long h = 0;
  CHECK(cudaMemcpy(&h, d_hash, 8, cudaMemcpyDeviceToHost));
  const float ms = harness::median_ms(reps, call);
  // Useful FLOPs: 2 H D per closed (query, row) pair.
  double pairs = 0;
  for (int i = 0; i < S; ++i) pairs += std::min(Sc, (i + 1) / 4);
  const double tflops = 2.0 * heads * dim * pairs / (ms * 1e-3) / 1e12;
  printf("score S=%d %s mode=%s chunks=%dx%d splits=%d: %.4f ms (median of %d) %.0f TFLOP/s "
         "hash %016llx\n",
         S, dtype_name, whole_call ? "call" : "scores", plan.num_chunks, plan.chunk_blocks,
         plan.splits, ms, reps, tflops, h);
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s S fp8|bf16 [reps] [scores|call]\n", argv[0]);
    return 2;
  }
  const int S = atoi(argv[1]);
  const std::string dtype = argv[2];
  const int reps = argc > 3 ? atoi(argv[3]) : 10;
  const bool whole_call = argc > 4 && std::string(argv[4]) == "call";
  if (S < 8 || S % 4 != 0) {
    fprintf(stderr, "S: a multiple of 4, at least 8 (got %d)\n", S);
    return 2;
  }
  if (dtype == "fp8") return run<__nv_fp8_e4m3>(S, reps, whole_call, "fp8");
  if (dtype == "bf16") return run<__nv_bfloat16>(S, reps, whole_call, "bf16");
  fprintf(stderr, "dtype: fp8 or bf16 (got %s)\n", dtype.c_str());
  return 2;
}
