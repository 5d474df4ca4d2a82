// The sm90 fmha kernel at head_dim 128 with 128 keys per tile (causal, windowed and varlen
// calls; see fmha_d128_block_n), in a translation unit of its own so that these four
// instantiations compile in parallel with the others.
#include "sm90/fmha/launch.cuh"

namespace dsv4 {

void fmha_sm90_d128_n128(const FmhaCall& c, at::Tensor& out, at::Tensor& lse) {
  const bool bf16 = c.q.scalar_type() == at::kBFloat16;
  if (c.varlen) {
    return bf16 ? launch<__nv_bfloat16, 128, 128, true>(c, out, lse)
                : launch<__half, 128, 128, true>(c, out, lse);
  }
  return bf16 ? launch<__nv_bfloat16, 128, 128, false>(c, out, lse)
              : launch<__half, 128, 128, false>(c, out, lse);
}

}  // namespace dsv4
