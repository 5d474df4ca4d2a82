// Plain parameters of the sm90 chunked linear-attention kernels (no torch types; shared by the
// launcher and the kernels).
#pragma once

#include "sm90/shared/varlen_schedule.h"

namespace dsv4 {

// The main kernel (csrc/sm90/chunk/kernel.cuh): one CTA per (sequence, v-head).
struct ChunkSm90Params {
  void* o;                     // (B, T, HV, 128), contiguous, q's dtype; nullptr: state only
  const float* g;              // (B, T, HV), contiguous
  const float* beta;           // (B, T, HV), contiguous; delta rule only
  const float* initial_state;  // (N, HV, 128, 128), contiguous, or nullptr (zeros): per sequence
  const float* segment_start;  // the segment split's last pass: [N * segments][HV][128][128],
                               // the combine's starting states of the segments after the first
                               // (written for the heads without warm-ups only), or nullptr
  float* final_state;          // (N, HV, 128, 128), or nullptr (not asked for)
  const void* t_u;             // delta rule: [chunk slots][HV][PackedTu::kElems], q's dtype
  const int* chunk_start;      // varlen: [N + 1] first chunk slot of each sequence (dense: the
                               // slot of sequence b's chunk c is b * chunks_per_seq + c)
  int chunks_per_seq;          // dense: ceil(T / 64)
  const VarlenRows* sequences;  // varlen: [N] first row and length, or nullptr (dense: N = B
                                // sequences of length T)
  const int* order;             // varlen: [N] the sequences, the most chunks first
  int seqlen;                  // T
  int segments, segment_len;   // dense: each sequence walked as `segments` segments of
                               // `segment_len` tokens (a multiple of 64), one CTA each; work
                               // item n is segment n % segments of sequence n / segments.
                               // Unsplit: 1 and T. The states are per work item, except:
  int walked_segments;         // the first segments of each sequence this launch walks: all, or
                               // all but the last (state-only passes: the combine never reads
                               // the last segment's state); its CTAs map onto items as above
  bool final_per_sequence;     // the segment split's last pass: only each sequence's last
                               // segment writes the final state, at its sequence's index
  int heads_v, group;          // group = HV / H; v-head hv reads qk-head hv / group
  float scale;
  bool qk_l2norm;               // delta rule: l2-normalize q and k rows first
  float* state_maps;            // delta rule's segment split, state-only passes: non-null
                                // doubles the grid, and its second half starts from S_0 = I
                                // with v taken as zeros (not loaded), so the state written
                                // here is each work item's state map
  const int* warmup;            // segment split: [N][HV] from the segment plan, or nullptr.
                                // A -1 in any segment of a head: the head takes the exact
                                // combine (which then sets all of them to -1). Otherwise a
                                // state-only pass skips the CTA, and the last pass walks its
                                // segment's w chunks before the sequence from S = 0 and writes
                                // o from its first token.
};

// The segment plan kernel (csrc/sm90/chunk/segments.cuh): one CTA per (sequence, v-head)
// of a dense call cut into `segments` segments of `segment_len` tokens (a multiple of 64).
struct ChunkSegmentPlanParams {
  const void* k;                // delta rule: (B, T, H, 128), last dim dense; GLA: nullptr
  int64_t k_stride_b, k_stride_t, k_stride_h;  // in elements
  const float* g;               // (B, T, HV), contiguous
  const float* beta;            // (B, T, HV), contiguous; delta rule only
  int* warmup;                  // out: [B * segments][HV], as ChunkSm90Params::warmup, each
                                // segment's own: -1 where it found no warm-up
  double* gate_sum;             // out (GLA): [B * segments][HV] sum of g over the segment,
                                // for the heads that take the exact combine
  int seqlen, heads_v, group, segments, segment_len;
  int segments_per_cta;         // segments each plan CTA decides: all of a head's (required for
                                // GLA, whose CTA then sums the gates of an exact head), or fewer
  int max_warmup_chunks;        // 0: every head takes the exact combine
  bool qk_l2norm;
};

// The segment combine kernel: the starting state of every segment of the heads the plan marks
// -1, S_(k+1) = A_k S_k + L_k, A_k = M_k (delta rule) or e^(gate_sum_k) (GLA). One CTA per
// (sequence, v-head, 8 state columns).
struct ChunkSegmentCombineParams {
  int* warmup;                  // [B * segments][HV]; every segment of a head it combines is
                                // set to -1 for the last pass
  const double* gate_sum;       // GLA: [B * segments][HV]
  const float* local;           // L_k: [B * segments][HV][128][128]
  const float* maps;            // delta rule: M_k, the same shape
  const float* initial_state;   // [B][HV][128][128], or nullptr (zeros)
  float* start;                 // out: [B * segments][HV][128][128], segments 1 and later of
                                // the heads marked -1 (segment 0 starts from initial_state)
  int heads_v, segments;
};

// The delta rule's inverse kernel (csrc/sm90/chunk/inverse.cuh): one CTA per (chunk,
// heads_per_cta v-heads of one qk-head).
struct ChunkSm90InverseParams {
  void* t_u;                    // [chunk slots][HV][PackedTu::kElems], q's dtype
  const float* beta;            // (B, T, HV), contiguous
  const VarlenRows* sequences;  // varlen: [N] as above, or nullptr (dense)
  const int* chunk_start;       // varlen: [N + 1] first chunk of each sequence, then the total
  int num_seqs, seqlen;
  int chunks_per_seq;           // dense: ceil(T / 64)
  int heads_v, group;
  int heads_per_cta;            // divides group
  bool odd_chunks_only;         // dense: even chunks are solved by the chunk kernel (kFused)
  bool qk_l2norm;
  int plan_ctas;                // a segmented call's plan CTAs, ahead of the inverse's
  ChunkSegmentPlanParams segment_plan;
};

}  // namespace dsv4
