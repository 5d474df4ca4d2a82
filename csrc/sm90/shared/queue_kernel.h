// Queues a kernel with cudaLaunchKernelEx, optionally by programmatic dependent launch; no
// torch, so kernel headers' launchers can use it (host.h's launch_kernel checks the result).
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace dsv4 {

// Queues kernel<<<grid, block, smem, stream>>>(args...) and returns the launch's error.
// follows_previous: by programmatic dependent launch (ptx::griddep_wait and
// griddep_launch_dependents say what the kernel must do), so that its CTAs are resident when
// the kernel before it, the same op's, finishes.
template <typename... Params, typename... Args>
cudaError_t queue_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                         cudaStream_t stream, bool follows_previous, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute follow;
  follow.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  follow.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &follow;
  config.numAttrs = follows_previous ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// Queues kernel<<<grid, block, smem, stream>>>(args...) as clusters of `cluster` CTAs along x
// (grid.x a multiple of it) and returns the launch's error.
template <typename... Params, typename... Args>
cudaError_t queue_cluster_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                                 cudaStream_t stream, unsigned cluster, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute dims;
  dims.id = cudaLaunchAttributeClusterDimension;
  dims.val.clusterDim.x = cluster;
  dims.val.clusterDim.y = 1;
  dims.val.clusterDim.z = 1;
  config.attrs = &dims;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace dsv4
