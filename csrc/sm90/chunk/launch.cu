// The sm90 chunk family's launch: the main kernel (after the delta rule's inverse kernel), one
// pass or a segment split's passes and combine, as the plan (plan.cpp) decides.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#include <algorithm>

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
void launch(const ChunkProblem& c, const at::Tensor& o, at::Tensor& final_state, at::Tensor t_u = {},
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

// A long sequence cut into segments walked in parallel (plan.cpp decides when). Every
// segment's starting state comes one of two ways, chosen per head on the device by the segment
// plan (csrc/sm90/chunk/segments.cuh):
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
template <typename Element, bool kDelta>
void launch_segmented(const ChunkProblem& c, const ChunkPlan& plan, at::Tensor& o,
                      at::Tensor& final_state) {
  constexpr int64_t kDim = ChunkSm90Traits<Element>::kDim;
  const int64_t b = c.batch, hv = c.heads_v;
  const int64_t seg_len = plan.segment_len, n = plan.segments;  // segments per sequence
  const at::TensorOptions f32 = c.q.options().dtype(at::kFloat);

  at::Tensor warmup = at::empty({b * n, hv}, c.q.options().dtype(at::kInt));
  at::Tensor gate_sum = kDelta ? at::Tensor() : at::empty({b * n, hv}, f32.dtype(at::kDouble));
  const at::Tensor g = c.g.contiguous();
  const at::Tensor beta = kDelta ? c.beta->contiguous() : at::Tensor();
  const ChunkSegmentPlanParams segment_plan =
      chunk_sm90_segment_plan_params(c, n, seg_len, plan.warmups, g, beta, warmup, gate_sum);
  const Walk walk{n, seg_len, warmup.data_ptr<int>()};
  // The delta rule's inverses, once for all passes (segments start on chunk boundaries), with
  // the plan in the same launch.
  at::Tensor t_u;
  if (kDelta) {
    t_u = chunk_sm90_inverse(c, nullptr, &segment_plan);
  } else {
    chunk_sm90_segment_plan(c, segment_plan);
  }
  // The state-only passes start every segment but the last from zero (the delta rule's maps
  // from I, in the same launch); the combine needs no state of the last segment.
  ChunkProblem from_zero = c;
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

void run_chunk(const ChunkProblem& c, const ChunkPlan& plan, at::Tensor& o,
               at::Tensor& final_state) {
  static_assert(ChunkSm90Traits<__half>::kChunk == 64 && ChunkSm90Traits<__half>::kDim == 128,
                "plan.cpp's numbers");
  const bool bf16 = c.q.scalar_type() == at::kBFloat16;
  const bool delta = plan.delta;
  if (plan.segments > 1) {
    if (delta) {
      return bf16 ? launch_segmented<__nv_bfloat16, true>(c, plan, o, final_state)
                  : launch_segmented<__half, true>(c, plan, o, final_state);
    }
    return bf16 ? launch_segmented<__nv_bfloat16, false>(c, plan, o, final_state)
                : launch_segmented<__half, false>(c, plan, o, final_state);
  }
  if (delta && plan.fused_inverse) {
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
