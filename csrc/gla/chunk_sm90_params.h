// Plain parameters of the sm90 chunked linear-attention kernel (no torch types; shared by the
// launcher and the kernel).
#pragma once

namespace dsv4 {

struct ChunkSm90Params {
  void* o;                     // (B, T, HV, 128), contiguous, q's dtype
  const float* g;              // (B, T, HV), contiguous
  const float* beta;           // (B, T, HV), contiguous; delta rule only
  const float* initial_state;  // (N, HV, 128, 128), contiguous, or nullptr (zeros)
  float* final_state;          // (N, HV, 128, 128), or nullptr (not asked for)
  const int* cu_seqlens;       // (N + 1,) or nullptr (dense: N = B sequences of length T)
  int seqlen;                  // T
  int heads_v, group;          // group = HV / H; v-head hv reads qk-head hv / group
  float scale;
  bool qk_l2norm;               // delta rule: l2-normalize q and k rows first
};

}  // namespace dsv4
