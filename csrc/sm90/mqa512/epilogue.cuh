// The epilogue of the head_dim-512 kernel's consumers: the row sums of both consumers, the sink,
// normalise, store out and lse; a split stores its normalised rows in fp32 and their lse
// without the sink instead (the combine kernel folds the sink in), or, merging in a cluster,
// first takes the other split's rows of the columns this CTA stores (split_merge.cuh).
#pragma once

#include <cstddef>
#include <cstdint>

#include "ptx/mbarrier.cuh"
#include "sm90/mqa512/consumer.cuh"
#include "sm90/mqa512/split_merge.cuh"
#include "sm90/shared/fragment_store.cuh"
#include "sm90/shared/online_softmax.cuh"
#include "sm90/shared/trace.cuh"

namespace dsv4 {

// n: the split's key tiles (0: the work tile loaded no Q, and no sinks with it).
template <typename Element, Mqa512Keys kKeys>
__device__ __forceinline__ void mqa512_epilogue(Mqa512Consumer<Element, kKeys>& c,
                                                const Mqa512Progress& progress, int n) {
  using T = Mqa512Sm90Traits<Element>;
  auto& s = c.s;
  const Mqa512Sm90Params& p = c.p;
  const int wg = c.wg, lane = c.lane, frag_row = c.frag_row, col_lane = c.col_lane;
  const Mqa512WorkTile& w = c.w;
  float total[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) total[i] = quad_sum(c.l_run[i]);
  if (n == 0) c.publish_row_sums(progress);  // otherwise published in the last pair
  c.wait_handoff(kRowSums, progress.slot());
  DSV4_TRACE_STAMP(wg, kTraceRowSums, c.tid == 0);
#pragma unroll
  for (int i = 0; i < 2; ++i) total[i] += s.row_sum[progress.slot()][1 - wg][frag_row + 8 * i];

  const bool merge = p.split_merge > 1;
  if (merge && !mqa512_merge_splits(c, total)) return;  // the other CTA stores these columns
  const bool writes_lse = wg == 0 && lane % 4 == 0;  // merging: in CTA 0 of the cluster

  constexpr float kLog2e = 1.4426950408889634f;
  const bool split = p.num_splits > 1 && !merge;
  Element* out = static_cast<Element*>(p.out);
  const bool has_sink = mqa512_sinks_with_q(p);
  const int tokens_log2 = __ffs(p.tile_tokens) - 1;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = frag_row + 8 * i;
    // tile_tokens is a power of two (plan.h: 64 over a power-of-two head count)
    const int token = w.tok0 + (row & (p.tile_tokens - 1)), head = w.head0 + (row >> tokens_log2);
    float inv, lse;
    // The sink came with Q (a global load here sat on the epilogue's critical path: 12% of the
    // sliding layer's time); a work tile with no keys loaded no Q. (One generic load of either
    // address: selecting the value instead spilled.) A padding row (past the tile's heads)
    // reads shared memory and is never stored.
    const bool real_row = row < p.tile_tokens * p.tile_heads;
    const float* sink_src = n > 0 || !real_row ? &s.sink[progress.q() ^ 1][row] : p.sinks + head;
    const float sink = has_sink ? *sink_src : 0.f;
    finish_row_sum(total[i], c.m_run[i], has_sink, sink * kLog2e, inv, lse);
    if (!p.lse_with_sink) lse = keys_lse(total[i], c.m_run[i]);  // dsv4_attention_paged
    const bool valid = token < w.shape.seqlen_q && real_row;
    const size_t out_token = static_cast<size_t>(w.batch) * p.seqlen_q + w.q_start + token;
    const size_t out_row = out_token * p.heads_q + head;
    if (split) {
      if (!valid) continue;
      const size_t part_row = static_cast<size_t>(w.split) * p.batch * p.seqlen_q * p.heads_q + out_row;
      float* dst = p.o_partial + part_row * T::kHeadDim + wg * 256;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        *reinterpret_cast<float2*>(dst + 8 * j + col_lane) =
            make_float2(c.o[4 * j + 2 * i] * inv, c.o[4 * j + 2 * i + 1] * inv);
      }
      if (wg == 0 && lane % 4 == 0) p.lse_partial[part_row] = lse;
      continue;
    }
    if (valid && writes_lse) {
      p.lse[(static_cast<size_t>(w.batch) * p.heads_q + head) * p.seqlen_q + w.q_start + token] = lse;
    }
    store_fragment_row<Element, 256>(c.o, i, inv, out + out_row * T::kHeadDim + wg * 256, valid,
                                     lane);
  }
  DSV4_TRACE_STAMP(wg, kTraceStored, c.tid == 0);
}

}  // namespace dsv4
