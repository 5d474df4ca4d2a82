// Does compute-sanitizer's racecheck see the order of the head_dim-512 kernel's split merge
// (csrc/sm90/mqa512/split_merge.cuh)? There, CTA X's threads write their key stages (the
// gather's cp.async), each thread then arrives on a barrier in the peer CTA Y
// (mbarrier.arrive.release.cluster), and Y's threads wait on it (acquire.cluster) and store
// into X's stages through distributed shared memory. racecheck flags those stores against the
// cp.async writes. This reduces the handoff to one slot a thread, so the modes below tell the
// candidate readings apart:
//   cp_async           thread t cp.asyncs into its slot t and waits for it, then arrives; the
//                      peer's thread t stores into slot t (the same thread index on both sides)
//   cp_async_shifted   the same, but the peer's thread t stores into slot t + 32 (in the kernel
//                      the writers and the storers map differently)
//   generic_shifted    the same with a plain st.shared instead of the cp.async
//   cp_async_shifted_synced  cp_async_shifted with a __syncthreads after the local writes: if
//                      only this one is clean, racecheck records a remote store against the
//                      storing CTA's own bytes, and a CTA-wide barrier before the stores is
//                      what it needs
//   cp_async_cluster_synced  cp_async_shifted with a whole-cluster barrier (barrier.cluster,
//                      release and acquire) after the local writes instead of the handoff: if
//                      this one is flagged too, racecheck does not order a CTA's cp.async
//                      writes before a peer's distributed-shared-memory stores by any barrier
//   unsynced           the stores with no barrier at all: racecheck must flag this one
// On an sm_90a device, `bash run.sh` (beside this file) builds it and runs every mode under
// racecheck, a line each.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>

#include "ptx/cluster.cuh"
#include "ptx/cp_async.cuh"
#include "ptx/mbarrier.cuh"

using namespace dsv4;

constexpr int kThreads = 128;
struct Mode {
  const char* name;
  bool cp_async, shifted, local_sync, handoff, cluster_synced;
};
constexpr Mode kModes[] = {
    {"cp_async", true, false, false, true, false},
    {"cp_async_shifted", true, true, false, true, false},
    {"generic_shifted", false, true, false, true, false},
    {"cp_async_shifted_synced", true, true, true, true, false},
    {"cp_async_cluster_synced", true, true, false, false, true},
    {"unsynced", true, true, false, false, false},
};

__global__ void __cluster_dims__(2, 1, 1) handoff(const float4* src, float* out, Mode mode) {
  __shared__ float4 slot[kThreads];
  __shared__ __align__(8) uint64_t free_bar;
  const int t = threadIdx.x;
  const uint32_t rank = ptx::cluster_ctarank();
  if (t == 0) {
    ptx::mbarrier_init(ptx::smem_addr(&free_bar), kThreads);
    ptx::fence_barrier_init();
  }
  ptx::cluster_sync();
  if (mode.cp_async) {
    ptx::cp_async_16_unless_negative(ptx::smem_addr(&slot[t]), src + t, 0);  // as the gather
    ptx::cp_async_wait_all();
  } else {
    slot[t] = src[t];
  }
  if (mode.local_sync) __syncthreads();
  if (mode.cluster_synced) ptx::cluster_sync();
  if (mode.handoff) {  // this thread is done with its slot: the peer may store into it
    ptx::mbarrier_arrive_cluster(ptx::map_to_rank(ptx::smem_addr(&free_bar), rank ^ 1));
    ptx::mbarrier_wait_cluster(ptx::smem_addr(&free_bar), 0);
  }
  const int dst = mode.shifted ? (t + 32) % kThreads : t;
  ptx::st_cluster_v4(ptx::map_to_rank(ptx::smem_addr(&slot[dst]), rank ^ 1), 1.f * rank, 2.f,
                     3.f, 4.f);
  ptx::cluster_sync();
  out[blockIdx.x * kThreads + t] = slot[t].x;
}

int main(int argc, char** argv) {
  const Mode* mode = nullptr;
  for (const Mode& m : kModes) {
    if (argc > 1 && !strcmp(argv[1], m.name)) mode = &m;
  }
  if (mode == nullptr) {
    fprintf(stderr, "usage: %s MODE (see the header)\n", argv[0]);
    return 2;
  }
  float4* src;
  float* out;
  if (cudaMalloc(&src, kThreads * sizeof(float4)) != cudaSuccess ||
      cudaMalloc(&out, 2 * kThreads * sizeof(float)) != cudaSuccess ||
      cudaMemset(src, 0, kThreads * sizeof(float4)) != cudaSuccess) {
    fprintf(stderr, "cluster_handoff: allocation failed\n");
    return 1;
  }
  handoff<<<2, kThreads>>>(src, out, *mode);
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  float host[2 * kThreads];
  if (err == cudaSuccess) err = cudaMemcpy(host, out, sizeof(host), cudaMemcpyDeviceToHost);
  if (err != cudaSuccess) {
    fprintf(stderr, "cluster_handoff %s: %s\n", mode->name, cudaGetErrorString(err));
    return 1;
  }
  // With the handoff, CTA k's slots hold the peer's stores: its rank, 1 - k.
  int held = 0;
  for (int i = 0; i < 2 * kThreads; ++i) held += host[i] == float(1 - i / kThreads);
  printf("cluster_handoff %s: %d of %d slots hold the peer's value\n", mode->name, held,
         2 * kThreads);
  const bool ordered = mode->handoff || mode->cluster_synced;
  return held == 2 * kThreads || !ordered ? 0 : 1;
}
