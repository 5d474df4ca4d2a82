// Host side of the sm90 chunk kernels, shared by their launchers (CUDA builds only).
#pragma once

#include <ATen/ATen.h>

#include "sm90/shared/host.h"
#include "sm90/chunk/api.h"
#include "sm90/chunk/params.h"

namespace dsv4 {

// Queues the delta rule's inverse kernel (csrc/sm90/chunk/inverse.cuh) on the current
// stream and returns its output: T_u packed per (chunk slot, v-head), [slots][HV][PackedTu
// elements] in q's dtype. plan: the varlen plan (slots up to its bound), or nullptr when dense.
// segment_plan: a segmented call's plan (chunk_sm90_segment_plan_params), run in the same
// launch, or nullptr. odd_chunks_only (dense): the chunk kernel's prep solves the even chunks of
// each sequence (kFused), whose slots stay unwritten.
at::Tensor chunk_sm90_inverse(const ChunkProblem& c, const VarlenSequencePlanBuffers* plan,
                              const ChunkSegmentPlanParams* segment_plan = nullptr,
                              bool odd_chunks_only = false);

// The segment split of a dense call (csrc/sm90/chunk/segments.cuh), `segments` segments of
// `segment_len` tokens per sequence; warmups: whether the plan may start segments from
// warm-ups. The plan fills warmup (B * segments, HV) int32 and, for simple GLA, gate_sum
// (B * segments, HV) float64; it reads g and (delta rule) beta, dense (B, T, HV) fp32 that the
// caller keeps alive until the launch is queued. Simple GLA's plan runs as a kernel of its own
// (chunk_sm90_segment_plan), the delta rule's inside the inverse kernel's launch. The combine
// fills start (B * segments, HV, 128, 128) fp32 from local (L_k) and, for the delta rule, maps
// (M_k), both of that shape, and sets warmup to -1 for every segment of the heads it combines.
ChunkSegmentPlanParams chunk_sm90_segment_plan_params(const ChunkProblem& c, int64_t segments,
                                                      int64_t segment_len, bool warmups,
                                                      const at::Tensor& g, const at::Tensor& beta,
                                                      at::Tensor& warmup, at::Tensor& gate_sum);
void chunk_sm90_segment_plan(const ChunkProblem& c, const ChunkSegmentPlanParams& p);
void chunk_sm90_segment_combine(const ChunkProblem& c, int64_t segments, at::Tensor& warmup,
                                const at::Tensor& gate_sum, const at::Tensor& local,
                                const at::Tensor& maps, at::Tensor& start);

}  // namespace dsv4
