// Plain parameters of the sm90 fmha kernel (no torch types; shared by launcher and kernel).
#pragma once

#include <cstdint>

namespace dsv4 {

struct FmhaSm90Params {
  void* out;           // (B, Sq, Hq, Dv), contiguous, q's dtype
  float* lse;          // (B, Hq, Sq), contiguous
  const float* sinks;  // (Hq,) or nullptr
  int batch, seqlen_q, seqlen_k;
  int heads_q, group;  // group = Hq / Hkv; query head h reads KV head h / group
  int num_m_blocks;    // query tiles per (batch, head); work tiles = num_m_blocks * Hq * B
  float scale_log2;    // scale * log2(e), > 0
  int causal;          // bottom-right aligned
  int window_left;     // < 0: no window
};

}  // namespace dsv4
