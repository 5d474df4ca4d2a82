// The sm90 fmha kernel's coverage, and its dense calls (varlen ones: sm90/fmha/launch_varlen.cu; head_dim
// 128 with 128 keys per tile: sm90/fmha/launch_d128_n128.cu).
#include "sm90/fmha/launch.cuh"

namespace dsv4 {

bool fmha_sm90_covers(const FmhaCall& c) {
  if (!c.q.is_cuda()) return false;
  if (sm90_disabled_by_env()) return false;
  if (!device_info(c.q.get_device()).is_sm90) return false;
  if (c.head_dim != c.head_dim_v) return false;
  if (c.head_dim != 64 && c.head_dim != 128 && c.head_dim != 256) return false;
  if (!(c.scale > 0.0)) return false;  // the softmax max is taken before scaling
  constexpr int64_t kMaxInt = (int64_t(1) << 31) - 1;
  if (c.batch < 1 || c.heads_q < 1) return false;
  if (c.varlen) {
    // Rows of the packed tensors (plus a tile past the end) and work-tile slots are int; an
    // empty q or k has no memory to describe (and nothing to compute).
    const int64_t total_q = c.q.size(0), total_k = c.k.size(0);
    if (total_q < 1 || total_k < 1 || total_q > kMaxInt / 2 || total_k > kMaxInt / 2) return false;
    if (varlen_tile_capacity(total_q, c.batch, 64) * c.heads_q > kMaxInt) return false;
  } else {
    if (c.seqlen_q < 1) return false;
    // Work-tile indices are int: (Sq / 64 + 1) * Hq * B must fit.
    if ((c.seqlen_q / 64 + 1) * c.heads_q * c.batch > kMaxInt) return false;
    if (c.seqlen_k < 1) return false;  // an empty K has no memory to describe; nothing to compute
    if (c.seqlen_k > kMaxInt - c.seqlen_q) return false;
  }
  return tma_compatible(as_bshd(c, c.q)) && tma_compatible(as_bshd(c, c.k)) &&
         tma_compatible(as_bshd(c, c.v));
}

void fmha_sm90(const FmhaCall& c, at::Tensor& out, at::Tensor& lse) {
  if (c.varlen) return fmha_sm90_varlen(c, out, lse);
  dispatch<false>(c, out, lse);
}

}  // namespace dsv4
