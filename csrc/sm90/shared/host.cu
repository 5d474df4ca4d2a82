#include "sm90/shared/host.h"

#include <c10/cuda/CUDAException.h>
#include <cudaTypedefs.h>

#include <mutex>
#include <sstream>

namespace dsv4 {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult status;
    C10_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000,
                                                    cudaEnableDefault, &status));
    TORCH_CHECK(status == cudaDriverEntryPointSuccess && ptr != nullptr,
                "dsv4: cuTensorMapEncodeTiled is not available from the CUDA driver (status ",
                static_cast<int>(status), ")");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  }();
  return fn;
}

}  // namespace

const DeviceInfo& device_info(int device) {
  constexpr int kMaxDevices = 64;
  static std::once_flag flags[kMaxDevices];
  static DeviceInfo info[kMaxDevices];
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "dsv4: CUDA device index must be in [0, ",
              kMaxDevices, ") (got ", device, ")");
  std::call_once(flags[device], [device] {
    cudaDeviceProp prop;
    C10_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    info[device].is_sm90 = prop.major == 9 && prop.minor == 0;
    info[device].num_sms = prop.multiProcessorCount;
  });
  return info[device];
}

CUtensorMap make_tensor_map_bshd(const char* op, const at::Tensor& t, const char* name,
                                 uint32_t box_rows, uint32_t box_heads) {
  TORCH_CHECK(t.dim() == 4 && t.numel() > 0, op, ": cannot describe ", name,
              " with a tensor map (shape ", t.sizes(), ")");
  const int64_t elem = t.element_size();
  cuuint64_t dims[4] = {static_cast<cuuint64_t>(t.size(3)), static_cast<cuuint64_t>(t.size(1)),
                        static_cast<cuuint64_t>(t.size(2)), static_cast<cuuint64_t>(t.size(0))};
  const int64_t torch_dim[3] = {1, 2, 0};  // tensor-map dims 1..3 -> torch dims
  cuuint64_t strides[3];
  for (int i = 0; i < 3; ++i) {
    const int64_t d = torch_dim[i];
    // A size-1 dim's stride is never used; give TMA any valid value.
    strides[i] = t.size(d) == 1 ? 16 * ((t.size(3) * elem + 15) / 16)
                                : static_cast<cuuint64_t>(t.stride(d) * elem);
  }
  // The box's inner dim is one 128-byte swizzle atom: 64 16-bit or 128 FP8 elements.
  TORCH_CHECK(elem == 1 || elem == 2, op, ": ", name, " must have 1- or 2-byte elements for its "
              "tensor map (got ", t.scalar_type(), ")");
  cuuint32_t box[4] = {static_cast<cuuint32_t>(128 / elem), box_rows, box_heads, 1};
  cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUtensorMapDataType dtype = elem == 1 ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                    : t.scalar_type() == at::kBFloat16
                                        ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                        : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  CUtensorMap map;
  const CUresult res = encode_fn()(&map, dtype, 4, t.data_ptr(), dims, strides, box, elem_strides,
                                   CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                   CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (res != CUDA_SUCCESS) {
    std::ostringstream msg;
    msg << op << ": cuTensorMapEncodeTiled failed for " << name << " (CUresult " << res
        << "): dims (d, s, h, b) = [" << dims[0] << ", " << dims[1] << ", " << dims[2] << ", "
        << dims[3] << "], byte strides (s, h, b) = [" << strides[0] << ", " << strides[1] << ", "
        << strides[2] << "], box = [" << box[0] << ", " << box[1] << ", " << box[2] << ", 1], base "
        << t.data_ptr();
    TORCH_CHECK(false, msg.str());
  }
  return map;
}

}  // namespace dsv4
