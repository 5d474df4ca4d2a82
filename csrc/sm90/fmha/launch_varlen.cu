// The sm90 fmha kernel's varlen instantiations, in a translation unit of their own so that
// they compile in parallel with the dense ones.
#include "sm90/fmha/launch.cuh"

namespace dsv4 {

void fmha_sm90_varlen(const FmhaCall& c, at::Tensor& out, at::Tensor& lse) {
  dispatch<true>(c, out, lse);
}

}  // namespace dsv4
