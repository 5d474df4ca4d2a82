// Input validation shared by every launcher. Each failure is a TORCH_CHECK whose message
// names the op, the argument, the requirement and the value seen:
//   "fmha: q must be bf16 or fp16 (got Float)"
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>

namespace dsv4 {

inline std::string shape_str(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) {
    s += (i ? ", " : "") + std::to_string(t.size(i));
  }
  return s + "]";
}

inline void check_defined(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.defined(), op, ": ", name, " must be a defined tensor (got an undefined tensor)");
}

inline void check_half_dtype(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf, op, ": ", name,
              " must be bf16 or fp16 (got ", t.scalar_type(), ")");
}

inline void check_dtype(const char* op, const char* name, const at::Tensor& t, at::ScalarType want) {
  TORCH_CHECK(t.scalar_type() == want, op, ": ", name, " must be ", want, " (got ", t.scalar_type(),
              ")");
}

inline void check_same_dtype(const char* op, const char* name, const at::Tensor& t,
                             const char* ref_name, const at::Tensor& ref) {
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), op, ": ", name, " must have the same dtype as ",
              ref_name, " (", ref_name, ": ", ref.scalar_type(), ", ", name, ": ", t.scalar_type(),
              ")");
}

inline void check_same_device(const char* op, const char* name, const at::Tensor& t,
                              const char* ref_name, const at::Tensor& ref) {
  TORCH_CHECK(t.device() == ref.device(), op, ": ", name, " must be on the same device as ",
              ref_name, " (", ref_name, ": ", ref.device(), ", ", name, ": ", t.device(), ")");
}

inline void check_dim(const char* op, const char* name, const at::Tensor& t, int64_t dim,
                      const char* layout) {
  TORCH_CHECK(t.dim() == dim, op, ": ", name, " must be ", dim, "-D ", layout, " (got shape ",
              shape_str(t), ")");
}

inline void check_size(const char* op, const char* name, const at::Tensor& t, int64_t d,
                       int64_t want, const char* what) {
  TORCH_CHECK(t.size(d) == want, op, ": ", name, ".size(", d, ") (", what, ") must be ", want,
              " (got ", t.size(d), "; shape ", shape_str(t), ")");
}

inline void check_last_dim_contiguous(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.size(-1) <= 1 || t.stride(-1) == 1, op, ": ", name,
              " must be contiguous in its last dim (got stride ", t.stride(-1), ")");
}

// bf16, fp16 or fp32 (an op whose fp32 calls take the reference path).
inline void check_float_dtype(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf ||
                  t.scalar_type() == at::kFloat,
              op, ": ", name, " must be bf16, fp16 or fp32 (got ", t.scalar_type(), ")");
}

// q, k, v: defined, bf16 or fp16 alike (with allow_fp32, fp32 too), on one device.
inline void check_qkv(const char* op, const at::Tensor& q, const at::Tensor& k,
                      const at::Tensor& v, bool allow_fp32 = false) {
  check_defined(op, "q", q);
  check_defined(op, "k", k);
  check_defined(op, "v", v);
  if (allow_fp32) {
    check_float_dtype(op, "q", q);
  } else {
    check_half_dtype(op, "q", q);
  }
  check_same_dtype(op, "k", k, "q", q);
  check_same_dtype(op, "v", v, "q", q);
  check_same_device(op, "k", k, "q", q);
  check_same_device(op, "v", v, "q", q);
}

inline void check_scale(const char* op, std::optional<double> scale) {
  TORCH_CHECK(!scale.has_value() || std::isfinite(*scale), op,
              ": scale must be finite (got ", scale.value_or(0.0), ")");
}

// cu_seqlens: int32 or int64, 1-D, (N+1,). Returns N. Launchers keep an int32 copy
// (as_int32_cu_seqlens) for the kernels.
inline int64_t check_cu_seqlens_shape(const char* op, const char* name, const at::Tensor& cu,
                                      const at::Tensor& ref) {
  check_same_device(op, name, cu, "q", ref);
  TORCH_CHECK(cu.scalar_type() == at::kInt || cu.scalar_type() == at::kLong, op, ": ", name,
              " must be int32 or int64 (got ", cu.scalar_type(), ")");
  TORCH_CHECK(cu.dim() == 1 && cu.size(0) >= 1, op, ": ", name,
              " must be 1-D of length N+1 >= 1 (got shape ", shape_str(cu), ")");
  return cu.size(0) - 1;
}

inline at::Tensor as_int32_cu_seqlens(const at::Tensor& cu) {
  return cu.to(at::kInt).contiguous();  // no copy for a contiguous int32 tensor
}

// Reads cu_seqlens on the host (a sync on CUDA), checks it starts at 0, never decreases and
// ends at `total`; returns the longest sequence (-1 for a meta tensor).
inline int64_t check_cu_seqlens_values(const char* op, const char* name, const at::Tensor& cu,
                                       int64_t total, const char* total_name) {
  if (cu.is_meta()) return -1;  // tracing: the values are not known
  at::Tensor host = cu.to(at::kCPU).to(at::kLong).contiguous();
  const int64_t* v = host.data_ptr<int64_t>();
  const int64_t n = host.size(0) - 1;
  TORCH_CHECK(v[0] == 0, op, ": ", name, " must start at 0 (got ", v[0], ")");
  int64_t longest = 0;
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(v[i + 1] >= v[i], op, ": ", name, " must be non-decreasing (got ", name, "[", i,
                "] = ", v[i], " > ", name, "[", i + 1, "] = ", v[i + 1], ")");
    longest = std::max<int64_t>(longest, v[i + 1] - v[i]);
  }
  TORCH_CHECK(v[n] == total, op, ": ", name, " must end at ", total_name, " = ", total, " (got ",
              v[n], ")");
  return longest;
}

// The longest sequence of a varlen side. Reading cu_seqlens is free on the CPU, where it is
// always checked; on a GPU it is a host sync, taken only when the caller did not pass
// max_seqlen (passing it is the sync-free contract, and the contents are then trusted).
inline int64_t resolve_max_seqlen(const char* op, const char* side, const char* cu_name,
                                  const at::Tensor& cu, int64_t total, const char* total_name,
                                  const char* max_name, int64_t given) {
  if (!cu.device().is_cpu() && given >= 0) return given;
  const int64_t longest = check_cu_seqlens_values(op, cu_name, cu, total, total_name);
  TORCH_CHECK(given < 0 || given >= longest, op, ": ", max_name, " must be >= the longest ",
              side, " sequence (", longest, ") (got ", given, ")");
  return given < 0 ? longest : given;
}

// Head dims the ops accept: positive multiples of 8, at most 512.
inline void check_head_dim(const char* op, const char* name, int64_t d) {
  constexpr int64_t kMaxHeadDim = 512;
  TORCH_CHECK(d > 0 && d % 8 == 0 && d <= kMaxHeadDim, op, ": ", name,
              " must be a positive multiple of 8 and at most ", kMaxHeadDim, " (got ", d, ")");
}

// Per-token gates (g, beta): fp32, bf16 or fp16; the ops compute with them in fp32.
inline void check_gate_dtype(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16 ||
                  t.scalar_type() == at::kHalf,
              op, ": ", name, " must be fp32, bf16 or fp16 (got ", t.scalar_type(), ")");
}

}  // namespace dsv4
