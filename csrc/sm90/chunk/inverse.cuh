// sm90a: the ungated WY inverse of every 64-token chunk of chunk_gated_delta_rule, all chunks
// in parallel (one CTA, one warpgroup, per chunk and v-head, or per chunk and two or four
// v-heads of one qk-head, which then share the k load and K K^T):
//   T_u = (I + strict_lower(diag(beta) K K^T))^-1.
// The main kernel needs T = (I + strict_lower(diag(beta) (Gamma . K K^T)))^-1 with
// Gamma_ij = e^(G_i - G_j), G the chunk's cumulative gate. Since Gamma . X = D X D^-1 for
// D = diag(e^G), and diagonal matrices commute with diag(beta) and with taking the strict
// lower part, T = D T_u D^-1 = Gamma . T_u: the main kernel's prep applies the gate
// elementwise, and the inverse leaves its serial chain.
// T_u is stored packed (PackedTu: its ten lower 16 x 16 blocks, 5 KB) per (chunk slot, v-head);
// the main kernel finds a chunk's slot the same way (dense: sequence * chunks_per_seq + chunk,
// varlen: chunk_start[sequence] + chunk).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "sm90/shared/varlen_device.cuh"
#include "sm90/chunk/params.h"
#include "sm90/chunk/segments.cuh"
#include "sm90/chunk/tiles.cuh"
#include "sm90/shared/smem.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/sync.cuh"
#include "ptx/tma.cuh"
#include "ptx/wgmma.cuh"

namespace dsv4 {

// kGrouped: a CTA takes heads_per_cta v-heads of one qk-head. The kernel is near issue-bound
// (ncu: 60-70% of issue slots), and the shared k load and K K^T were ~30% of its instructions
// per v-head. But K K^T then stays live across the v-heads: 80 registers (at 64 and 72 it
// spills), so 6 CTAs per SM instead of the 8 that 64 registers and 28 KB of shared memory
// allow. Grouped wins where it can group (H100: 0.967-0.993 of one v-head per CTA at
// group 2 and 4), and loses 0.5% where it cannot (group 1), which keeps the ungrouped kernel.
template <typename Element, bool kGrouped>
struct ChunkInverseTraits {
  static constexpr int kChunk = 64;
  static constexpr int kThreads = 128;
  static constexpr int kCtasPerSm = kGrouped ? 6 : 8;
  static constexpr int kLd = 72;  // fp16 row stride: 16-byte rows, conflict-free ldmatrix
  static constexpr int kMaxHeadsPerCta = kGrouped ? 4 : 1;
  // T buffers: grouped, one v-head's T_u is stored by warps 2 and 3 while warps 0 and 1 run the
  // next one's forward substitution into the other buffer.
  static constexpr int kTBuffers = kGrouped ? 2 : 1;
  struct alignas(1024) SharedStorage {
    union {
      Element k[2][kChunk][64];  // [K half][token][64], 128-byte swizzle (TMA); dead once
                                 // K K^T has landed (a barrier precedes the first write of t)
      __half t[kTBuffers][kChunk][kLd];
    };
    __half a[kChunk][kLd];
    float beta[kMaxHeadsPerCta][kChunk];  // [v-head of the CTA][token]
    uint64_t full;
  };
  static constexpr uint32_t kLoadBytes = sizeof(Element) * 2 * kChunk * 64;
  static constexpr size_t kSmemBytes = sizeof(SharedStorage) + 1024;  // + alignment slack
  static_assert(kCtasPerSm * (kSmemBytes + 1024) <= 228 * 1024, "shared memory per SM");
};

template <typename Element, bool kGrouped>
__global__ void __launch_bounds__(ChunkInverseTraits<Element, kGrouped>::kThreads,
                                  ChunkInverseTraits<Element, kGrouped>::kCtasPerSm)
    chunk_sm90_inverse_kernel(const __grid_constant__ CUtensorMap tmap_k,
                              const ChunkSm90InverseParams p) {
  using Tr = ChunkInverseTraits<Element, kGrouped>;
  constexpr int kChunk = Tr::kChunk;
  auto& s = *reinterpret_cast<typename Tr::SharedStorage*>(smem_raw + smem_align_offset());

  // The chunk kernel after this one may be queued at once (it waits for this grid itself).
  ptx::griddep_launch_dependents();
  // A segmented call's plan rides in this launch, its CTAs first: it needs none of this
  // kernel's results, and the chunk passes after this launch need both.
  if (static_cast<int>(blockIdx.x) < p.plan_ctas) {
    segment_plan<Element, true, Tr::kThreads>(p.segment_plan, blockIdx.x);
    return;
  }
  const int block = blockIdx.x - p.plan_ctas;
  // This CTA's (chunk slot, v-heads hv0 .. hv0 + heads_per_cta - 1, all of qk-head hv0 / group).
  const int heads_per_cta = kGrouped ? p.heads_per_cta : 1;
  const int ctas_per_slot = p.heads_v / heads_per_cta;
  const int hv0 = block % ctas_per_slot * heads_per_cta;
  const int slot = block / ctas_per_slot;
  int c, len, tma_row, tma_batch;
  int64_t row_base;
  if (p.sequences != nullptr) {
    if (slot >= p.chunk_start[p.num_seqs]) return;  // the grid is an upper bound
    const int n = varlen_detail::sequence_of(p.chunk_start, p.num_seqs, slot);
    const VarlenRows seq = p.sequences[n];
    c = slot - p.chunk_start[n];
    len = seq.len;
    row_base = seq.start;
    tma_row = seq.start + c * kChunk;
    tma_batch = 0;
  } else {
    const int n = slot / p.chunks_per_seq;
    c = slot % p.chunks_per_seq;
    len = p.seqlen;
    row_base = static_cast<int64_t>(n) * p.seqlen;
    tma_row = c * kChunk;
    tma_batch = n;
    if (p.odd_chunks_only && c % 2 == 0) return;  // solved by the chunk kernel's prep
  }
  const int valid_rows = min(kChunk, len - c * kChunk);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const uint32_t full = ptx::smem_addr(&s.full);

  if (tid == 0) {
    ptx::mbarrier_init(full, 1);
    ptx::fence_barrier_init();
  }
  __syncthreads();
  if (tid == 0) {
    ptx::mbarrier_arrive_expect_tx(full, Tr::kLoadBytes);
    for (int cb = 0; cb < 2; ++cb) {
      ptx::tma_load_4d(ptx::smem_addr(&s.k[cb][0][0]), &tmap_k, full, cb * 64, tma_row,
                       hv0 / p.group, tma_batch);
    }
  }
  // Token tid's beta for each of the CTA's v-heads, read while k lands (in shared memory, not
  // registers: the grouped kernel is at its register cap).
  if (tid < kChunk) {
    const float* beta_row = p.beta + (row_base + c * kChunk + tid) * p.heads_v + hv0;
    for (int h = 0; h < heads_per_cta; ++h) {
      s.beta[h][tid] = tid < valid_rows ? beta_row[h] : 0.f;
    }
  }
  ptx::mbarrier_wait(full, 0);
  if (p.qk_l2norm && tid < kChunk) {
    l2norm_rows_in_place<Element>(&s.k[0][0][0], tid);
    ptx::fence_proxy_async_smem();  // the normalized rows are read by wgmma
  }
  __syncthreads();

  // K K^T (token x token), then per v-head A = beta_i k_i.k_j (store_beta_kkt).
  float acc[32];
  k_times_k_transposed<Element>(acc, ptx::smem_addr(&s.k[0][0][0]));
  const int frag_row = warp * 16 + lane / 4, frag_col = 2 * (lane % 4);
  // v-head h's ten lower blocks of T to HBM (PackedTu) by `threads` threads from `first`, 16
  // bytes per thread and step, coalesced. The diagonal blocks' upper triangles are already
  // zero; rows past the sequence become zero.
  auto store_t_u = [&](int h, int first, int threads) {
    const __half(*t)[Tr::kLd] = s.t[h % Tr::kTBuffers];
    Element* dst = static_cast<Element*>(p.t_u) +
                   (static_cast<int64_t>(slot) * p.heads_v + hv0 + h) * PackedTu::kElems;
    for (int u = tid - first; u < PackedTu::kElems / 8; u += threads) {
      int row, col0;
      PackedTu::piece(u, row, col0);
      const uint4 raw = row < valid_rows ? *reinterpret_cast<const uint4*>(&t[row][col0])
                                         : make_uint4(0, 0, 0, 0);
      const __half* x = reinterpret_cast<const __half*>(&raw);
      uint32_t w[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        w[e] = ptx::pack2<Element>(__half2float(x[2 * e]), __half2float(x[2 * e + 1]));
      }
      *reinterpret_cast<uint4*>(dst + 8 * u) = make_uint4(w[0], w[1], w[2], w[3]);
    }
  };
  for (int h = 0; h < heads_per_cta; ++h) {
    store_beta_kkt<Tr::kLd>(acc, s.beta[h], valid_rows, s.a, frag_row, frag_col);
    // A written (the inversion's last barrier follows its last read of A). Grouped: v-head
    // h - 1's T_u store, by warps 2 and 3 under this inversion's step 1, reads the other T
    // buffer, and the barrier after step 1 ends it before step 1 of v-head h + 1 writes there.
    __syncthreads();
    auto store_previous = [&] {
      if (kGrouped && h > 0) store_t_u(h - 1, 64, 64);
    };
    invert_unit_lower_64<Tr::kLd>(s.a, s.t[h % Tr::kTBuffers], warp, lane,
                                  [] { __syncthreads(); }, store_previous);
    if (!kGrouped) store_t_u(h, 0, Tr::kThreads);
  }
  if (kGrouped) store_t_u(heads_per_cta - 1, 0, Tr::kThreads);
}

}  // namespace dsv4
