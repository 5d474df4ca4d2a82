// Host side of the sm90 fmha kernel: which calls it covers, tensor-map encoding from the
// tensors' real strides, and the launch.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "common/sm90_host.h"
#include "fmha/fmha.h"
#include "fmha/fmha_sm90_kernel.cuh"

namespace dsv4 {
namespace {

// A persistent grid (one CTA per SM, static stride over work tiles) overlaps each CTA's next Q
// load with its last PV and epilogue: that pays when a work tile has few key tiles (measured:
// non-causal Sk = 1k, +10-15%). A static stride balances only equal work tiles, so causal and
// windowed calls, and long Sk where the per-tile overhead is amortised, get one CTA per work
// tile and the hardware's dynamic scheduling (benchmarks/NOTES.md has the timings).
// DSV4_FMHA_GRID=persistent|per_tile overrides the choice, for timing the variants.
bool use_persistent_grid(const FmhaCall& c) {
  const char* grid = std::getenv("DSV4_FMHA_GRID");
  if (grid != nullptr && std::strcmp(grid, "persistent") == 0) return true;
  if (grid != nullptr && std::strcmp(grid, "per_tile") == 0) return false;
  constexpr int64_t kMaxPersistentSeqlenK = 4096;
  return !c.causal && c.window_left < 0 && c.seqlen_k <= kMaxPersistentSeqlenK;
}

template <typename Element, int kHeadDim>
void launch(const FmhaCall& c, at::Tensor& out, at::Tensor& lse) {
  using T = FmhaSm90Traits<Element, kHeadDim>;
  auto kernel = fmha_sm90_kernel<Element, kHeadDim>;
  // Per function and device; cheap, so set on every launch rather than tracking devices.
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(T::kSmemBytes)));
  const CUtensorMap tq = make_tensor_map_bshd("fmha", c.q, "q", T::kBlockM);
  const CUtensorMap tk = make_tensor_map_bshd("fmha", c.k, "k", T::kBlockN);
  const CUtensorMap tv = make_tensor_map_bshd("fmha", c.v, "v", T::kBlockN);

  FmhaSm90Params p;
  p.out = out.data_ptr();
  p.lse = lse.data_ptr<float>();
  p.sinks = c.sinks ? c.sinks->data_ptr<float>() : nullptr;
  p.batch = static_cast<int>(c.batch);
  p.seqlen_q = static_cast<int>(c.seqlen_q);
  p.seqlen_k = static_cast<int>(c.seqlen_k);
  p.heads_q = static_cast<int>(c.heads_q);
  p.group = static_cast<int>(c.heads_q / c.heads_kv);
  p.num_m_blocks = static_cast<int>((c.seqlen_q + T::kBlockM - 1) / T::kBlockM);
  p.scale_log2 = static_cast<float>(c.scale * 1.4426950408889634);
  p.causal = c.causal ? 1 : 0;
  p.window_left = static_cast<int>(c.window_left);

  const int64_t num_work = int64_t(p.num_m_blocks) * c.heads_q * c.batch;
  const dim3 grid(static_cast<unsigned>(
      use_persistent_grid(c) ? std::min<int64_t>(num_work, device_info(c.q.get_device()).num_sms)
                             : num_work));
  kernel<<<grid, T::kThreads, T::kSmemBytes, at::cuda::getCurrentCUDAStream()>>>(tq, tk, tv, p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

bool fmha_sm90_covers(const FmhaCall& c) {
  if (!c.q.is_cuda() || c.varlen) return false;
  if (sm90_disabled_by_env()) return false;
  if (!device_info(c.q.get_device()).is_sm90) return false;
  if (c.head_dim != c.head_dim_v) return false;
  if (c.head_dim != 64 && c.head_dim != 128 && c.head_dim != 256) return false;
  if (!(c.scale > 0.0)) return false;  // the softmax max is taken before scaling
  constexpr int64_t kMaxInt = (int64_t(1) << 31) - 1;
  if (c.batch < 1 || c.seqlen_q < 1 || c.heads_q < 1) return false;
  // Work-tile indices are int: (Sq / 64 + 1) * Hq * B must fit.
  if ((c.seqlen_q / 64 + 1) * c.heads_q * c.batch > kMaxInt) return false;
  if (c.seqlen_k < 1) return false;  // an empty K has no memory to describe; nothing to compute
  if (c.seqlen_k > kMaxInt - c.seqlen_q) return false;
  return tma_compatible(c.q) && tma_compatible(c.k) && tma_compatible(c.v);
}

void fmha_sm90(const FmhaCall& c, at::Tensor& out, at::Tensor& lse) {
  const bool bf16 = c.q.scalar_type() == at::kBFloat16;
  switch (c.head_dim) {
    case 64:
      return bf16 ? launch<__nv_bfloat16, 64>(c, out, lse) : launch<__half, 64>(c, out, lse);
    case 128:
      return bf16 ? launch<__nv_bfloat16, 128>(c, out, lse) : launch<__half, 128>(c, out, lse);
    case 256:
      return bf16 ? launch<__nv_bfloat16, 256>(c, out, lse) : launch<__half, 256>(c, out, lse);
    default:
      TORCH_CHECK(false, "fmha: the sm90 kernel has no head_dim ", c.head_dim);
  }
}

}  // namespace dsv4
