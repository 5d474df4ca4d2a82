// The head_dim-512 family's dense and CSA instantiations, and the dispatch on the plan's keys.
#include "sm90/mqa512/launch.cuh"

namespace dsv4 {

void run_mqa512(const Mqa512Problem& problem, const Mqa512Plan& plan, at::Tensor& out,
                at::Tensor& lse) {
  if (mqa512_paged_keys(plan.keys)) return run_mqa512_paged(problem, plan, out, lse);
  mqa512_with_element(problem, [&](auto element) {
    using Element = decltype(element);
    if (plan.keys == Mqa512Keys::kGathered) {
      mqa512_launch<Element, Mqa512Keys::kGathered>(problem, plan, out, lse);
    } else {
      mqa512_launch<Element, Mqa512Keys::kTma>(problem, plan, out, lse);
    }
  });
}

}  // namespace dsv4
