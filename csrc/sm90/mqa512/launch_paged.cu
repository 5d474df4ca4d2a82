// The head_dim-512 family's paged instantiations (dsv4_attention_paged), in a translation unit
// of their own so that they compile in parallel with the others.
#include "sm90/mqa512/launch.cuh"

namespace dsv4 {

void run_mqa512_paged(const Mqa512Problem& problem, const Mqa512Plan& plan, at::Tensor& out,
                      at::Tensor& lse) {
  mqa512_with_element(problem, [&](auto element) {
    using Element = decltype(element);
    if (plan.keys == Mqa512Keys::kPagedStaged) {
      mqa512_launch<Element, Mqa512Keys::kPagedStaged>(problem, plan, out, lse);
    } else {
      mqa512_launch<Element, Mqa512Keys::kPaged>(problem, plan, out, lse);
    }
  });
}

}  // namespace dsv4
