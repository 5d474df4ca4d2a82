// The sm90 fmha kernel's epilogue, run by each consumer thread after a work tile's mainloop:
// finish the row sums, fold in the sink, normalise, store out and lse; a split stores its
// normalised rows in fp32 and their lse without the sink instead.
#pragma once

#include <cstddef>
#include <cstdint>

#include "sm90/shared/fragment_store.cuh"
#include "sm90/shared/online_softmax.cuh"
#include "sm90/fmha/consumer.cuh"
#include "sm90/fmha/params.h"
#include "sm90/fmha/work_tile.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/wgmma.cuh"

namespace dsv4 {

// Work tile `work`, decoded again so that its fields held no registers through the mainloop.
// Everything up to the stores needs only the row statistics, final since the last softmax: it
// runs while the last PV is in flight, and O is waited for just before them. `v_empty`: the
// ring's v_empty barriers. token[i], head[i]: filled with row row0 + 8 i's token of the
// sequence and query head (arrays of the kernel's: declared here, they compile otherwise).
template <typename T, bool kVarlen>
__device__ __forceinline__ void fmha_epilogue(FmhaConsumer<T, kVarlen>& c, int work,
                                              int num_tiles, const uint64_t* v_empty,
                                              int (&token)[2], int (&head)[2]) {
  using Element = typename T::Element;
  constexpr int kHeadDim = T::kHeadDim;
  constexpr float kLog2e = 1.4426950408889634f;
  const FmhaSm90Params& p = c.p;
  const float neg_inf = __int_as_float(0xff800000);
  const WorkTile w = decode_tile<kVarlen>(p, work);
  const int tokens = tile_tokens<kVarlen, T::kBlockM>(p);
  const int seqlen_q = kVarlen ? w.shape.seqlen_q : p.seqlen_q;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = c.row0 + 8 * i;
    token[i] = w.m_block * tokens + (kVarlen ? row : row % tokens);
    head[i] = w.head0 + (kVarlen ? 0 : row / tokens);
  }
  // (batch, token) -> the row of q/out in the tensors' (B * Sq) tokens.
  const size_t seq_row0 = static_cast<size_t>(w.batch) * p.seqlen_q + w.q_start;
  const bool split_rows = !kVarlen && p.num_splits > 1;
  float sink_log2[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    sink_log2[i] = p.sinks != nullptr && !split_rows ? p.sinks[head[i]] * kLog2e : neg_inf;
  }
  float inv[2], lse[2];  // a split's rows leave the sink to the combine
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    finish_row(c.row_sum[i], c.row_max[i], p.sinks != nullptr && !split_rows, sink_log2[i],
               inv[i], lse[i]);
  }
  // The last PV (none is pending after a tile that saw no key). Unconditional: behind a
  // branch, ptxas serializes every wgmma of the kernel (C7514).
  ptx::wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < kHeadDim / 2; ++i) ptx::fence_operand(c.o[i]);
  if (num_tiles > 0) c.release(ptx::smem_addr(&v_empty[(c.kv_iter - 1) % T::kStages]));
  if (split_rows) {  // rows of the split-major [splits][B * Sq * Hq] partials
    const size_t part0 = static_cast<size_t>(w.split) * p.batch * p.seqlen_q * p.heads_q;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if (token[i] < seqlen_q) {
        const size_t part_row = part0 + (seq_row0 + token[i]) * p.heads_q + head[i];
#pragma unroll
        for (int j = 0; j < kHeadDim / 8; ++j) {
          *reinterpret_cast<float2*>(p.o_partial + part_row * kHeadDim + 8 * j + c.col_lane) =
              make_float2(c.o[4 * j + 2 * i] * inv[i], c.o[4 * j + 2 * i + 1] * inv[i]);
        }
        if (c.lane % 4 == 0) p.lse_partial[part_row] = lse[i];
      }
    }
    return;
  }
  Element* out = static_cast<Element*>(p.out);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const bool valid = token[i] < seqlen_q;
    const size_t row_offset = ((seq_row0 + token[i]) * p.heads_q + head[i]) * kHeadDim;
    store_fragment_row<Element, kHeadDim>(c.o, i, inv[i], out + row_offset, valid, c.lane);
    if (valid && c.lane % 4 == 0) {
      p.lse[(static_cast<size_t>(w.batch) * p.heads_q + head[i]) * p.seqlen_q + w.q_start +
            token[i]] = lse[i];
    }
  }
}

}  // namespace dsv4
