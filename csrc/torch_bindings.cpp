// The one op registry: every dsv4 schema, and its CPU and CUDA implementations.
// Each launcher validates its inputs, then picks the sm90 kernel or the portable reference path.
#include <Python.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <torch/library.h>

#include <string>
#include <utility>

#include "generated/build_info.h"  // written by setup.py
#include "ops/chunk.h"
#include "ops/dsv4_attention.h"
#include "ops/dsv4_attention_paged.h"
#include "ops/entry.h"
#include "ops/fmha.h"
#include "ops/gated_delta_decode.h"
#include "ops/indexer.h"
#include "ops/kv_cache_fp8.h"
#include "ops/merge_attn_states.h"

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
// The argument lists of the compute ops. Every op has three twins with the same arguments:
// `_<op>_check` only validates them (the fake kernels in dsv4_attn/ops.py run it on meta tensors
// of the traced shapes, so tracing rejects exactly what the op rejects); `<op>_path` names the
// implementation the op would run ("sm90" or "reference"); `_<op>_plan` gives the launch
// decisions, or why the reference path runs.
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
constexpr const char* kIndexerArgs =
    "(Tensor q, Tensor k, Tensor weights, Tensor positions, *, int topk, int compress_ratio, "
    "float? scale=None, Tensor? k_scale=None, Tensor? cu_seqlens_q=None, "
    "Tensor? cu_seqlens_k=None, int max_seqlen_q=-1, int max_seqlen_k=-1)";
constexpr const char* kIndexerPagedArgs =
    "(Tensor q, Tensor k_cache, Tensor weights, Tensor positions, Tensor block_table, "
    "Tensor context_lens, *, int topk, int compress_ratio, float? scale=None)";
constexpr const char* kSimpleGlaArgs =
    "(Tensor q, Tensor k, Tensor v, Tensor g, *, float? scale=None, "
    "Tensor? initial_state=None, bool output_final_state=False, Tensor? cu_seqlens=None)";

// Every compute op with its twins, and what it returns.
struct OpSchema {
  const char* name;
  const char* args;
  const char* returns;
};
constexpr OpSchema kOps[] = {
    // Softmax attention; dense q (B, Sq, Hq, D) or varlen q (total_q, Hq, D) with cu_seqlens.
    // Returns out (q's shape, Dv last) and lse fp32 (B, Hq, Sq) | (Hq, total_q).
    {"fmha", kFmhaArgs, "(Tensor out, Tensor lse)"},
    // One DeepSeek-V4 attention layer: one softmax over the sliding window of kv (one head, used
    // as key and value) and the closed rows of compressed_kv (all: HCA; listed: CSA), plus sinks.
    // Dense q (B, Sq, Hq, D), kv (B, Skv, D); varlen q (total_q, Hq, D), kv (total_kv, D).
    {"dsv4_attention", kDsv4Args, "(Tensor out, Tensor lse)"},
    // Exact merge of two fmha results over disjoint key sets, through their LSE.
    {"merge_attn_states", kMergeArgs, "(Tensor out, Tensor lse)"},
    // Chunked gated linear attention (64-token chunks).
    {"chunk_gated_delta_rule", kGatedDeltaArgs, "(Tensor o, Tensor? final_state)"},
    {"chunk_simple_gla", kSimpleGlaArgs, "(Tensor o, Tensor? final_state)"},
    // DeepSeek-V4's lightning indexer: each query's top-k closed compressed rows, int32.
    {"dsv4_indexer_topk", kIndexerArgs, "Tensor"},
    // The same over the paged FP8 indexer cache, a few query tokens per request, int32.
    {"dsv4_indexer_topk_paged", kIndexerPagedArgs, "Tensor"},
};

// The paged FP8 KV cache ops (README: "The paged FP8 KV cache"): insert writes into `cache` in
// place; each has the same three twins as the compute ops.
constexpr const char* kKvInsertArgs = "(Tensor kv, Tensor cache, Tensor slots)";
constexpr const char* kKvGatherArgs = "(Tensor cache, Tensor slots, ScalarType dtype)";
// dsv4_attention over the paged FP8 caches: writes `out` in place, returns lse (Hq, T).
constexpr const char* kDsv4PagedArgs =
    "(Tensor q, Tensor window_cache, Tensor window_slots, *, Tensor? window_lengths=None, "
    "Tensor? compressed_cache=None, Tensor? compressed_slots=None, "
    "Tensor? compressed_lengths=None, Tensor? sinks=None, float? scale=None, Tensor out)";
// The gated delta rule's decode step: updates `state` in place, returns o.
constexpr const char* kDecodeArgs =
    "(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, Tensor state, *, "
    "Tensor? state_indices=None, float? scale=None, bool use_qk_l2norm_in_kernel=False)";

// The op, its _path and _plan twins (CPU and CUDA: the op units handle both devices), and its
// _check twin (Meta), each an OpEntry over the op's check.
template <auto kCheck, auto kOp, auto kPath, auto kPlan>
void implement(torch::Library& m, const char* name) {
  const std::string n = name;
  m.impl(name, &dsv4::OpEntry<kCheck, kOp>::fn);
  m.impl((n + "_path").c_str(), &dsv4::OpEntry<kCheck, kPath>::fn);
  m.impl(("_" + n + "_plan").c_str(), &dsv4::OpEntry<kCheck, kPlan>::fn);
}

template <auto kCheck>
void implement_check(torch::Library& m, const char* name) {
  m.impl(("_" + std::string(name) + "_check").c_str(), &dsv4::CheckEntry<kCheck>::fn);
}

void implement_all(torch::Library& m) {
  using namespace dsv4;
  implement<&check_fmha_inputs, &fmha, &fmha_path, &fmha_plan>(m, "fmha");
  implement<&check_dsv4_inputs, &dsv4_attention, &dsv4_attention_path, &dsv4_attention_plan>(
      m, "dsv4_attention");
  implement<&check_merge_inputs, &merge_attn_states, &merge_attn_states_path,
            &merge_attn_states_plan>(m, "merge_attn_states");
  implement<&check_gated_delta_rule_inputs, &chunk_op, &chunk_path, &chunk_plan>(
      m, "chunk_gated_delta_rule");
  implement<&check_simple_gla_inputs, &chunk_op, &chunk_path, &chunk_plan>(m, "chunk_simple_gla");
  implement<&check_indexer_inputs, &dsv4_indexer_topk, &dsv4_indexer_topk_path,
            &dsv4_indexer_topk_plan>(m, "dsv4_indexer_topk");
  implement<&check_indexer_paged_inputs, &dsv4_indexer_topk_paged, &dsv4_indexer_topk_paged_path,
            &dsv4_indexer_topk_paged_plan>(m, "dsv4_indexer_topk_paged");
  implement<&check_kv_cache_insert_inputs, &kv_cache_insert_fp8, &kv_cache_insert_fp8_path,
            &kv_cache_insert_fp8_plan>(m, "kv_cache_insert_fp8");
  implement<&check_kv_cache_gather_inputs, &kv_cache_gather_fp8, &kv_cache_gather_fp8_path,
            &kv_cache_gather_fp8_plan>(m, "kv_cache_gather_fp8");
  implement<&check_gated_delta_decode_inputs, &gated_delta_rule_decode,
            &gated_delta_rule_decode_path, &gated_delta_rule_decode_plan>(
      m, "gated_delta_rule_decode");
  implement<&check_dsv4_paged_inputs, &dsv4_attention_paged, &dsv4_attention_paged_path,
            &dsv4_attention_paged_plan>(m, "dsv4_attention_paged");
}
}  // namespace

TORCH_LIBRARY(dsv4, m) {
  for (const OpSchema& op : kOps) {
    const std::string name = op.name;
    m.def((name + op.args + " -> " + op.returns).c_str());
    m.def(("_" + name + "_check" + op.args + " -> ()").c_str());
    m.def((name + "_path" + op.args + " -> str").c_str());
    m.def(("_" + name + "_plan" + op.args + " -> str").c_str());
  }
  // The ops that write into an argument: their twins take the arguments without the alias
  // annotation.
  m.def("kv_cache_insert_fp8(Tensor kv, Tensor(a!) cache, Tensor slots) -> ()");
  m.def(("kv_cache_gather_fp8" + std::string(kKvGatherArgs) + " -> Tensor").c_str());
  m.def("gated_delta_rule_decode(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, "
        "Tensor(a!) state, *, Tensor? state_indices=None, float? scale=None, "
        "bool use_qk_l2norm_in_kernel=False) -> Tensor");
  m.def("dsv4_attention_paged(Tensor q, Tensor window_cache, Tensor window_slots, *, "
        "Tensor? window_lengths=None, Tensor? compressed_cache=None, "
        "Tensor? compressed_slots=None, Tensor? compressed_lengths=None, Tensor? sinks=None, "
        "float? scale=None, Tensor(a!) out) -> Tensor");
  for (const auto& [name, args] : {std::pair{"kv_cache_insert_fp8", kKvInsertArgs},
                                   std::pair{"kv_cache_gather_fp8", kKvGatherArgs},
                                   std::pair{"gated_delta_rule_decode", kDecodeArgs},
                                   std::pair{"dsv4_attention_paged", kDsv4PagedArgs}}) {
    m.def(("_" + std::string(name) + "_check" + args + " -> ()").c_str());
    m.def((std::string(name) + "_path" + args + " -> str").c_str());
    m.def(("_" + std::string(name) + "_plan" + args + " -> str").c_str());
  }
}

TORCH_LIBRARY_IMPL(dsv4, CPU, m) { implement_all(m); }
TORCH_LIBRARY_IMPL(dsv4, CUDA, m) { implement_all(m); }

// The validation twins run on meta tensors only.
TORCH_LIBRARY_IMPL(dsv4, Meta, m) {
  using namespace dsv4;
  implement_check<&check_fmha_inputs>(m, "fmha");
  implement_check<&check_dsv4_inputs>(m, "dsv4_attention");
  implement_check<&check_merge_inputs>(m, "merge_attn_states");
  implement_check<&check_gated_delta_rule_inputs>(m, "chunk_gated_delta_rule");
  implement_check<&check_simple_gla_inputs>(m, "chunk_simple_gla");
  implement_check<&check_indexer_inputs>(m, "dsv4_indexer_topk");
  implement_check<&check_indexer_paged_inputs>(m, "dsv4_indexer_topk_paged");
  implement_check<&check_kv_cache_insert_inputs>(m, "kv_cache_insert_fp8");
  implement_check<&check_kv_cache_gather_inputs>(m, "kv_cache_gather_fp8");
  implement_check<&check_gated_delta_decode_inputs>(m, "gated_delta_rule_decode");
  implement_check<&check_dsv4_paged_inputs>(m, "dsv4_attention_paged");
}

TORCH_LIBRARY_IMPL(dsv4, Autograd, m) {
  for (const char* name : {"kv_cache_insert_fp8", "kv_cache_gather_fp8", "gated_delta_rule_decode",
                           "dsv4_attention_paged"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&forward_only>());
  }
  for (const OpSchema& op : kOps) {
    m.impl(op.name, torch::CppFunction::makeFromBoxedFunction<&forward_only>());
  }
}
