// Queues a kernel with cudaLaunchKernelEx, optionally by programmatic dependent launch and as
// clusters; no torch, so kernel headers' launchers can use it (host.h's launch_kernel checks the
// result).
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace dsv4 {

// How a kernel is queued behind the stream's previous work.
struct QueueOptions {
  // By programmatic dependent launch (ptx::griddep_wait and griddep_launch_dependents say what
  // the kernel must do), so that its CTAs are resident when the kernel before it finishes.
  bool follows_previous = false;
  unsigned cluster = 1;  // CTAs per cluster along x (grid.x a multiple of it); 1: no clusters
};

// Queues kernel<<<grid, block, smem, stream>>>(args...) as `options` say and returns the
// launch's error.
template <typename... Params, typename... Args>
cudaError_t queue_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                         cudaStream_t stream, QueueOptions options, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attrs[2];
  config.attrs = attrs;
  if (options.follows_previous) {
    attrs[config.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[config.numAttrs].val.programmaticStreamSerializationAllowed = 1;
    ++config.numAttrs;
  }
  if (options.cluster > 1) {
    attrs[config.numAttrs].id = cudaLaunchAttributeClusterDimension;
    attrs[config.numAttrs].val.clusterDim.x = options.cluster;
    attrs[config.numAttrs].val.clusterDim.y = 1;
    attrs[config.numAttrs].val.clusterDim.z = 1;
    ++config.numAttrs;
  }
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// The same, follows_previous alone.
template <typename... Params, typename... Args>
cudaError_t queue_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                         cudaStream_t stream, bool follows_previous, Args&&... args) {
  return queue_kernel(kernel, grid, block, smem, stream, QueueOptions{follows_previous},
                      std::forward<Args>(args)...);
}

}  // namespace dsv4
