// The fused merge's route: which calls it takes, and how wide its accesses are.
#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>

#include "sm90/merge/api.h"

namespace dsv4 {
namespace {

constexpr int64_t kThreadsPerBlock = 256;  // kMergeStatesThreads (launch.cu asserts)

// 16-byte accesses need every row start on a 16-byte boundary ((B, T, H, Dv) view).
bool rows_aligned(const at::Tensor& out, int64_t vec) {
  const at::Tensor t = out.dim() == 4 ? out : out.unsqueeze(0);
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) return false;
  for (int i = 0; i < 3; ++i) {
    if (t.size(i) > 1 && t.stride(i) % vec != 0) return false;
  }
  return t.size(3) % vec == 0;
}

}  // namespace

Route<MergePlan> route_merge(const MergeProblem& pr, const DeviceFacts& device, const Overrides&) {
  using R = Route<MergePlan>;
  if (!device.sm90) return R::reference(device.why_not);
  if (pr.out_a.numel() == 0) return R::reference("empty inputs");
  // Element indices of one (row, column) are unsigned 32-bit in the kernel.
  if (pr.out_a.numel() > std::numeric_limits<int>::max()) return R::reference("2^31 or more elements");
  for (const at::Tensor* t : {&pr.out_a, &pr.out_b}) {
    if (t->size(-1) > 1 && t->stride(-1) != 1) return R::reference("a last dim that is not contiguous");
  }
  MergePlan plan;
  const int64_t vec = 16 / pr.out_a.element_size();
  if (rows_aligned(pr.out_a, vec) && rows_aligned(pr.out_b, vec)) {
    plan.vec = static_cast<int>(vec);
    plan.per_thread = pr.out_a.size(-1) % (vec * 4) == 0 ? 4 : 1;
  }
  const int64_t threads = pr.out_a.numel() / (plan.vec * plan.per_thread);
  plan.blocks = std::clamp<int64_t>((threads + kThreadsPerBlock - 1) / kThreadsPerBlock, 1,
                                    int64_t(device.num_sms) * 16);
  return R::kernel(plan);
}

std::string describe(const MergePlan& p) {
  return "merge vec=" + std::to_string(p.vec) + " per_thread=" + std::to_string(p.per_thread) +
         " blocks=" + std::to_string(p.blocks);
}

#ifndef DSV4_WITH_CUDA
void run_merge(const MergeProblem&, const MergePlan&, at::Tensor&, at::Tensor&) {
  TORCH_CHECK(false, "merge_attn_states: this build has no CUDA kernels");
}
#endif

}  // namespace dsv4
