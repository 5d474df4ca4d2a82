// Host side of the sm90 chunked linear-attention kernel: which calls it covers, and the launch.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#include <algorithm>
#include <cstdlib>
#include <limits>

#include "sm90/chunk/launch.h"
#include "sm90/chunk/kernel.cuh"

namespace dsv4 {
namespace {

// How one launch walks each sequence: whole, or cut into segments (launch_segmented).
struct Walk {
  int64_t segments = 1;         // per sequence
  int64_t segment_len = 0;      // tokens, a multiple of 64; 0: the whole sequence
  const int* warmup = nullptr;  // the segment plan (ChunkSm90Params::warmup)
  bool skip_last_segment = false;  // ChunkSm90Params::walked_segments = segments - 1
  float* state_maps = nullptr;  // the state maps' pass beside this one (ChunkSm90Params)
  bool final_per_sequence = false;  // ChunkSm90Params::final_per_sequence
  const float* segment_start = nullptr;  // ChunkSm90Params::segment_start
};

// One launch of the main kernel (after the delta rule's inverse kernel). o: the output, c.v's
// shape, or undefined for a state-only pass; final_state may be undefined. t_u: the delta rule's
// inverses when a segmented call already computed them (undefined: computed here).
template <typename Element, bool kDelta, bool kFused = false>
void launch(const ChunkCall& c, const at::Tensor& o, at::Tensor& final_state, at::Tensor t_u = {},
            const Walk& walk = {}) {
  using Tr = ChunkSm90Traits<Element>;
  const char* op = kDelta ? "chunk_gated_delta_rule" : "chunk_simple_gla";
  constexpr auto kernel = chunk_sm90_kernel<Element, kDelta, kFused>;
  allow_dynamic_smem<kernel>(c.q.get_device(), Tr::kSmemBytes);
  const CUtensorMap tq = make_tensor_map_bshd(op, c.q, "q", Tr::kChunk);
  const CUtensorMap tk = make_tensor_map_bshd(op, c.k, "k", Tr::kChunk);
  const CUtensorMap tv = make_tensor_map_bshd(op, c.v, "v", Tr::kChunk);
  // Varlen: sequences clamped into the tensors and launched the longest first, planned on the
  // device (cu_seqlens is trusted and never read on the host).
  VarlenSequencePlanBuffers plan;
  if (c.cu_seqlens) plan = build_varlen_sequence_plan(*c.cu_seqlens, c.seqlen, Tr::kChunk);
  // Delta rule: the chunks' ungated inverses first, by a fully parallel kernel (kFused: only the
  // odd chunks'; the prep solves the even ones).
  if (kDelta && !t_u.defined()) {
    t_u = chunk_sm90_inverse(c, c.cu_seqlens ? &plan : nullptr, nullptr,
                             /*odd_chunks_only=*/kFused);
  }
  const CUtensorMap to = o.defined() ? make_tensor_map_bshd(op, o, "o", Tr::kChunk) : tv;
  // Small per-token and per-sequence inputs are read with plain loads: make them dense.
  const at::Tensor g = c.g.contiguous();
  const at::Tensor beta = kDelta ? c.beta->contiguous() : at::Tensor();
  const at::Tensor s0 = c.initial_state ? c.initial_state->contiguous() : at::Tensor();

  ChunkSm90Params p;
  p.o = o.defined() ? o.data_ptr() : nullptr;
  p.g = g.data_ptr<float>();
  p.beta = kDelta ? beta.data_ptr<float>() : nullptr;
  p.initial_state = s0.defined() ? s0.data_ptr<float>() : nullptr;
  p.final_state = final_state.defined() ? final_state.data_ptr<float>() : nullptr;
  p.t_u = kDelta ? t_u.data_ptr() : nullptr;
  p.chunk_start = plan.chunk_start;
  p.chunks_per_seq = static_cast<int>((c.seqlen + Tr::kChunk - 1) / Tr::kChunk);
  p.sequences = plan.sequences;
  p.order = plan.order;
  p.seqlen = static_cast<int>(c.seqlen);
  p.segments = static_cast<int>(walk.segments);
  p.segment_len = static_cast<int>(walk.segment_len > 0 ? walk.segment_len : c.seqlen);
  p.walked_segments = static_cast<int>(walk.segments - (walk.skip_last_segment ? 1 : 0));
  p.final_per_sequence = walk.final_per_sequence;
  p.heads_v = static_cast<int>(c.heads_v);
  p.group = static_cast<int>(c.heads_v / c.heads_qk);
  p.scale = static_cast<float>(c.scale);
  p.qk_l2norm = c.qk_l2norm;
  p.state_maps = walk.state_maps;
  p.warmup = walk.warmup;
  p.segment_start = walk.segment_start;

  // (sequence, walked segment, v-head), twice when the state maps' pass shares the launch
  const dim3 grid(static_cast<unsigned>(c.num_seqs * p.walked_segments * c.heads_v *
                                        (walk.state_maps != nullptr ? 2 : 1)));
  // Right behind the op's own previous kernel (the inverse, the varlen plan, or a segment
  // split's plan, state-only pass or combine), this launch follows it programmatically.
  const bool follows_own_kernel = kDelta || c.cu_seqlens || walk.warmup != nullptr;
  launch_kernel(kernel, grid, dim3(Tr::kThreads), Tr::kSmemBytes,
                at::cuda::getCurrentCUDAStream(), follows_own_kernel, tq, tk, tv, to, p);
}

// A long sequence is cut into segments walked in parallel when the unsplit grid leaves at
// least half of the SMs idle. Every segment's starting state comes one of two ways, chosen per head on the
// device by the segment plan (csrc/sm90/chunk/segments.cuh):
//   Warm-up: when the history before a segment provably fades to e^-10 within at most a
//   segment's length, the last pass starts that many chunks early from S = 0. The head's
//   state-only passes exit at once. This is FlashQLA's lever, with a checked bound.
//   Exact combine, for the other heads (no decay, g = 0 included):
//     Simple GLA: the chunk map is S <- gamma S + B with a scalar gamma. A state-only pass from
//     zero gives each segment's L_k, and S_(k+1) = e^(E_k) S_k + L_k, with E_k the segment's
//     gate sum. Two passes in all.
//     Delta rule: the map is S <- A S + B with A = e^(G_last) I - K^T diag(w beta e^G) T K, a
//     128 x 128 matrix per chunk. A second state-only pass from S = I with v = 0 gives each
//     segment's map M_k, and S_(k+1) = M_k S_k + L_k. Three passes in all, the two
//     state-only ones in one launch.
//   The combine runs in float64.
// Then a last pass walks every segment and writes o. No host sync: the plan, the passes and
// the combine are queued whatever the plan says.
// Dense calls only. DSV4_CHUNK_SEGMENTS=N forces N segments per sequence (1: off), and
// DSV4_CHUNK_WARMUP=0 sends every head through the exact combine, for tests and timing.
constexpr int64_t kMaxDeltaSegments = 16;  // the combine walks the segments one after another

int64_t chunk_segments(const ChunkCall& c) {
  constexpr int64_t kChunk = 64, kMinSegmentChunks = 16;
  const bool delta = c.rule == ChunkRule::kGatedDelta;
  if (c.cu_seqlens) return 1;
  const int64_t chunks = (c.seqlen + kChunk - 1) / kChunk;
  const int64_t most = delta ? std::min(chunks, kMaxDeltaSegments) : chunks;
  if (const char* forced = std::getenv("DSV4_CHUNK_SEGMENTS")) {
    return std::clamp<int64_t>(std::atoll(forced), 1, most);
  }
  // Taken when the unsplit grid fills at most half of the SMs. Warm-ups cost one walk of a
  // segment plus its warm-up; the exact combine costs 2 (GLA) or 3 (delta rule) walks of a
  // segment, so heads without decay lose only in the delta rule's two-segment case (measured
  // 1.33x at (1, 32768, 16, 32)).
  const int64_t ctas = c.num_seqs * c.heads_v;
  const int64_t sms = device_info(c.q.get_device()).num_sms;
  if (ctas * 2 > sms) return 1;
  return std::max<int64_t>(1, std::min({sms / ctas, chunks / kMinSegmentChunks, most}));
}

// Half of the delta rule's inverses solved by the chunk kernel's prep (kFused): taken for unsplit
// dense calls whose grid is more than one wave, where HBM sets the pace and the inverse kernel's
// bytes count. DSV4_CHUNK_FUSED=0 or 1 forces it off or on (unsplit dense calls only), for tests
// and timing.
bool chunk_fused_inverse(const ChunkCall& c) {
  if (c.cu_seqlens) return false;
  if (const char* forced = std::getenv("DSV4_CHUNK_FUSED")) return std::atoi(forced) != 0;
  return c.num_seqs * c.heads_v > device_info(c.q.get_device()).num_sms;
}

template <typename Element, bool kDelta>
void launch_segmented(const ChunkCall& c, int64_t segments, at::Tensor& o,
                      at::Tensor& final_state) {
  constexpr int64_t kChunk = 64, kDim = 128;
  const int64_t b = c.batch, t = c.seqlen, hv = c.heads_v;
  const int64_t seg_len = ((t + kChunk - 1) / kChunk + segments - 1) / segments * kChunk;
  const int64_t n = (t + seg_len - 1) / seg_len;  // segments per sequence
  TORCH_INTERNAL_ASSERT(n >= 2, "a segment split needs two segments or more, got ", n);
  const at::TensorOptions f32 = c.q.options().dtype(at::kFloat);

  at::Tensor warmup = at::empty({b * n, hv}, c.q.options().dtype(at::kInt));
  at::Tensor gate_sum = kDelta ? at::Tensor() : at::empty({b * n, hv}, f32.dtype(at::kDouble));
  const at::Tensor g = c.g.contiguous();
  const at::Tensor beta = kDelta ? c.beta->contiguous() : at::Tensor();
  const ChunkSegmentPlanParams plan =
      chunk_sm90_segment_plan_params(c, n, seg_len, g, beta, warmup, gate_sum);
  const Walk walk{n, seg_len, warmup.data_ptr<int>()};
  // The delta rule's inverses, once for all passes (segments start on chunk boundaries), with
  // the plan in the same launch.
  at::Tensor t_u;
  if (kDelta) {
    t_u = chunk_sm90_inverse(c, nullptr, &plan);
  } else {
    chunk_sm90_segment_plan(c, plan);
  }
  // The state-only passes start every segment but the last from zero (the delta rule's maps
  // from I, in the same launch); the combine needs no state of the last segment.
  ChunkCall from_zero = c;
  from_zero.initial_state = std::nullopt;
  at::Tensor local = at::empty({b * n, hv, kDim, kDim}, f32);
  at::Tensor maps = kDelta ? at::empty({b * n, hv, kDim, kDim}, f32) : at::Tensor();
  Walk state_walk = walk;
  state_walk.skip_last_segment = true;
  if (kDelta) state_walk.state_maps = maps.data_ptr<float>();
  launch<Element, kDelta>(from_zero, at::Tensor(), local, t_u, state_walk);
  at::Tensor start = at::empty({b * n, hv, kDim, kDim}, f32);
  chunk_sm90_segment_combine(c, n, warmup, gate_sum, local, maps, start);

  Walk last_walk = walk;
  last_walk.final_per_sequence = true;
  last_walk.segment_start = start.data_ptr<float>();
  launch<Element, kDelta>(c, o, final_state, t_u, last_walk);
}

}  // namespace

bool chunk_sm90_covers(const ChunkCall& c) {
  if (!c.q.is_cuda() || sm90_disabled_by_env()) return false;
  if (!device_info(c.q.get_device()).is_sm90) return false;
  constexpr int64_t kDim = ChunkSm90Traits<__nv_bfloat16>::kDim;  // K = V the kernel is built for
  if (c.dim_k != kDim || c.dim_v != kDim) return false;
  if (c.seqlen < 1 || c.num_seqs < 1) return false;  // nothing for a tensor map to describe
  constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
  if (c.num_seqs * c.heads_v > kMaxInt || c.batch * c.seqlen > kMaxInt) return false;
  // The inverse kernel's grid: one CTA per chunk and up to four v-heads, at most T / 64 + N
  // chunks.
  if ((c.batch * c.seqlen / 64 + c.num_seqs) * c.heads_v > kMaxInt) return false;
  return tma_compatible(c.q) && tma_compatible(c.k) && tma_compatible(c.v);
}

void chunk_sm90(const ChunkCall& c, at::Tensor& o, at::Tensor& final_state) {
  const bool bf16 = c.q.scalar_type() == at::kBFloat16;
  const bool delta = c.rule == ChunkRule::kGatedDelta;
  if (const int64_t segments = chunk_segments(c); segments > 1) {
    if (delta) {
      return bf16 ? launch_segmented<__nv_bfloat16, true>(c, segments, o, final_state)
                  : launch_segmented<__half, true>(c, segments, o, final_state);
    }
    return bf16 ? launch_segmented<__nv_bfloat16, false>(c, segments, o, final_state)
                : launch_segmented<__half, false>(c, segments, o, final_state);
  }
  if (delta && chunk_fused_inverse(c)) {
    return bf16 ? launch<__nv_bfloat16, true, true>(c, o, final_state)
                : launch<__half, true, true>(c, o, final_state);
  }
  if (delta) {
    return bf16 ? launch<__nv_bfloat16, true>(c, o, final_state)
                : launch<__half, true>(c, o, final_state);
  }
  return bf16 ? launch<__nv_bfloat16, false>(c, o, final_state)
              : launch<__half, false>(c, o, final_state);
}

}  // namespace dsv4
