// The gated delta rule's decode step (kernel.cuh): plain parameters, no torch.
#pragma once

#include <cstdint>

namespace dsv4 {

struct GatedDeltaDecodeParams {
  const void *q, *k, *v;          // (B, T, H, K), (B, T, H, K), (B, T, HV, V); strides below
  const float *g, *beta;          // (B, T, HV) fp32, contiguous
  void* state;                    // (N, HV, K, V), contiguous, fp32 or bf16; updated in place
  const void* state_indices;      // (B,) int32 / int64, or nullptr: sequence b uses state b
  bool indices_64;
  void* o;                        // (B, T, HV, V) contiguous, v's dtype
  int64_t q_stride[3], k_stride[3], v_stride[3];  // elements, dims (B, T, H) of q, k, v
  int batch, tokens, heads_qk, heads_v;
  int64_t num_states;             // N: slots at or past it are skipped like -1
  float scale;
  bool qk_l2norm;
};

}  // namespace dsv4
