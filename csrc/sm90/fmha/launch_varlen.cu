// The sm90 fmha family's varlen instantiations, in a translation unit of their own so that
// they compile in parallel with the dense ones.
#include "sm90/fmha/launch.cuh"

namespace dsv4 {

void run_fmha_varlen(const FmhaProblem& c, const FmhaPlan& plan, at::Tensor& out, at::Tensor& lse) {
  dispatch<true>(c, plan, out, lse);
}

}  // namespace dsv4
