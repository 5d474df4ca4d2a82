// Timing and trace harness for mqa512_sm90_kernel without torch (build.sh): causal fmha rows at
// head_dim 512 (one KV head), median of event-timed launches; with -DDSV4_TRACE (bin/trace),
// one launch's DSV4_TRACE_STAMP events (csrc/sm90/shared/trace.cuh) of one CTA (0, or
// $DSV4_TRACE_CTA), printed for analyze.py.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cmath>
#include <functional>
#include "sm90/shared/trace.cuh"
#ifndef KERNEL_HEADER
#define KERNEL_HEADER "sm90/mqa512/kernel.cuh"
#endif
#include KERNEL_HEADER
#include "sm90/mqa512/plan.h"
#include "common.cuh"
using namespace dsv4;
// One harness row (main's arguments) as the family's plan sees it: the launcher's own plan and
// parameters (csrc/sm90/mqa512/plan.h), for one split (the harness runs no combine kernel).
struct Row {
  int B, S, Sk, H, causal, window_left;
  int ratio, Sc, topk_k;  // compressed rows: ratio 0 none; topk_k > 0 CSA, else HCA
};
static Mqa512Shape shape_of(const Row& r) {
  Mqa512Shape s;
  s.batch = r.B; s.seqlen_q = r.S; s.seqlen_k = r.Sk; s.longest_k = r.Sk; s.heads_q = r.H;
  s.heads_kv = 1; s.scale = 1.0 / std::sqrt(512.0); s.causal = r.causal; s.window_left = r.window_left;
  s.compress_ratio = r.ratio; s.seqlen_c = r.Sc; s.topk_k = r.topk_k; s.max_compressed_rows = r.Sc;
  return s;
}
int main(int argc, char** argv) {
  int B = argc > 1 ? atoi(argv[1]) : 1, S = argc > 2 ? atoi(argv[2]) : 4096;
  int Sk = argc > 3 ? atoi(argv[3]) : S, H = argc > 4 ? atoi(argv[4]) : 64;
  int causal = argc > 5 ? atoi(argv[5]) : 1, reps = argc > 6 ? atoi(argv[6]) : 10;
  int persistent = argc > 7 ? atoi(argv[7]) : 0;
  int window_left = argc > 8 ? atoi(argv[8]) : -1;  // dsv4_attention's window W: causal, W - 1
  int with_sinks = argc > 9 ? atoi(argv[9]) : 0;     // 1: a sink per head (dsv4_attention)
  // dsv4_attention's compressed rows: K > 0, CSA (ratio 4, K listed rows per token); -r, HCA
  // (every closed row of a ratio-r compressed KV); 0, none.
  int compressed_mode = argc > 10 ? atoi(argv[10]) : 0;
  using T = Mqa512Sm90Traits<__nv_bfloat16>;
  size_t nq = (size_t)B * S * H * 512, nkv = (size_t)B * Sk * 512;
  __nv_bfloat16 *q, *kv, *out; float* lse;
  CK(cudaMalloc(&q, nq * 2)); CK(cudaMalloc(&kv, nkv * 2)); CK(cudaMalloc(&out, nq * 2));
  CK(cudaMalloc(&lse, (size_t)B * H * S * 4));
  fill<<<1024, 256>>>(q, nq, 1); fill<<<1024, 256>>>(kv, nkv, 2); CK(cudaGetLastError());
  float* ds = nullptr;
  if (with_sinks) {
    std::vector<float> hs(H);
    for (int i = 0; i < H; ++i) hs[i] = 0.25f * (i % 7) - 0.5f;
    CK(cudaMalloc(&ds, H * 4)); CK(cudaMemcpy(ds, hs.data(), H * 4, cudaMemcpyHostToDevice));
  }
  __nv_bfloat16* comp = nullptr;
  const int ratio = compressed_mode > 0 ? 4 : -compressed_mode, Sc = ratio > 0 ? Sk / ratio : 0;
  if (ratio > 0) {
    CK(cudaMalloc(&comp, (size_t)B * Sc * 512 * 2)); fill<<<1024, 256>>>(comp, (size_t)B * Sc * 512, 3);
  }
  int* topk = nullptr;
  // Token t lists K distinct rows (an odd stride mod a power of two), some not yet closed; with
  // DSV4_HARNESS_PADDED=1 as an indexer lists them: min(K, closed) distinct closed rows, then -1.
  const bool padded = getenv("DSV4_HARNESS_PADDED") && atoi(getenv("DSV4_HARNESS_PADDED"));
  if (compressed_mode > 0) {
    const int K = compressed_mode;
    std::vector<int> idx((size_t)B * S * K);
    for (size_t r = 0; r < (size_t)B * S; ++r) {
      const long closed = std::min<long>(Sc, ((long)(r % S) + Sk - S + 1) / 4);
      for (int j = 0; j < K; ++j) {
        idx[r * K + j] = !padded ? (int)((r * 7919 + (size_t)j * 104729) % Sc)
                         : j < closed ? (int)((r * 7919 + (size_t)j * 104729) % closed) : -1;
      }
    }
    CK(cudaMalloc(&topk, idx.size() * 4)); CK(cudaMemcpy(topk, idx.data(), idx.size() * 4, cudaMemcpyHostToDevice));
  }
  const Row row{B, S, Sk, H, causal, window_left, ratio, Sc, compressed_mode > 0 ? compressed_mode : 0};
  const Mqa512Shape shape = shape_of(row);
  Overrides overrides;
  overrides.split_kv = 1;
  if (const char* v = getenv("DSV4_MQA512_NARROW")) overrides.mqa512_narrow = atoi(v);
  overrides.mqa512_per_tile_grid = !persistent;
  int num_sms = 0;
  CK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, 0));
  const Mqa512Plan plan = mqa512_plan_launch(shape, num_sms, overrides);
  Mqa512Sm90Params p = mqa512_params(shape, plan);
  p.out = out; p.lse = lse; p.sinks = ds;
  if (ratio > 0) { p.compressed = comp; p.c_batch_stride = (long long)Sc * 512; p.c_row_stride = 512; }
  if (row.topk_k > 0) p.topk = topk;
  CUtensorMap tq = tmap(q, B, S, H, p.tile_tokens, p.tile_heads), tkv = tmap(kv, B, Sk, 1, 64, 1);
  CUtensorMap tc = ratio > 0 ? tmap(comp, B, Sc, 1, 64, 1) : tkv;
  // The plan's instantiation: CSA rows gather (kGathered), the others take TMA boxes; CSA at 16
  // or fewer heads the narrow form (DSV4_MQA512_NARROW=0 in the environment: not).
  const int grid = static_cast<int>(plan.grid);
  std::function<void()> launch;
  if (plan.narrow_heads > 0) {
    using N = Mqa512NarrowTraits<__nv_bfloat16>;
    auto kernel = mqa512_narrow_sm90_kernel<__nv_bfloat16>;
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)N::kSmemBytes));
    launch = [&, kernel] { kernel<<<grid, N::kThreads, N::kSmemBytes>>>(tq, tkv, tc, p); };
  } else {
    auto kernel = plan.keys == Mqa512Keys::kGathered
                      ? mqa512_sm90_kernel<__nv_bfloat16, Mqa512Keys::kGathered>
                      : mqa512_sm90_kernel<__nv_bfloat16, Mqa512Keys::kTma>;
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)T::kSmemBytes));
    launch = [&, kernel] { kernel<<<grid, T::kThreads, T::kSmemBytes>>>(tq, tkv, tc, p); };
  }
  printf("plan: tile=%dx%d narrow=%d grid=%d\n", plan.tile_tokens, plan.tile_heads, plan.narrow_heads, grid);
#ifdef DSV4_TRACE
  trace_launch(traced_cta(grid), launch);
#else
  const std::vector<float> ms = time_launches(launch, reps);
  double pairs = 0;  // visible (query, key) pairs
  for (long t = 0; t < S; ++t) {
    const long pos = t + Sk - S, hi = causal ? std::min<long>(pos + 1, Sk) : Sk;
    const long lo = window_left >= 0 ? std::max<long>(0, pos - window_left) : 0;
    pairs += std::max<long>(hi - lo, 0);
    if (ratio > 0) {  // closed compressed rows (HCA), or the listed ones (CSA: distinct, in range)
      const long closed = std::min<long>(Sc, (pos + 1) / ratio);
      pairs += compressed_mode > 0 ? std::min<long>(compressed_mode, closed) : closed;
    }
  }
  double fl = 4.0 * B * H * pairs * 512;
  // q and out, and each key row once: what a memory-bound call must move at least.
  double bytes = 2.0 * nq * 2 + (double)nkv * 2;
  // What the last launch wrote (out and lse), for builds that must agree bitwise.
  const unsigned long long hash =
      fnv1a_device(lse, (size_t)B * H * S * 4, fnv1a_device(out, nq * 2));
  printf("%s B=%d S=%d Sk=%d H=%d causal=%d window_left=%d sinks=%d compressed=%d: median %.4f ms  %.0f TFLOP/s  %.0f GB/s of q+out+kv, output hash %016llx\n",
         persistent ? "persistent" : "per-tile", B, S, Sk, H, causal, window_left, with_sinks, compressed_mode, ms[reps / 2],
         fl / ms[reps / 2] / 1e9, bytes / ms[reps / 2] / 1e6, hash);
#endif
  return 0;
}
