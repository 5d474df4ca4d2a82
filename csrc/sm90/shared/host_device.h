// DSV4_HOST_DEVICE: a small function of a header that both the host compiler and nvcc's device
// code use (a record format's arithmetic, a plan's predicate).
#pragma once

#ifdef __CUDACC__
#define DSV4_HOST_DEVICE __host__ __device__
#else
#define DSV4_HOST_DEVICE
#endif
