// What the mqa512 harnesses share (harness.cu, paged.cu, the gather benches): CUDA error checks,
// random bf16 fills, the tensor-map encoder and a (B, S, H, 512) map, an output hash, the trace
// buffer of csrc/sm90/shared/trace.cuh with the family's slot names, and the gather benches'
// timed launch.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "sm90/shared/trace.cuh"

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %d: %s\n", #x, __LINE__, cudaGetErrorString(e)); exit(1);} } while (0)
__global__ void fill(__nv_bfloat16* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    unsigned x = (unsigned)(i * 2654435761u) ^ seed; x ^= x >> 13; x *= 0x5bd1e995; x ^= x >> 15;
    p[i] = __float2bfloat16(((x & 0xffff) / 65536.f - 0.5f) * 3.4f);
  }
}
// A gather bench's measurement (gather_bench.cu, paged_gather_bench.cu): launch() once to warm
// up, then once between events. Returns the timed launch's milliseconds; mean_cycles gets the
// mean of the n clock64 spans it wrote to `cycles` (one a warp).
template <typename Launch>
static float time_warp_spans(Launch launch, const long long* cycles, size_t n,
                             double& mean_cycles) {
  launch();
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  cudaEvent_t start, stop;
  CK(cudaEventCreate(&start));
  CK(cudaEventCreate(&stop));
  CK(cudaEventRecord(start));
  launch();
  CK(cudaEventRecord(stop));
  CK(cudaEventSynchronize(stop));
  CK(cudaGetLastError());
  float ms;
  CK(cudaEventElapsedTime(&ms, start, stop));
  CK(cudaEventDestroy(start));
  CK(cudaEventDestroy(stop));
  std::vector<long long> spans(n);
  CK(cudaMemcpy(spans.data(), cycles, n * sizeof(long long), cudaMemcpyDeviceToHost));
  mean_cycles = 0;
  for (long long c : spans) mean_cycles += static_cast<double>(c) / n;
  return ms;
}
static PFN_cuTensorMapEncodeTiled_v12000 enc() {
  void* ptr = nullptr; cudaDriverEntryPointQueryResult st;
  CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &st));
  return (PFN_cuTensorMapEncodeTiled_v12000)ptr;
}
// (B, S, H, 512) contiguous
static CUtensorMap tmap(void* base, long b, long s, long h, unsigned box_rows, unsigned box_heads) {
  cuuint64_t dims[4] = {512, (cuuint64_t)s, (cuuint64_t)h, (cuuint64_t)b};
  cuuint64_t strides[3] = {(cuuint64_t)(h * 512 * 2), 1024, (cuuint64_t)(s * h * 512 * 2)};
  if (h == 1) strides[1] = 1024;
  cuuint32_t box[4] = {64, box_rows, box_heads, 1}, es[4] = {1, 1, 1, 1};
  CUtensorMap m;
  CUresult r = enc()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, base, dims, strides, box, es,
                     CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                     CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) { printf("encode failed %d\n", r); exit(1); }
  return m;
}
// FNV-1a over device buffers (copied back), for two builds of a kernel that must agree bitwise:
// equal outputs print the same hash. `hash` chains the buffers.
static unsigned long long fnv1a_device(const void* d, size_t n,
                                       unsigned long long hash = 1469598103934665603ull) {
  std::vector<uint8_t> bytes(n);
  CK(cudaMemcpy(bytes.data(), d, n, cudaMemcpyDeviceToHost));
  for (uint8_t c : bytes) hash = (hash ^ c) * 1099511628211ull;
  return hash;
}
#ifdef DSV4_TRACE
// The trace buffer of csrc/sm90/shared/trace.cuh: arm() before the launch allocates and zeroes
// it and sets the kernel's symbols; print() after it writes every slot's events as
//   E <slot> <point> <cycles since the CTA's first event>
// lines for analyze.py (with "# ..." lines naming each slot and its count).
struct TraceBuffer {
  unsigned long long* events = nullptr;
  static constexpr size_t kEvents = size_t(dsv4::trace::kMaxSlots) * dsv4::trace::kCapacity;
  void arm(int cta) {
    CK(cudaMalloc(&events, kEvents * 8)); CK(cudaMemset(events, 0, kEvents * 8));
    int zero[dsv4::trace::kMaxSlots] = {};
    CK(cudaMemcpyToSymbol(dsv4::trace::g_events, &events, sizeof(events)));
    CK(cudaMemcpyToSymbol(dsv4::trace::g_counts, zero, sizeof(zero)));
    CK(cudaMemcpyToSymbol(dsv4::trace::g_cta, &cta, sizeof(cta)));
  }
  void print(int cta, const char* const* slot_names) const {
    std::vector<unsigned long long> h(kEvents);
    int n[dsv4::trace::kMaxSlots];
    CK(cudaMemcpy(h.data(), events, kEvents * 8, cudaMemcpyDeviceToHost));
    CK(cudaMemcpyFromSymbol(n, dsv4::trace::g_counts, sizeof(n)));
    unsigned long long t0 = ~0ull;
    for (int s = 0; s < dsv4::trace::kMaxSlots; ++s)
      for (int i = 0; i < std::min(n[s], dsv4::trace::kCapacity); ++i)
        t0 = std::min(t0, h[s * dsv4::trace::kCapacity + i] & dsv4::trace::kClockMask);
    printf("# trace of CTA %d: E slot point cycles\n", cta);
    for (int s = 0; s < dsv4::trace::kMaxSlots; ++s) {
      const int kept = std::min(n[s], dsv4::trace::kCapacity);
      printf("# slot %d (%s): %d events%s\n", s, slot_names[s] ? slot_names[s] : "-", n[s],
             kept < n[s] ? " (the later ones dropped: raise DSV4_TRACE_CAPACITY)" : "");
      for (int i = 0; i < kept; ++i) {
        const unsigned long long v = h[s * dsv4::trace::kCapacity + i];
        printf("E %d %d %llu\n", s, (int)(v >> 48), (v & dsv4::trace::kClockMask) - t0);
      }
    }
  }
};
// The mqa512 family's slots (analyze.py reads them by number).
static const char* const kSlotNames[dsv4::trace::kMaxSlots] = {
    "consumer warpgroup 0", "consumer warpgroup 1", "producer warp 0", "producer warp 1",
    "producer warp 2",      "producer warp 3",      nullptr,           nullptr};

// One traced launch of CTA `cta` (see traced_cta below), its events printed for analyze.py.
template <typename Launch>
void trace_launch(int cta, Launch launch) {
  TraceBuffer trace_buffer;
  trace_buffer.arm(cta);
  launch();
  CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
  trace_buffer.print(cta, kSlotNames);
}
#endif

// The CTA to trace: $DSV4_TRACE_CTA, else 0; exits when the grid has no such CTA.
inline int traced_cta(int grid) {
  const int cta = getenv("DSV4_TRACE_CTA") ? atoi(getenv("DSV4_TRACE_CTA")) : 0;
  if (cta < 0 || cta >= grid) {
    printf("DSV4_TRACE_CTA=%d: the grid has %d CTAs\n", cta, grid);
    exit(1);
  }
  return cta;
}

// `reps` event-timed launches after three warm ones: their ms, sorted.
template <typename Launch>
std::vector<float> time_launches(Launch launch, int reps) {
  for (int i = 0; i < 3; ++i) launch();
  CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
  cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(a));
    launch();
    CK(cudaEventRecord(b)); CK(cudaEventSynchronize(b));
    float t; CK(cudaEventElapsedTime(&t, a, b)); ms.push_back(t);
  }
  CK(cudaGetLastError());
  std::sort(ms.begin(), ms.end());
  return ms;
}
