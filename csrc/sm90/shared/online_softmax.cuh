// The online softmax of the sm90 attention consumers, on the rows of an m64nN wgmma
// accumulator fragment: this thread holds rows r and r + 8 (r = 16 warp + lane / 4) and, in
// each 8-column group j, columns 8j + 2 (lane % 4) + {0, 1}:
//   acc[4j + 2i + c] = (row r + 8i, col 8j + 2 (lane % 4) + c).
// Scores stay in the log2 domain: x = s * scale_log2 with scale_log2 = scale * log2(e) > 0.
#pragma once

#include <cstdint>

#include "ptx/math.cuh"

namespace dsv4 {

// The exponent base of a row whose running max is `m`: a row that has seen nothing yet (-inf)
// takes 0, so its 2^(x - base) stays 0 instead of NaN.
__device__ __forceinline__ float softmax_base(float m) {
  return m == __int_as_float(0xff800000) ? 0.f : m;
}

// The largest raw score of each of this thread's two rows, reduced across the quad.
template <int kCols>
__device__ __forceinline__ void row_max_scores(const float (&sacc)[kCols / 2], float (&mx)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float m = __int_as_float(0xff800000);
#pragma unroll
    for (int j = 0; j < kCols / 8; ++j) m = fmaxf(m, fmaxf(sacc[4 * j + 2 * i], sacc[4 * j + 2 * i + 1]));
    m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, 1));
    mx[i] = fmaxf(m, __shfl_xor_sync(0xffffffff, m, 2));
  }
}

// Sets to -inf the scores of row i's keys outside [lo[i], hi[i]), both counted from this
// thread's first column (the tile's first key + 2 (lane % 4)): one compare and select per
// bound and score, no branches. kLowerBound = false drops the lower bound (no window).
template <int kCols, bool kLowerBound = true>
__device__ __forceinline__ void mask_outside(float (&sacc)[kCols / 2], const int (&lo)[2],
                                             const int (&hi)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int j = 0; j < kCols / 8; ++j) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int col = 8 * j + c;
        if ((kLowerBound && col < lo[i]) || col >= hi[i]) {
          sacc[4 * j + 2 * i + c] = __int_as_float(0xff800000);
        }
      }
    }
  }
}

// Scores -> 2^(s * scale_log2 - base[row]) in place; `sum` gets this thread's partial row sums.
template <int kCols>
__device__ __forceinline__ void exp2_scores(float (&sacc)[kCols / 2], float scale_log2,
                                            const float (&base)[2], float (&sum)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < kCols / 8; ++j) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const float e = ptx::exp2_approx(fmaf(sacc[4 * j + 2 * i + c], scale_log2, -base[i]));
        sacc[4 * j + 2 * i + c] = e;
        acc += e;
      }
    }
    sum[i] = acc;
  }
}

// How far (log2 units) a score may exceed its row's reference max before raise_lazily raises
// the reference: P stays below 2^8, well inside bf16, fp16 and fp32.
constexpr float kLazyMaxSlack = 8.f;

// The reference max a row's scores are exponentiated against, raised only when a new score
// (log2 domain) exceeds it by more than `slack`: the exponentials then stay below 2^slack (exact
// math: O, the sum and the lse all use the same reference), and most tiles need no rescale.
__device__ __forceinline__ float raise_lazily(float reference, float score, float slack) {
  return score > reference + slack ? score : reference;
}

// Folds a score tile (masked entries at -inf) into the reference max (raised lazily) and the
// sum of the thread's two rows, turns the scores into 2^(x - reference), and sets
// correction[i], the factor the rows of O must be multiplied by before this tile's P V is
// added: exactly 1 when the reference stays (rescale_rows_unless_one then skips the rescale).
template <int kCols>
__device__ __forceinline__ void online_softmax_update(float (&sacc)[kCols / 2], float scale_log2,
                                                      float (&row_max)[2], float (&row_sum)[2],
                                                      float (&correction)[2]) {
  float mx[2], base[2], sum[2];
  row_max_scores<kCols>(sacc, mx);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float reference = raise_lazily(row_max[i], mx[i] * scale_log2, kLazyMaxSlack);
    base[i] = softmax_base(reference);
    correction[i] = reference == row_max[i] ? 1.f : ptx::exp2_approx(row_max[i] - base[i]);
    row_max[i] = reference;
  }
  exp2_scores<kCols>(sacc, scale_log2, base, sum);
#pragma unroll
  for (int i = 0; i < 2; ++i) row_sum[i] = row_sum[i] * correction[i] + sum[i];
}

// P as the A operand of the next wgmma: the accumulator layout of two 8-column groups is the
// m64k16 A fragment, so P converts in place.
template <typename Element, int kCols>
__device__ __forceinline__ void scores_to_a_fragment(const float (&sacc)[kCols / 2],
                                                     uint32_t (&pfrag)[kCols / 16][4]) {
#pragma unroll
  for (int t = 0; t < kCols / 16; ++t) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      pfrag[t][r] = ptx::pack2<Element>(sacc[8 * t + 2 * r], sacc[8 * t + 2 * r + 1]);
    }
  }
}

// O (a 64 x kCols accumulator fragment) times the rows' correction.
template <int kCols>
__device__ __forceinline__ void rescale_rows(float (&o)[kCols / 2], const float (&correction)[2]) {
#pragma unroll
  for (int j = 0; j < kCols / 8; ++j) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      o[4 * j + 2 * i] *= correction[i];
      o[4 * j + 2 * i + 1] *= correction[i];
    }
  }
}

// rescale_rows, skipped when every row of the warp has a factor of exactly 1 (a warp-uniform
// test): with a lazily raised reference max (raise_lazily) that is most tiles.
template <int kCols>
__device__ __forceinline__ void rescale_rows_unless_one(float (&o)[kCols / 2],
                                                        const float (&correction)[2]) {
  if (__all_sync(0xffffffff, correction[0] == 1.f && correction[1] == 1.f)) return;
  rescale_rows<kCols>(o, correction);
}

// A row's sum from this thread's partial sum: added up across the quad.
__device__ __forceinline__ float quad_sum(float partial) {
  partial += __shfl_xor_sync(0xffffffff, partial, 1);
  return partial + __shfl_xor_sync(0xffffffff, partial, 2);
}

// The end of a row whose whole sum is `sum` (log2-domain max `row_max`): with has_sink, folds
// in the sink (`sink_log2`, in log2 units). Gives the factor O's row is multiplied by, and the
// row's lse in natural log: 0 and -inf for a row with nothing visible and no sink.
__device__ __forceinline__ void finish_row_sum(float sum, float row_max, bool has_sink,
                                               float sink_log2, float& inv, float& lse) {
  constexpr float kLn2 = 0.6931471805599453f;
  const float neg_inf = __int_as_float(0xff800000);
  inv = 0.f;
  lse = neg_inf;
  if (has_sink) {
    const float m_all = fmaxf(row_max, sink_log2);
    const float keep = ptx::exp2_approx(row_max - m_all);  // 0 when nothing was visible
    // (A sink of +inf is m_all: its term is 1, not inf - inf, and out is 0.)
    sum = sum * keep + (sink_log2 == m_all ? 1.f : ptx::exp2_approx(sink_log2 - m_all));
    inv = keep / sum;
    lse = (m_all + __log2f(sum)) * kLn2;
  } else if (sum > 0.f) {
    inv = 1.f / sum;
    lse = (row_max + __log2f(sum)) * kLn2;
  }
}

// The lse of the keys alone (no sink) from a row's full sum and max (log2 units): -inf when
// nothing was visible.
__device__ __forceinline__ float keys_lse(float sum, float row_max) {
  constexpr float kLn2 = 0.6931471805599453f;
  return sum > 0.f ? (row_max + __log2f(sum)) * kLn2 : __int_as_float(0xff800000);
}

// finish_row_sum from this thread's partial sum.
__device__ __forceinline__ void finish_row(float partial_sum, float row_max, bool has_sink,
                                           float sink_log2, float& inv, float& lse) {
  finish_row_sum(quad_sum(partial_sum), row_max, has_sink, sink_log2, inv, lse);
}

}  // namespace dsv4
