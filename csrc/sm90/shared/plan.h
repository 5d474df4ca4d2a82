// What every family's launch plan shares: the device facts a plan reads, the route it returns
// (the sm90 kernel with its launch decisions, or the reference path and why), and the TMA rule.
// Host code; the plans are pure functions of a call, these facts and the overrides.
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "sm90/shared/overrides.h"

namespace dsv4 {

struct DeviceFacts {
  bool sm90 = false;    // an sm_90 GPU, and this build has its kernels
  int num_sms = 0;
  const char* why_not = "";  // when not: the reason a plan reports
};

// The facts of q's device under the overrides (DSV4_DISABLE_SM90). for_plan: the _plan ops,
// which also honor DSV4_PLAN_ASSUME_SM90.
DeviceFacts device_facts(const at::Tensor& q, const Overrides& o, bool for_plan = false);

// A family's answer for one call: its kernel with these launch decisions, or not, and why.
template <typename Plan>
struct Route {
  bool sm90 = false;
  std::string why_not;  // when !sm90
  Plan plan{};
  static Route reference(std::string why) { return {false, std::move(why), Plan{}}; }
  static Route kernel(const Plan& plan) { return {true, std::string(), plan}; }
};

// TMA wants a 16-byte aligned base, a unit innermost stride and 16-byte multiples for every
// other stride it uses.
bool tma_compatible(const at::Tensor& t);

}  // namespace dsv4
