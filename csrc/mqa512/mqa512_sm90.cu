// Host side of the sm90 head_dim-512 shared-KV kernel for fmha: which calls it covers, the
// query-head packing, tensor maps from the tensors' real strides, and the launch.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#include <limits>

#include "common/sm90_host.h"
#include "fmha/fmha.h"
#include "mqa512/mqa512_sm90_kernel.cuh"

namespace dsv4 {
namespace {

template <typename Element>
void launch(const FmhaCall& c, at::Tensor& out, at::Tensor& lse) {
  using T = Mqa512Sm90Traits<Element>;
  auto kernel = mqa512_sm90_kernel<Element>;
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(T::kSmemBytes)));
  const int group = static_cast<int>(c.heads_q / c.heads_kv);
  const int tile_heads = std::min(group, T::kBlockM);
  const int tile_tokens = T::kBlockM / tile_heads;
  const CUtensorMap tq = make_tensor_map_bshd("fmha", c.q, "q", tile_tokens, tile_heads);
  const CUtensorMap tkv = make_tensor_map_bshd("fmha", c.k, "k (= v)", T::kBlockN);

  Mqa512Sm90Params p;
  p.out = out.data_ptr();
  p.lse = lse.data_ptr<float>();
  p.sinks = c.sinks ? c.sinks->data_ptr<float>() : nullptr;
  p.batch = static_cast<int>(c.batch);
  p.seqlen_q = static_cast<int>(c.seqlen_q);
  p.seqlen_k = static_cast<int>(c.seqlen_k);
  p.heads_q = static_cast<int>(c.heads_q);
  p.heads_kv = static_cast<int>(c.heads_kv);
  p.group = group;
  p.tile_tokens = tile_tokens;
  p.tile_heads = tile_heads;
  p.head_blocks = group / tile_heads;
  p.num_m_blocks = static_cast<int>((c.seqlen_q + tile_tokens - 1) / tile_tokens);
  p.scale_log2 = static_cast<float>(c.scale * 1.4426950408889634);
  p.causal = c.causal ? 1 : 0;
  p.window_left = static_cast<int>(c.window_left);

  const int64_t num_work = int64_t(p.num_m_blocks) * p.head_blocks * c.heads_kv * c.batch;
  kernel<<<static_cast<unsigned>(num_work), T::kThreads, T::kSmemBytes,
           at::cuda::getCurrentCUDAStream()>>>(tq, tkv, p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

bool mqa512_sm90_covers(const FmhaCall& c) {
  if (!c.q.is_cuda() || c.varlen || sm90_disabled_by_env()) return false;
  if (!device_info(c.q.get_device()).is_sm90) return false;
  if (c.head_dim != 512 || c.head_dim_v != 512) return false;
  // One tensor read as K and V: the same memory with the same geometry.
  if (c.k.data_ptr() != c.v.data_ptr() || c.k.sizes() != c.v.sizes() ||
      c.k.strides() != c.v.strides()) {
    return false;
  }
  if (!(c.scale > 0.0)) return false;  // the softmax max is taken before scaling
  if (c.batch < 1 || c.seqlen_q < 1 || c.seqlen_k < 1 || c.heads_q < 1) return false;
  // Query heads per KV head pack into 64-row tiles: 64 / group tokens, or group / 64 tiles.
  const int64_t group = c.heads_q / c.heads_kv;
  if (group % 64 != 0 && 64 % group != 0) return false;
  constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
  const int64_t tile_tokens = 64 / std::min<int64_t>(group, 64);
  const int64_t num_work = ((c.seqlen_q + tile_tokens - 1) / tile_tokens) *
                           std::max<int64_t>(group / 64, 1) * c.heads_kv * c.batch;
  if (num_work > kMaxInt || c.seqlen_k > kMaxInt - c.seqlen_q) return false;
  return tma_compatible(c.q) && tma_compatible(c.k);
}

void mqa512_sm90(const FmhaCall& c, at::Tensor& out, at::Tensor& lse) {
  return c.q.scalar_type() == at::kBFloat16 ? launch<__nv_bfloat16>(c, out, lse)
                                             : launch<__half>(c, out, lse);
}

}  // namespace dsv4
