// The one op registry: every dsv4 schema, and its CPU and CUDA implementations.
// Each launcher validates its inputs, then picks the sm90 kernel or the portable reference path.
#include <Python.h>
#include <torch/library.h>

#include "fmha/fmha.h"
#include "gla/chunk.h"

// An importable, empty module so `import dsv4_attn._C` loads this library (abi3, no pybind).
extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}

TORCH_LIBRARY(dsv4, m) {
  // ---- Attention
  // Softmax attention; dense q (B, Sq, Hq, D) or varlen q (total_q, Hq, D) with cu_seqlens.
  // Returns out (q's shape, Dv last) and lse fp32 (B, Hq, Sq) | (Hq, total_q).
  m.def(
      "fmha(Tensor q, Tensor k, Tensor v, *, float? scale=None, bool causal=False, "
      "int window_left=-1, Tensor? sinks=None, Tensor? cu_seqlens_q=None, "
      "Tensor? cu_seqlens_k=None, int max_seqlen_q=-1, int max_seqlen_k=-1) "
      "-> (Tensor out, Tensor lse)");
  // Which implementation fmha would run for these arguments: "sm90" or "reference".
  m.def(
      "fmha_path(Tensor q, Tensor k, Tensor v, *, bool causal=False, int window_left=-1, "
      "Tensor? sinks=None, Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None) -> str");
  // Exact merge of two fmha results over disjoint key sets, through their LSE.
  m.def(
      "merge_attn_states(Tensor out_a, Tensor lse_a, Tensor out_b, Tensor lse_b) "
      "-> (Tensor out, Tensor lse)");

  // ---- Chunked gated linear attention (64-token chunks)
  m.def(
      "chunk_gated_delta_rule(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, *, "
      "float? scale=None, Tensor? initial_state=None, bool output_final_state=False, "
      "Tensor? cu_seqlens=None) -> (Tensor o, Tensor? final_state)");
  m.def(
      "chunk_simple_gla(Tensor q, Tensor k, Tensor v, Tensor g, *, float? scale=None, "
      "Tensor? initial_state=None, bool output_final_state=False, Tensor? cu_seqlens=None) "
      "-> (Tensor o, Tensor? final_state)");
  // Which implementation the chunked ops would run for these arguments.
  m.def("chunk_gla_path(Tensor q, Tensor k, Tensor v, *, Tensor? cu_seqlens=None) -> str");
}

// The launchers handle both devices; the same functions serve CPU and CUDA.
#define DSV4_REGISTER_IMPLS(m)                                  \
  m.impl("fmha", &dsv4::fmha);                                  \
  m.impl("fmha_path", &dsv4::fmha_path);                        \
  m.impl("merge_attn_states", &dsv4::merge_attn_states);        \
  m.impl("chunk_gated_delta_rule", &dsv4::chunk_gated_delta_rule); \
  m.impl("chunk_simple_gla", &dsv4::chunk_simple_gla);          \
  m.impl("chunk_gla_path", &dsv4::chunk_gla_path)

TORCH_LIBRARY_IMPL(dsv4, CPU, m) { DSV4_REGISTER_IMPLS(m); }
TORCH_LIBRARY_IMPL(dsv4, CUDA, m) { DSV4_REGISTER_IMPLS(m); }
