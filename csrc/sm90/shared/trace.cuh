// Compile-time tracing for the sm90 kernels: clock64() stamps per role at named points, read
// by the profiling harnesses (benchmarks/profile/mqa512_harness: build.sh, analyze.py).
//
//   DSV4_TRACE_STAMP(slot, point, leader);
//
// Without -DDSV4_TRACE (the library build) this is an empty statement: nothing is compiled and
// no argument is evaluated, so the stamps stay in the kernels at no cost. With -DDSV4_TRACE it
// records, in the traced CTA only (linear block index g_cta: 0 unless the host sets another)
// and only in a thread whose `leader` is true, one 64-bit event
//   (uint64(point) << 48) | (clock64() & 0xffffffffffff)
// into slot `slot`: g_events[slot * kCapacity + n] with n = g_counts[slot]++. Events past
// kCapacity are counted but not stored. The count is a plain read-modify-write, so give each
// slot one leader (lane == 0 of a warp, threadIdx.x % 128 == 0 of a warpgroup, ...).
//
// Slots (0 .. kMaxSlots - 1: which role writes where) and points (0 .. 65535: where in the
// role) belong to each kernel family, as named constants in its traits; analyze.py reads
// them by number. Nothing here knows a kernel.
//
// With -DDSV4_TRACE this header defines the variables below, so exactly one translation unit
// (the harness) may be compiled with it. Its host code allocates kMaxSlots * kCapacity events,
// writes their address to g_events and zeroes g_counts with cudaMemcpyToSymbol (and g_cta, to
// trace another CTA), launches, then reads the events and g_counts back. Each stamp costs a
// clock read, a load and two stores in its leader thread (the count is in global memory), so
// compare traced timings with traced timings.
#pragma once

#include <cstdint>

namespace dsv4::trace {

constexpr int kMaxSlots = 8;

#ifdef DSV4_TRACE

constexpr bool kEnabled = true;
#ifndef DSV4_TRACE_CAPACITY
#define DSV4_TRACE_CAPACITY 8192
#endif
constexpr int kCapacity = DSV4_TRACE_CAPACITY;  // events per slot
constexpr unsigned long long kClockMask = 0xffffffffffffull;

// Read-only during a launch (constant cache); written by the host before it.
__constant__ unsigned long long* g_events = nullptr;  // [kMaxSlots][kCapacity]; null: no trace
__constant__ int g_cta = 0;                           // the traced CTA, linear block index
__device__ int g_counts[kMaxSlots];                   // events recorded (or dropped) per slot

__device__ __forceinline__ void stamp(int slot, int point, bool leader) {
  if (!leader) return;
  const unsigned cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  if (cta != static_cast<unsigned>(g_cta) || g_events == nullptr) return;
  if (static_cast<unsigned>(slot) >= static_cast<unsigned>(kMaxSlots)) return;
  const unsigned long long t = clock64();  // before the count's load
  const int n = g_counts[slot];
  if (n < kCapacity) {
    g_events[slot * kCapacity + n] =
        (static_cast<unsigned long long>(point & 0xffff) << 48) | (t & kClockMask);
  }
  g_counts[slot] = n + 1;
}

#define DSV4_TRACE_STAMP(slot, point, leader) \
  ::dsv4::trace::stamp(static_cast<int>(slot), static_cast<int>(point), static_cast<bool>(leader))

#else

constexpr bool kEnabled = false;
#define DSV4_TRACE_STAMP(slot, point, leader) \
  do {                                        \
  } while (0)

#endif  // DSV4_TRACE

}  // namespace dsv4::trace
