"""dsv4_attn: Hopper attention and chunked linear-attention kernels as torch ops.

Importing the package loads the extension, which registers every op under
``torch.ops.dsv4``; ``dsv4_attn.ops`` adds typed wrappers and fake (meta) kernels.
"""
import torch  # noqa: F401  (loads libtorch before the extension)

from . import _C  # noqa: F401  (registers torch.ops.dsv4.*)
from .ops import (
    chunk_gated_delta_rule,
    chunk_gla_path,
    chunk_simple_gla,
    fmha,
    fmha_path,
    merge_attn_states,
)

__all__ = [
    "fmha",
    "fmha_path",
    "merge_attn_states",
    "chunk_gated_delta_rule",
    "chunk_simple_gla",
    "chunk_gla_path",
]
__version__ = "0.1.0"
