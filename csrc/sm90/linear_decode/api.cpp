// The decode step's route: the kernel's shapes (K = V = 128, T <= 4) and a contiguous state.
#include "sm90/linear_decode/api.h"

#include <c10/util/Exception.h>

#include <cstdint>

namespace dsv4 {

Route<GatedDeltaDecodePlan> route_gated_delta_decode(const GatedDeltaDecodeProblem& pr,
                                                     const DeviceFacts& device) {
  using R = Route<GatedDeltaDecodePlan>;
  if (!device.sm90) return R::reference(device.why_not);
  if (pr.q.size(0) == 0 || pr.v.size(2) == 0) return R::reference("no sequences or no heads");
  if (pr.q.size(3) != 128 || pr.v.size(3) != 128) return R::reference("K or V is not 128");
  if (pr.q.size(1) > 4) return R::reference("more than 4 tokens per sequence");
  if (!pr.state.is_contiguous() || reinterpret_cast<uintptr_t>(pr.state.data_ptr()) % 16 != 0) {
    return R::reference("a state that is not contiguous and 16-byte aligned");
  }
  for (const at::Tensor* t : {&pr.q, &pr.k, &pr.v}) {
    if (t->stride(3) != 1) return R::reference("q, k or v not contiguous in its last dim");
  }
  return R::kernel({pr.q.size(0) * pr.v.size(2)});
}

std::string describe(const GatedDeltaDecodePlan& plan) {
  return "linear_decode ctas=" + std::to_string(plan.ctas) + " threads=128";
}

#ifndef DSV4_WITH_CUDA
void run_gated_delta_decode(const GatedDeltaDecodeProblem&, const GatedDeltaDecodePlan&,
                            at::Tensor&) {
  TORCH_CHECK(false, "dsv4: this build has no CUDA kernels");
}
#endif

}  // namespace dsv4
