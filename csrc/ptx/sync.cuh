// Register reallocation and named barriers for warp-specialized kernels.
#pragma once

#include <cstdint>

namespace dsv4::ptx {

// setmaxnreg.inc / .dec: move registers between warpgroups (sm_90a; needs a register cap at
// kernel entry, i.e. __launch_bounds__(threads, 1)).
template <uint32_t kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg takes 24..256, step 8");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}
template <uint32_t kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg takes 24..256, step 8");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}

// bar.sync on named barrier `id` among `threads` threads (a multiple of 32).
__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// bar.arrive: signal named barrier `id` without waiting.
__device__ __forceinline__ void named_barrier_arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// fence.proxy.async: make this thread's generic-proxy shared-memory writes visible to the async
// proxy (wgmma operand reads, TMA stores) that a later barrier orders after them.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Programmatic dependent launch. A grid launched with programmatic stream serialization
// (queue_kernel in sm90/shared/queue_kernel.h) may start once every CTA of the grid before it on
// the stream has called griddep_launch_dependents or exited, and must griddep_wait, in every CTA,
// before it touches global memory: the wait returns when the grids before it have completed
// and their writes are visible (at once in a grid launched without the attribute).
__device__ __forceinline__ void griddep_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
__device__ __forceinline__ void griddep_wait() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

// gridDim.x, read where it is used: a persistent loop's `work += gridDim.x` otherwise keeps it in
// a register through the whole loop body (the head_dim-512 consumers spilled it).
__device__ __forceinline__ int grid_ctas() {
  int n;
  asm volatile("mov.u32 %0, %%nctaid.x;" : "=r"(n));
  return n;
}

// x as an opaque value: what a loop body derives from it is computed there, not hoisted out of
// the loop and kept live through it (the chunk kernel's prep spilled the l2norm's offsets).
__device__ __forceinline__ int opaque(int x) {
  asm volatile("mov.b32 %0, %0;" : "+r"(x));
  return x;
}

}  // namespace dsv4::ptx
