// The sm90 fmha family's dense calls (varlen ones: launch_varlen.cu; head_dim 128 with 128 keys
// per tile: launch_d128_n128.cu, each a translation unit compiled in parallel).
#include "sm90/fmha/launch.cuh"

namespace dsv4 {

void run_fmha_dense(const FmhaProblem& c, const FmhaPlan& plan, at::Tensor& out, at::Tensor& lse) {
  dispatch<false>(c, plan, out, lse);
}

void run_fmha(const FmhaProblem& c, const FmhaPlan& plan, at::Tensor& out, at::Tensor& lse) {
  if (plan.head_dim == 128 && plan.block_n == 128) return run_fmha_d128_n128(c, plan, out, lse);
  if (c.varlen) return run_fmha_varlen(c, plan, out, lse);
  run_fmha_dense(c, plan, out, lse);
}

}  // namespace dsv4
