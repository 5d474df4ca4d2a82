// Plain parameters of the sm90 chunked linear-attention kernels (no torch types; shared by the
// launcher and the kernels).
#pragma once

#include "attention/varlen_schedule.h"

namespace dsv4 {

// The main kernel (csrc/gla/chunk_sm90_kernel.cuh): one CTA per (sequence, v-head, half of V).
struct ChunkSm90Params {
  void* o;                     // (B, T, HV, 128), contiguous, q's dtype; nullptr: state only
  const float* g;              // (B, T, HV), contiguous
  const float* beta;           // (B, T, HV), contiguous; delta rule only
  const float* initial_state;  // (N, HV, 128, 128), contiguous, or nullptr (zeros)
  float* final_state;          // (N, HV, 128, 128), or nullptr (not asked for)
  const VarlenRows* sequences;  // varlen: [N] first row and length, or nullptr (dense: N = B
                                // sequences of length T)
  const int* order;             // varlen: [N] the sequences, the most chunks first
  int seqlen;                  // T
  int heads_v, group;          // group = HV / H; v-head hv reads qk-head hv / group
  float scale;
  bool qk_l2norm;               // delta rule: l2-normalize q and k rows first
  bool state_map;               // S_0 = I and v taken as zeros (not loaded): the final state is
                                // the sequence's state map (the delta rule's segment split)
};

// The delta rule's inverse kernel (csrc/gla/chunk_sm90_inverse.cuh): one CTA per (chunk, v-head).
struct ChunkSm90InverseParams {
  void* t_u;                    // (B, T, HV, 64), q's dtype: row t of T_u at its token's row
  const float* beta;            // (B, T, HV), contiguous
  const VarlenRows* sequences;  // varlen: [N] as above, or nullptr (dense)
  const int* chunk_start;       // varlen: [N + 1] first chunk of each sequence, then the total
  int num_seqs, seqlen;
  int chunks_per_seq;           // dense: ceil(T / 64)
  int heads_v, group;
  bool qk_l2norm;
};

}  // namespace dsv4
