// The sm90 chunk family's plan: which calls it takes, whether a long sequence is cut into
// segments walked in parallel, and whether the prep solves half of the delta rule's inverses.
// Same-run timings behind each choice are in docs/chunk.md.
#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>

#include "sm90/chunk/api.h"

namespace dsv4 {
namespace {

constexpr int64_t kChunk = 64, kDim = 128;  // ChunkSm90Traits' kChunk and kDim (launch.cu asserts)
constexpr int64_t kMaxDeltaSegments = 16;   // the combine walks the segments one after another
constexpr int64_t kMinSegmentChunks = 16;

// A long sequence is cut into segments walked in parallel when the unsplit grid fills at most
// half of the SMs (dense calls). Warm-ups cost one walk of a segment plus its warm-up; the exact
// combine costs 2 (GLA) or 3 (delta rule) walks of a segment, so heads without decay lose only
// in the delta rule's two-segment case (measured 1.33x at (1, 32768, 16, 32)).
int64_t segments_of(const ChunkProblem& c, int num_sms, const Overrides& o) {
  if (c.cu_seqlens) return 1;
  const bool delta = c.rule == ChunkRule::kGatedDelta;
  const int64_t chunks = (c.seqlen + kChunk - 1) / kChunk;
  const int64_t most = delta ? std::min(chunks, kMaxDeltaSegments) : chunks;
  if (o.chunk_segments > 0) return std::clamp<int64_t>(o.chunk_segments, 1, most);
  const int64_t ctas = c.num_seqs * c.heads_v;
  if (ctas * 2 > num_sms) return 1;
  return std::max<int64_t>(1, std::min({num_sms / ctas, chunks / kMinSegmentChunks, most}));
}

}  // namespace

Route<ChunkPlan> route_chunk(const ChunkProblem& c, const DeviceFacts& device,
                             const Overrides& o) {
  using R = Route<ChunkPlan>;
  if (!device.sm90) return R::reference(device.why_not);
  if (c.q.scalar_type() != at::kBFloat16 && c.q.scalar_type() != at::kHalf) {
    return R::reference("q is not bf16 or fp16");
  }
  if (c.dim_k != kDim || c.dim_v != kDim) return R::reference("K or V is not 128");
  if (c.seqlen < 1 || c.num_seqs < 1) return R::reference("an empty q");
  constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
  // The inverse kernel's grid: one CTA per chunk and up to four v-heads, at most T / 64 + N
  // chunks.
  if (c.num_seqs * c.heads_v > kMaxInt || c.batch * c.seqlen > kMaxInt ||
      (c.batch * c.seqlen / kChunk + c.num_seqs) * c.heads_v > kMaxInt) {
    return R::reference("2^31 or more rows or work items");
  }
  if (!tma_compatible(c.q) || !tma_compatible(c.k) || !tma_compatible(c.v)) {
    return R::reference("strides TMA cannot describe");
  }
  ChunkPlan plan;
  plan.delta = c.rule == ChunkRule::kGatedDelta;
  plan.varlen = c.cu_seqlens.has_value();
  plan.warmups = o.chunk_warmups;
  const int64_t segments = segments_of(c, device.num_sms, o);
  if (segments > 1) {
    plan.segment_len = ((c.seqlen + kChunk - 1) / kChunk + segments - 1) / segments * kChunk;
    plan.segments = (c.seqlen + plan.segment_len - 1) / plan.segment_len;
    if (plan.segments < 2) plan.segments = 1, plan.segment_len = 0;
  }
  // Half of the delta rule's inverses in the prep: for unsplit dense calls whose grid is more
  // than one wave, where HBM sets the pace and the inverse kernel's bytes count.
  if (plan.delta && !plan.varlen && plan.segments == 1) {
    plan.fused_inverse = o.chunk_fused >= 0 ? o.chunk_fused == 1
                                            : c.num_seqs * c.heads_v > device.num_sms;
  }
  return R::kernel(plan);
}

std::string describe(const ChunkPlan& p) {
  std::string s = std::string("chunk ") + (p.delta ? "delta" : "gla");
  if (p.segments > 1) {
    s += " segments=" + std::to_string(p.segments) + "x" + std::to_string(p.segment_len) +
         (p.warmups ? " warmups" : " exact");
  }
  if (p.delta) s += std::string(" fused=") + (p.fused_inverse ? "1" : "0");
  return s;
}

#ifndef DSV4_WITH_CUDA
void run_chunk(const ChunkProblem&, const ChunkPlan&, at::Tensor&, at::Tensor&) {
  TORCH_CHECK(false, "dsv4: this build has no CUDA kernels");
}
#endif

}  // namespace dsv4
