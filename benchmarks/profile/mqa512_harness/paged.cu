// Timing and trace harness for the paged instantiation of mqa512_sm90_kernel without torch
// (build.sh): dsv4_attention_paged's decode step, B requests of one query token each, over
// random FP8 records (sm90/kv_cache/format.h) at scattered slots. The window list has 128 slots
// (pages of 64); `kind` adds a compressed list: csa512 / csa1024 (the top-K of a 4x compressed
// cache at `context` tokens, pages of 64) or hca (every closed row of a 128x one, pages of 2).
//   bin/paged_bench B Hq kind [context 32768] [splits 0: planned] [reps 50]
//                   [convert -1: planned, 0: the producer converts, 1: the consumers]
//                   [merge -1: planned, 0: the splits write partials, 1: they merge in clusters]
//     -> the main kernel's median µs (no combine kernel: with splits > 1 merged in clusters
//        where the plan says so, else its partials are written and not combined)
//   bin/paged_trace B Hq kind [context] [splits] > t.txt; python3 analyze.py t.txt paged
//     -> CTA 0's producer and consumer events, tile by tile (DSV4_TRACE_CTA=N: CTA N)
#include <cmath>
#include <cstring>

#include "sm90/kv_cache/format.h"
#include "sm90/mqa512/kernel.cuh"
#include "sm90/mqa512/plan.h"
#include "sm90/shared/queue_kernel.h"
#include "common.cuh"
using namespace dsv4;

// Random bytes with bit 6 clear: every fp8 value and the bf16 tail's high bytes stay below 2 in
// magnitude (no inf or NaN); then every scale row holds 2^0 (127) for its seven tiles.
__global__ void fill_cache(uint8_t* base, long long blocks, int rows, long long stride, unsigned seed) {
  const long long n = blocks * stride;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    unsigned x = (unsigned)(i * 2654435761u) ^ seed;
    x ^= x >> 13; x *= 0x5bd1e995; x ^= x >> 15;
    const long long r = i % stride;
    uint8_t v = (uint8_t)(x & 0xbf);
    if (r >= (long long)rows * kKvDataBytes) {  // a scale row
      const int b = (int)((r - (long long)rows * kKvDataBytes) % kKvScaleBytes);
      v = b < kKvTiles ? 127 : 0;
    }
    base[i] = v;
  }
}
// A cache of at least `slots` rows in pages of `rows`, and its list for the kernel.
struct Cache {
  uint8_t* base = nullptr;
  long long blocks = 0, stride = 0;
  int rows = 0;
  Cache(long long slots, int page_rows, unsigned seed) : rows(page_rows) {
    blocks = (slots + rows - 1) / rows;
    stride = ((long long)rows * kKvRecordBytes + kKvDataBytes - 1) / kKvDataBytes * kKvDataBytes;
    CK(cudaMalloc(&base, blocks * stride));
    fill_cache<<<1024, 256>>>(base, blocks, rows, stride, seed);
    CK(cudaGetLastError());
  }
  // lengths: one per token, as dsv4_attention_paged always passes them.
  Mqa512PagedList list(const int* slots, int len, const int* lengths) const {
    Mqa512PagedList l{};
    l.base = base; l.slots = slots; l.lengths = lengths; l.block_stride = stride; l.len = len;
    l.tiles = (len + kMqa512KeysPerTile - 1) / kMqa512KeysPerTile;
    while ((1 << l.page_shift) < rows) ++l.page_shift;
    l.capacity = (int)(blocks * rows);
    return l;
  }
};
static int* upload(const std::vector<int>& v) {
  int* d; CK(cudaMalloc(&d, v.size() * 4));
  CK(cudaMemcpy(d, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
  return d;
}
int main(int argc, char** argv) {
  if (argc < 4) { printf("usage: %s B Hq window|csa512|csa1024|hca [context] [splits] [reps]\n", argv[0]); return 2; }
  const int B = atoi(argv[1]), H = atoi(argv[2]);
  const char* kind = argv[3];
  const int context = argc > 4 ? atoi(argv[4]) : 32768, splits = argc > 5 ? atoi(argv[5]) : 0;
  const int reps = argc > 6 ? atoi(argv[6]) : 50;
  const int convert = argc > 7 ? atoi(argv[7]) : -1;  // 0 producer, 1 consumer, -1 planned
  const int merge = argc > 8 ? atoi(argv[8]) : -1;    // 0 partials, 1 clusters, -1 planned
  constexpr int kWindow = 128;
  const bool csa = !strncmp(kind, "csa", 3), hca = !strcmp(kind, "hca");
  if (!csa && !hca && strcmp(kind, "window")) { printf("unknown kind %s\n", kind); return 2; }
  // The window: slot lists over a permutation of B * 128 slots (pages of 64).
  Cache window(B * kWindow, 64, 1);
  std::vector<int> ws(B * kWindow);
  for (int i = 0; i < B * kWindow; ++i) ws[i] = (int)((i * 40503L + 17) % (B * kWindow));
  const int* d_ws = upload(ws);
  // The compressed list: CSA's K of token b's closed rows (distinct, scattered), HCA's all.
  const int closed = csa ? context / 4 : context / 128;
  const int k = csa ? atoi(kind + 3) : closed;
  Cache* comp = nullptr;
  const int* d_cs = nullptr;
  if (csa || hca) {
    comp = new Cache((long long)B * closed, csa ? 64 : 2, 2);
    std::vector<int> cs((size_t)B * k);
    for (int b = 0; b < B; ++b)
      for (int j = 0; j < k; ++j)
        cs[(size_t)b * k + j] = b * closed + (csa ? (int)((b * 7919L + j * 104729L) % closed) : j);
    d_cs = upload(cs);
  }
  Mqa512Shape s;
  s.batch = 1; s.seqlen_q = s.seqlen_k = s.longest_k = B; s.heads_q = H; s.heads_kv = 1;
  s.scale = 1.0 / std::sqrt(512.0); s.use_kv = false;
  s.paged_tiles = (kWindow + 63) / 64 + (comp ? (k + 63) / 64 : 0);
  Overrides overrides;
  overrides.split_kv = splits;
  overrides.mqa512_paged_convert = convert;
  overrides.mqa512_split_merge = merge;
  int num_sms = 0;
  CK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, 0));
  const Mqa512Plan plan = mqa512_plan_launch(s, num_sms, overrides);
  Mqa512Sm90Params p = mqa512_params(s, plan);
  __nv_bfloat16 *q, *out; float *lse, *sinks, *partial = nullptr;
  const size_t nq = (size_t)B * H * 512;
  CK(cudaMalloc(&q, nq * 2)); CK(cudaMalloc(&out, nq * 2)); CK(cudaMalloc(&lse, (size_t)B * H * 4));
  CK(cudaMalloc(&sinks, H * 4)); CK(cudaMemset(sinks, 0, H * 4));
  fill<<<1024, 256>>>(q, nq, 3); CK(cudaGetLastError());
  p.out = out; p.lse = lse; p.sinks = sinks;
  // Every token's lists are full: lengths of 128 and K.
  p.page_list[0] = window.list(d_ws, kWindow, upload(std::vector<int>(B, kWindow)));
  if (comp) p.page_list[1] = comp->list(d_cs, k, upload(std::vector<int>(B, k)));
  if (p.num_splits > 1 && !plan.cluster_merge) {
    const size_t rows = (size_t)B * H;
    CK(cudaMalloc(&partial, p.num_splits * rows * (512 + 1) * 4));
    p.o_partial = partial; p.lse_partial = partial + p.num_splits * rows * 512;
  }
  const CUtensorMap tq = tmap(q, 1, B, H, p.tile_tokens, p.tile_heads);  // (1, T, Hq, 512)
  using T = Mqa512Sm90Traits<__nv_bfloat16>;
  const bool staged = plan.keys == Mqa512Keys::kPagedStaged;
  auto kernel = staged ? mqa512_sm90_kernel<__nv_bfloat16, Mqa512Keys::kPagedStaged>
                       : mqa512_sm90_kernel<__nv_bfloat16, Mqa512Keys::kPaged>;
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)T::kSmemBytes));
  const int grid = (int)plan.grid;
  printf("# B=%d Hq=%d %s context=%d: %lld work tiles x %d splits (%s), grid %d, %lld key tiles "
         "a token, converted by the %s\n", B, H, kind, context, (long long)plan.tiles, p.num_splits,
         plan.cluster_merge ? "merged in clusters" : "partials", grid, (long long)s.paged_tiles,
         staged ? "consumers" : "producer");
  const unsigned cluster = plan.cluster_merge ? p.num_splits : 1;
  for (unsigned size = 2; size <= 8; size *= 2) {  // how many clusters of this kernel fit at once
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(size * 16);
    config.blockDim = dim3(T::kThreads);
    config.dynamicSmemBytes = T::kSmemBytes;
    cudaLaunchAttribute dims;
    dims.id = cudaLaunchAttributeClusterDimension;
    dims.val.clusterDim = {size, 1, 1};
    config.attrs = &dims;
    config.numAttrs = 1;
    int clusters = 0;
    CK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config));
    printf("# clusters of %u CTAs resident at once: %d (%d CTAs)\n", size, clusters, clusters * size);
  }
  const auto launch = [&] {
    CK(queue_kernel(kernel, dim3(grid), dim3(T::kThreads), T::kSmemBytes, 0,
                    QueueOptions{false, cluster}, tq, tq, tq, p));
  };
#ifdef DSV4_TRACE
  const int cta = traced_cta(grid);
  launch();  // a warm launch, untraced (the trace buffer is not armed yet)
  CK(cudaDeviceSynchronize());
  trace_launch(cta, launch);
#else
  std::vector<float> us = time_launches(launch, reps);
  for (float& t : us) t *= 1000.f;
  // FNV-1a of what the kernel wrote (out and lse, or a split's partials and their lse): two
  // builds of the kernel that must agree bitwise print the same hash.
  const size_t rows = (size_t)B * H;
  const unsigned long long hash =
      partial ? fnv1a_device(partial, p.num_splits * rows * (512 + 1) * 4)
                       : fnv1a_device(lse, rows * 4, fnv1a_device(out, rows * 512 * 2));
  printf("paged B=%d Hq=%d %s splits=%d: main kernel median %.1f us (min %.1f), output hash %016llx\n",
         B, H, kind, p.num_splits, us[reps / 2], us[0], hash);
#endif
  return 0;
}
