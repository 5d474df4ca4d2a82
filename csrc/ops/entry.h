// Each op's argument list is spelled once in C++: as the parameters of its validating function
// (check_fmha_inputs, ...). Every function registered for the op (the op itself and its _check,
// _path and _plan twins) is OpEntry<check, body>::fn, which takes exactly those parameters,
// validates them and hands the validated call to `body`.
#pragma once

#include <utility>

namespace dsv4 {

template <auto kCheck, auto kBody, typename = decltype(kCheck)>
struct OpEntry;

template <auto kCheck, auto kBody, typename Call, typename... Args>
struct OpEntry<kCheck, kBody, Call (*)(Args...)> {
  static decltype(kBody(std::declval<const Call&>())) fn(Args... args) {
    return kBody(kCheck(args...));
  }
};

// The body of a _check twin: validation only.
template <typename Call>
void validated(const Call&) {}

template <typename Check>
struct CallOf;
template <typename Call, typename... Args>
struct CallOf<Call (*)(Args...)> {
  using type = Call;
};

// A _check twin: validates, returns nothing.
template <auto kCheck>
using CheckEntry = OpEntry<kCheck, &validated<typename CallOf<decltype(kCheck)>::type>>;

}  // namespace dsv4
