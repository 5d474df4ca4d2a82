// The one op registry: every dsv4 schema, and its CPU and CUDA implementations.
// Each launcher validates its inputs, then picks the sm90 kernel or the portable reference path.
#include <Python.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <torch/library.h>

#include <string>

#include "ops/dsv4_attention.h"
#include "ops/fmha.h"
#include "generated/build_info.h"  // written by setup.py
#include "ops/chunk.h"

// An importable module so `import dsv4_attn._C` loads this library (abi3, no pybind). Its
// constants say what the build used; dsv4_attn.build_info() reads them.
extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  PyObject* m = PyModule_Create(&module_def);
  if (m == nullptr) return nullptr;
#ifdef DSV4_WITH_CUDA
  const int with_cuda = 1;
#else
  const int with_cuda = 0;
#endif
  if (PyModule_AddIntConstant(m, "with_cuda", with_cuda) < 0 ||
      PyModule_AddStringConstant(m, "cuda_archs", DSV4_BUILD_CUDA_ARCHS) < 0 ||
      PyModule_AddStringConstant(m, "cuda_toolkit", DSV4_BUILD_CUDA_TOOLKIT) < 0 ||
      PyModule_AddStringConstant(m, "torch_version", DSV4_BUILD_TORCH_VERSION) < 0 ||
      PyModule_AddStringConstant(m, "torch_cuda", DSV4_BUILD_TORCH_CUDA) < 0 ||
      PyModule_AddIntConstant(m, "cplusplus", static_cast<long>(__cplusplus)) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}

namespace {
// The Autograd kernel of every compute op. The ops have no backward formula, so a call that
// autograd would have to differentiate is refused here, in eager and under torch.compile
// alike, instead of yielding None gradients (or an unrelated error) at backward time.
void forward_only(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                  torch::jit::Stack* stack) {
  const auto& schema_args = op.schema().arguments();
  if (at::GradMode::is_enabled()) {
    const auto args = torch::jit::last(*stack, schema_args.size());
    for (size_t i = 0; i < schema_args.size(); ++i) {
      if (!args[i].isTensor()) continue;  // None, scalars
      const at::Tensor& t = args[i].toTensor();
      if (!t.defined() || !t.requires_grad()) continue;
      const std::string& full = op.schema().name();  // "dsv4::<op>"
      TORCH_CHECK(false, full.substr(full.find("::") + 2), ": ", schema_args[i].name(),
                  " requires grad, but the dsv4 ops are forward-only (they have no backward); "
                  "call them under torch.no_grad() or torch.inference_mode(), or pass ",
                  schema_args[i].name(), ".detach()");
    }
  }
  at::AutoDispatchBelowADInplaceOrView guard;
  op.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
}
}  // namespace

namespace {
// The argument lists of the compute ops. Each op also has a private `_<op>_check` twin with the
// same arguments that only validates them; the fake (tracing) kernels in dsv4_attn/ops.py run
// it on meta tensors of the traced shapes, so tracing rejects exactly what the op rejects.
constexpr const char* kFmhaArgs =
    "(Tensor q, Tensor k, Tensor v, *, float? scale=None, bool causal=False, "
    "int window_left=-1, Tensor? sinks=None, Tensor? cu_seqlens_q=None, "
    "Tensor? cu_seqlens_k=None, int max_seqlen_q=-1, int max_seqlen_k=-1)";
constexpr const char* kDsv4Args =
    "(Tensor q, Tensor kv, *, Tensor? sinks=None, int window=128, Tensor? compressed_kv=None, "
    "int compress_ratio=0, Tensor? topk_indices=None, float? scale=None, "
    "Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_kv=None, "
    "Tensor? cu_seqlens_compressed=None, int max_seqlen_q=-1, int max_seqlen_kv=-1)";
constexpr const char* kMergeArgs = "(Tensor out_a, Tensor lse_a, Tensor out_b, Tensor lse_b)";
constexpr const char* kGatedDeltaArgs =
    "(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, *, float? scale=None, "
    "Tensor? initial_state=None, bool output_final_state=False, Tensor? cu_seqlens=None, "
    "bool use_qk_l2norm_in_kernel=False)";
constexpr const char* kSimpleGlaArgs =
    "(Tensor q, Tensor k, Tensor v, Tensor g, *, float? scale=None, "
    "Tensor? initial_state=None, bool output_final_state=False, Tensor? cu_seqlens=None)";

std::string schema(const char* name, const char* args, const char* returns) {
  return std::string(name) + args + " -> " + returns;
}

void fmha_check(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                std::optional<double> scale, bool causal, int64_t window_left,
                const std::optional<at::Tensor>& sinks,
                const std::optional<at::Tensor>& cu_seqlens_q,
                const std::optional<at::Tensor>& cu_seqlens_k, int64_t max_seqlen_q,
                int64_t max_seqlen_k) {
  dsv4::check_fmha_inputs(q, k, v, scale, causal, window_left, sinks, cu_seqlens_q,
                          cu_seqlens_k, max_seqlen_q, max_seqlen_k);
}

void dsv4_attention_check(const at::Tensor& q, const at::Tensor& kv,
                          const std::optional<at::Tensor>& sinks, int64_t window,
                          const std::optional<at::Tensor>& compressed_kv, int64_t compress_ratio,
                          const std::optional<at::Tensor>& topk_indices,
                          std::optional<double> scale,
                          const std::optional<at::Tensor>& cu_seqlens_q,
                          const std::optional<at::Tensor>& cu_seqlens_kv,
                          const std::optional<at::Tensor>& cu_seqlens_compressed,
                          int64_t max_seqlen_q, int64_t max_seqlen_kv) {
  dsv4::check_dsv4_inputs(q, kv, sinks, window, compressed_kv, compress_ratio, topk_indices,
                          scale, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_compressed,
                          max_seqlen_q, max_seqlen_kv);
}

void chunk_gated_delta_rule_check(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& g, const at::Tensor& beta,
                                  std::optional<double> scale,
                                  const std::optional<at::Tensor>& initial_state,
                                  bool output_final_state,
                                  const std::optional<at::Tensor>& cu_seqlens, bool) {
  dsv4::check_chunk_inputs("chunk_gated_delta_rule", dsv4::ChunkRule::kGatedDelta, q, k, v, g,
                           beta, scale, initial_state, output_final_state, cu_seqlens);
}

void chunk_simple_gla_check(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& g, std::optional<double> scale,
                            const std::optional<at::Tensor>& initial_state,
                            bool output_final_state,
                            const std::optional<at::Tensor>& cu_seqlens) {
  dsv4::check_chunk_inputs("chunk_simple_gla", dsv4::ChunkRule::kSimpleGla, q, k, v, g,
                           std::nullopt, scale, initial_state, output_final_state, cu_seqlens);
}
}  // namespace

TORCH_LIBRARY(dsv4, m) {
  // ---- Attention
  // Softmax attention; dense q (B, Sq, Hq, D) or varlen q (total_q, Hq, D) with cu_seqlens.
  // Returns out (q's shape, Dv last) and lse fp32 (B, Hq, Sq) | (Hq, total_q).
  m.def(schema("fmha", kFmhaArgs, "(Tensor out, Tensor lse)").c_str());
  m.def(schema("_fmha_check", kFmhaArgs, "()").c_str());
  // Which implementation fmha would run for these arguments: "sm90" or "reference".
  m.def(
      "fmha_path(Tensor q, Tensor k, Tensor v, *, bool causal=False, int window_left=-1, "
      "Tensor? sinks=None, Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None) -> str");
  // One DeepSeek-V4 attention layer: one softmax over the sliding window of kv (one head, used
  // as key and value) and the closed rows of compressed_kv (all: HCA; listed: CSA), plus sinks.
  // Dense q (B, Sq, Hq, D), kv (B, Skv, D); varlen q (total_q, Hq, D), kv (total_kv, D).
  m.def(schema("dsv4_attention", kDsv4Args, "(Tensor out, Tensor lse)").c_str());
  m.def(schema("_dsv4_attention_check", kDsv4Args, "()").c_str());
  // Which implementation dsv4_attention would run for these arguments.
  m.def(schema("dsv4_attention_path", kDsv4Args, "str").c_str());
  // Exact merge of two fmha results over disjoint key sets, through their LSE.
  m.def(schema("merge_attn_states", kMergeArgs, "(Tensor out, Tensor lse)").c_str());
  m.def(schema("_merge_attn_states_check", kMergeArgs, "()").c_str());

  // ---- Chunked gated linear attention (64-token chunks)
  m.def(schema("chunk_gated_delta_rule", kGatedDeltaArgs, "(Tensor o, Tensor? final_state)").c_str());
  m.def(schema("_chunk_gated_delta_rule_check", kGatedDeltaArgs, "()").c_str());
  m.def(schema("chunk_simple_gla", kSimpleGlaArgs, "(Tensor o, Tensor? final_state)").c_str());
  m.def(schema("_chunk_simple_gla_check", kSimpleGlaArgs, "()").c_str());
  // Which implementation the chunked ops would run for these arguments.
  m.def("chunk_gla_path(Tensor q, Tensor k, Tensor v, *, Tensor? cu_seqlens=None) -> str");
}

// The launchers handle both devices; the same functions serve CPU and CUDA.
#define DSV4_REGISTER_IMPLS(m)                                  \
  m.impl("fmha", &dsv4::fmha);                                  \
  m.impl("fmha_path", &dsv4::fmha_path);                        \
  m.impl("dsv4_attention", &dsv4::dsv4_attention);              \
  m.impl("dsv4_attention_path", &dsv4::dsv4_attention_path);    \
  m.impl("merge_attn_states", &dsv4::merge_attn_states);        \
  m.impl("chunk_gated_delta_rule", &dsv4::chunk_gated_delta_rule); \
  m.impl("chunk_simple_gla", &dsv4::chunk_simple_gla);          \
  m.impl("chunk_gla_path", &dsv4::chunk_gla_path)

TORCH_LIBRARY_IMPL(dsv4, CPU, m) { DSV4_REGISTER_IMPLS(m); }
TORCH_LIBRARY_IMPL(dsv4, CUDA, m) { DSV4_REGISTER_IMPLS(m); }

// The validation twins run on meta tensors only (see kFmhaArgs).
TORCH_LIBRARY_IMPL(dsv4, Meta, m) {
  m.impl("_fmha_check", &fmha_check);
  m.impl("_dsv4_attention_check", &dsv4_attention_check);
  m.impl("_merge_attn_states_check", &dsv4::check_merge_inputs);
  m.impl("_chunk_gated_delta_rule_check", &chunk_gated_delta_rule_check);
  m.impl("_chunk_simple_gla_check", &chunk_simple_gla_check);
}

TORCH_LIBRARY_IMPL(dsv4, Autograd, m) {
  for (const char* op : {"fmha", "dsv4_attention", "merge_attn_states",
                         "chunk_gated_delta_rule", "chunk_simple_gla"}) {
    m.impl(op, torch::CppFunction::makeFromBoxedFunction<&forward_only>());
  }
}
