// Host side of the sm90 chunked linear-attention kernel: which calls it covers, and the launch.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <vector>

#include "gla/chunk_sm90.h"
#include "gla/chunk_sm90_kernel.cuh"

namespace dsv4 {
namespace {

// One launch of the main kernel (after the delta rule's inverse kernel). o: the output's data,
// or nullptr for a state-only pass; final_state may be undefined. t_u: the delta rule's
// inverses when a segmented call already computed them (undefined: computed here).
// state_map: from S = I with v taken as zeros (ChunkSm90Params).
template <typename Element, bool kDelta>
void launch(const ChunkCall& c, void* o, at::Tensor& final_state, at::Tensor t_u = {},
            bool state_map = false) {
  using Tr = ChunkSm90Traits<Element>;
  const char* op = kDelta ? "chunk_gated_delta_rule" : "chunk_simple_gla";
  auto kernel = chunk_sm90_kernel<Element, kDelta>;
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(Tr::kSmemBytes)));
  const CUtensorMap tq = make_tensor_map_bshd(op, c.q, "q", Tr::kChunk);
  const CUtensorMap tk = make_tensor_map_bshd(op, c.k, "k", Tr::kChunk);
  const CUtensorMap tv = make_tensor_map_bshd(op, c.v, "v", Tr::kChunk);
  // Varlen: sequences clamped into the tensors and launched the longest first, planned on the
  // device (cu_seqlens is trusted and never read on the host).
  VarlenSequencePlanBuffers plan;
  if (c.cu_seqlens) plan = build_varlen_sequence_plan(*c.cu_seqlens, c.seqlen, Tr::kChunk);
  // Delta rule: every chunk's ungated inverse first, by a fully parallel kernel.
  if (kDelta && !t_u.defined()) {
    t_u = at::empty({c.batch, c.seqlen, c.heads_v, Tr::kChunk}, c.q.options());
    chunk_sm90_inverse(c, c.cu_seqlens ? &plan : nullptr, t_u);
  }
  const CUtensorMap tt = kDelta ? make_tensor_map_bshd(op, t_u, "T_u", Tr::kChunk) : tv;
  // Small per-token and per-sequence inputs are read with plain loads: make them dense.
  const at::Tensor g = c.g.contiguous();
  const at::Tensor beta = kDelta ? c.beta->contiguous() : at::Tensor();
  const at::Tensor s0 = c.initial_state ? c.initial_state->contiguous() : at::Tensor();

  ChunkSm90Params p;
  p.o = o;
  p.g = g.data_ptr<float>();
  p.beta = kDelta ? beta.data_ptr<float>() : nullptr;
  p.initial_state = s0.defined() ? s0.data_ptr<float>() : nullptr;
  p.final_state = final_state.defined() ? final_state.data_ptr<float>() : nullptr;
  p.sequences = plan.sequences;
  p.order = plan.order;
  p.seqlen = static_cast<int>(c.seqlen);
  p.heads_v = static_cast<int>(c.heads_v);
  p.group = static_cast<int>(c.heads_v / c.heads_qk);
  p.scale = static_cast<float>(c.scale);
  p.qk_l2norm = c.qk_l2norm;
  p.state_map = state_map;

  const dim3 grid(static_cast<unsigned>(c.num_seqs * c.heads_v * 2));  // (sequence, v-head, half)
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(tq, tk, tv, tt, p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// A long sequence is cut into segments walked in parallel when the unsplit grid leaves most
// SMs idle. A state-only pass computes each segment's final state from zero (L_k), the
// segments' starting states follow from a short combine, and a last pass walks every segment
// from its true start and writes o.
//   Simple GLA: the chunk map is S <- gamma S + B with a scalar gamma, so the combine is one
//   product, exact for any gate: S_k = sum_{j<k} e^(E_k - E_(j+1)) L_j + e^(E_k) S_0, with E_k
//   the gate sum before segment k. Two passes in all.
//   Delta rule: the map is S <- A S + B with A = e^(G_last) I - K^T diag(w beta e^G) T K, a
//   128 x 128 matrix per chunk. A second state-only pass from S = I with v = 0 gives each
//   segment's map M_k, and S_(k+1) = M_k S_k + L_k runs over the segments in float64. No
//   warm-up truncation, so it is exact also for g = 0. Three passes in all.
// Dense calls only. DSV4_CHUNK_SEGMENTS=N forces N segments per sequence (1: off), for tests
// and timing.
constexpr int64_t kMaxDeltaSegments = 16;  // the combine is a serial loop of small products

int64_t chunk_segments(const ChunkCall& c) {
  constexpr int64_t kChunk = 64, kMinSegmentChunks = 16;
  const bool delta = c.rule == ChunkRule::kGatedDelta;
  if (c.cu_seqlens) return 1;
  for (const at::Tensor* t : {&c.q, &c.k, &c.v}) {  // (B, T) must merge into one token dim
    if (c.batch > 1 && t->stride(0) != c.seqlen * t->stride(1)) return 1;
  }
  const int64_t chunks = (c.seqlen + kChunk - 1) / kChunk;
  const int64_t most = delta ? std::min(chunks, kMaxDeltaSegments) : chunks;
  if (const char* forced = std::getenv("DSV4_CHUNK_SEGMENTS")) {
    return std::clamp<int64_t>(std::atoll(forced), 1, most);
  }
  // Splitting costs 2 (GLA) or 3 (delta rule) unsplit walks of the sequence, spread over
  // `segments` times the CTAs: worth it only when the unsplit grid fills a small part of the GPU.
  const int64_t ctas = c.num_seqs * c.heads_v * 2;
  const int64_t sms = device_info(c.q.get_device()).num_sms;
  if (ctas * (delta ? 6 : 4) > sms) return 1;
  return std::max<int64_t>(1, std::min({sms / ctas, chunks / kMinSegmentChunks, most}));
}

template <typename Element, bool kDelta>
void launch_segmented(const ChunkCall& c, int64_t segments, at::Tensor& o,
                      at::Tensor& final_state) {
  constexpr int64_t kChunk = 64, kDim = 128;
  const int64_t b = c.batch, t = c.seqlen, hv = c.heads_v;
  const int64_t seg_len = ((t + kChunk - 1) / kChunk + segments - 1) / segments * kChunk;
  const int64_t n = (t + seg_len - 1) / seg_len;  // segments per sequence
  const at::TensorOptions f32 = c.q.options().dtype(at::kFloat);
  // The segments as varlen sequences over the (1, B * T) token rows, built on the device.
  const at::Tensor idx = at::arange(b * n + 1, c.q.options().dtype(at::kLong));
  const at::Tensor cu =
      (idx.div(n, "floor") * t + at::clamp_max(idx.remainder(n) * seg_len, t)).to(at::kInt);
  ChunkCall seg = c;
  seg.q = c.q.view({1, b * t, c.heads_qk, c.dim_k});
  seg.k = c.k.view({1, b * t, c.heads_qk, c.dim_k});
  seg.v = c.v.view({1, b * t, hv, c.dim_v});
  seg.g = c.g.reshape({1, b * t, hv});
  if (kDelta) seg.beta = c.beta->reshape({1, b * t, hv});
  seg.batch = 1;
  seg.seqlen = b * t;
  seg.num_seqs = b * n;
  seg.cu_seqlens = cu;
  seg.initial_state = std::nullopt;
  // The delta rule's inverses, once for all passes: segments start on chunk boundaries.
  at::Tensor t_u;
  if (kDelta) {
    t_u = at::empty({b, t, hv, kChunk}, c.q.options());
    chunk_sm90_inverse(c, nullptr, t_u);
    t_u = t_u.view({1, b * t, hv, kChunk});
  }
  at::Tensor local = at::empty({b * n, hv, kDim, kDim}, f32);
  launch<Element, kDelta>(seg, nullptr, local, t_u);

  // Starting states (B, n, HV, 128, 128), in float64 (gate sums over long segments, chains of
  // maps; no TF32 whatever the flags).
  at::Tensor start;
  if constexpr (kDelta) {
    at::Tensor maps = at::empty({b * n, hv, kDim, kDim}, f32);
    launch<Element, true>(seg, nullptr, maps, t_u, /*state_map=*/true);
    const at::Tensor m = maps.view({b, n, hv, kDim, kDim}).to(at::kDouble);
    const at::Tensor l = local.view({b, n, hv, kDim, kDim}).to(at::kDouble);
    std::vector<at::Tensor> starts;
    starts.push_back(c.initial_state
                         ? c.initial_state->reshape({b, hv, kDim, kDim}).to(at::kDouble)
                         : at::zeros({b, hv, kDim, kDim}, f32.dtype(at::kDouble)));
    for (int64_t k = 0; k + 1 < n; ++k) {
      starts.push_back(at::matmul(m.select(1, k), starts.back()) + l.select(1, k));
    }
    start = at::stack(starts, 1);
  } else {
    const at::Tensor gsum = at::constant_pad_nd(c.g.to(at::kDouble), {0, 0, 0, n * seg_len - t})
                                .view({b, n, seg_len, hv})
                                .sum(2)
                                .permute({0, 2, 1});  // (B, HV, n)
    const at::Tensor before = gsum.cumsum(-1) - gsum;  // E_k
    const at::Tensor weight =
        (before.unsqueeze(-1) - (before + gsum).unsqueeze(-2)).exp().tril(-1);
    start = at::matmul(weight,
                       local.view({b, n, hv, kDim * kDim}).permute({0, 2, 1, 3}).to(at::kDouble));
    if (c.initial_state) {
      start += before.exp().unsqueeze(-1) *
               c.initial_state->reshape({b, hv, 1, kDim * kDim}).to(at::kDouble);
    }
    start = start.permute({0, 2, 1, 3});  // (B, n, HV, 128 * 128)
  }
  seg.initial_state = start.to(at::kFloat).contiguous().view({b * n, hv, kDim, kDim});

  at::Tensor seg_final = at::empty({b * n, hv, kDim, kDim}, f32);
  launch<Element, kDelta>(seg, o.data_ptr(), seg_final, t_u);
  if (final_state.defined()) {
    final_state.copy_(seg_final.view({b, n, hv, kDim, kDim}).select(1, n - 1));
  }
}

}  // namespace

bool chunk_sm90_covers(const ChunkCall& c) {
  if (!c.q.is_cuda() || sm90_disabled_by_env()) return false;
  if (!device_info(c.q.get_device()).is_sm90) return false;
  constexpr int64_t kDim = ChunkSm90Traits<__nv_bfloat16>::kDim;  // K = V the kernel is built for
  if (c.dim_k != kDim || c.dim_v != kDim) return false;
  if (c.seqlen < 1 || c.num_seqs < 1) return false;  // nothing for a tensor map to describe
  constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
  if (c.num_seqs * c.heads_v * 2 > kMaxInt || c.batch * c.seqlen > kMaxInt) return false;
  // The inverse kernel's grid: one CTA per (chunk, v-head), at most T / 64 + N chunks.
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
  if (delta) {
    return bf16 ? launch<__nv_bfloat16, true>(c, o.data_ptr(), final_state)
                : launch<__half, true>(c, o.data_ptr(), final_state);
  }
  return bf16 ? launch<__nv_bfloat16, false>(c, o.data_ptr(), final_state)
              : launch<__half, false>(c, o.data_ptr(), final_state);
}

}  // namespace dsv4
