#include "sm90/shared/plan.h"

#ifdef DSV4_WITH_CUDA
#include "sm90/shared/host.h"
#endif

namespace dsv4 {

DeviceFacts device_facts(const at::Tensor& q, const Overrides& o, bool for_plan) {
  DeviceFacts f;
  if (o.disable_sm90) {
    f.why_not = "DSV4_DISABLE_SM90=1";
  } else if (for_plan && o.plan_assume_sm90_sms > 0) {
    f.sm90 = true;
    f.num_sms = o.plan_assume_sm90_sms;
  } else if (!q.is_cuda()) {
    f.why_not = "not on a CUDA device";
  } else {
#ifdef DSV4_WITH_CUDA
    const DeviceInfo& info = device_info(q.get_device());
    f.sm90 = info.is_sm90;
    f.num_sms = info.num_sms;
    f.why_not = info.is_sm90 ? "" : "not an sm_90 GPU";
#else
    f.why_not = "this build has no CUDA kernels";
#endif
  }
  return f;
}

bool tma_compatible(const at::Tensor& t) {
  const int64_t elem = t.element_size();
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) return false;
  if (t.dim() > 0 && t.size(-1) > 1 && t.stride(-1) != 1) return false;
  for (int64_t d = 0; d + 1 < t.dim(); ++d) {
    if (t.size(d) == 1) continue;  // the stride of a size-1 dim is never used
    const int64_t bytes = t.stride(d) * elem;
    if (bytes <= 0 || bytes % 16 != 0 || bytes >= (int64_t(1) << 40)) return false;
  }
  return true;
}

}  // namespace dsv4
