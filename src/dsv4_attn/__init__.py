"""dsv4_attn: Hopper attention and chunked linear-attention kernels as torch ops.

Importing the package loads the extension, which registers every op under
``torch.ops.dsv4``; ``dsv4_attn.ops`` adds typed wrappers and fake (meta) kernels.
"""
import os as _os

import torch  # noqa: F401  (loads libtorch before the extension)

try:
    from . import _C  # registers torch.ops.dsv4.*
except ImportError as _e:
    _here = _os.path.dirname(_os.path.abspath(__file__))
    raise ImportError(
        f"dsv4_attn was imported from {_here}, which holds no built extension (dsv4_attn._C): "
        f"{_e}. Install it with `pip install --no-build-isolation .` from the project root, or "
        "build it in place with `python setup.py build_ext --inplace` and put src/ on "
        "PYTHONPATH. An installed copy is shadowed when an unbuilt source folder comes first "
        "on sys.path."
    ) from _e

from .ops import (  # noqa: E402
    chunk_gated_delta_rule,
    chunk_gated_delta_rule_path,
    chunk_simple_gla,
    chunk_simple_gla_path,
    dsv4_attention,
    dsv4_attention_paged,
    dsv4_attention_paged_path,
    dsv4_attention_path,
    dsv4_indexer_topk,
    dsv4_indexer_topk_paged,
    dsv4_indexer_topk_paged_path,
    dsv4_indexer_topk_path,
    fmha,
    fmha_path,
    gated_delta_rule_decode,
    gated_delta_rule_decode_path,
    kv_cache_gather_fp8,
    kv_cache_gather_fp8_path,
    kv_cache_insert_fp8,
    kv_cache_insert_fp8_path,
    launch_plan,
    merge_attn_states,
    merge_attn_states_path,
)

__all__ = [
    "build_info",
    "dsv4_attention",
    "dsv4_attention_path",
    "dsv4_attention_paged",
    "dsv4_attention_paged_path",
    "dsv4_indexer_topk",
    "dsv4_indexer_topk_path",
    "dsv4_indexer_topk_paged",
    "dsv4_indexer_topk_paged_path",
    "fmha",
    "fmha_path",
    "merge_attn_states",
    "merge_attn_states_path",
    "chunk_gated_delta_rule",
    "chunk_gated_delta_rule_path",
    "chunk_simple_gla",
    "chunk_simple_gla_path",
    "gated_delta_rule_decode",
    "gated_delta_rule_decode_path",
    "kv_cache_insert_fp8",
    "kv_cache_insert_fp8_path",
    "kv_cache_gather_fp8",
    "kv_cache_gather_fp8_path",
    "launch_plan",
]
__version__ = "0.1.0"


def build_info() -> dict:
    """What this build of the extension contains and was built against.

    cuda_kernels: whether the sm90 kernels were compiled in (False: reference path only);
    cuda_archs: the GPU targets compiled for; torch_version / torch_cuda: the torch (and its
    CUDA) the build compiled against; cuda_toolkit: the nvcc version used ("" without CUDA);
    cxx_standard: the C++ standard (__cplusplus); runtime_torch_version: the torch imported now.
    """
    return {
        "version": __version__,
        "cuda_kernels": bool(_C.with_cuda),
        "cuda_archs": [a for a in _C.cuda_archs.split(",") if a],
        "torch_version": _C.torch_version,
        "torch_cuda": _C.torch_cuda or None,
        "cuda_toolkit": _C.cuda_toolkit or None,
        "cxx_standard": _C.cplusplus,
        "runtime_torch_version": torch.__version__,
    }
