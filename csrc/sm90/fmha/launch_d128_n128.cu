// The sm90 fmha kernel at head_dim 128 with 128 keys per tile (causal, windowed and varlen
// calls; plan.cpp's block_n_of), in a translation unit of its own so that these four
// instantiations compile in parallel with the others.
#include "sm90/fmha/launch.cuh"

namespace dsv4 {

void run_fmha_d128_n128(const FmhaProblem& c, const FmhaPlan& plan, at::Tensor& out,
                        at::Tensor& lse) {
  const bool bf16 = c.q.scalar_type() == at::kBFloat16;
  if (c.varlen) {
    return bf16 ? launch<__nv_bfloat16, 128, 128, true>(c, plan, out, lse)
                : launch<__half, 128, 128, true>(c, plan, out, lse);
  }
  return bf16 ? launch<__nv_bfloat16, 128, 128, false>(c, plan, out, lse)
              : launch<__half, 128, 128, false>(c, plan, out, lse);
}

}  // namespace dsv4
