"""Build dsv4_attn._C: one torch extension holding every dsv4 op.

CUDAExtension (with the sm_90a kernels) when torch has CUDA and a toolkit is found,
CppExtension (reference path only) otherwise. abi3: one build serves CPython >= 3.9.
"""
import glob
import os

import torch
from setuptools import find_packages, setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

ROOT = os.path.dirname(os.path.abspath(__file__))
PY_LIMITED_API = "0x03090000"  # CPython 3.9


def _sources(pattern):
    return sorted(glob.glob(os.path.join("csrc", pattern), recursive=True))


def _want_cuda():
    if os.environ.get("DSV4_FORCE_CPU", "0") == "1":
        return False
    return torch.version.cuda is not None and CUDA_HOME is not None


def _extension():
    cxx_flags = ["-O3", "-std=c++17", "-DNDEBUG", f"-DPy_LIMITED_API={PY_LIMITED_API}"]
    include_dirs = [os.path.join(ROOT, "csrc")]
    cpp_sources = _sources("**/*.cpp")
    if not _want_cuda():
        return CppExtension(
            "dsv4_attn._C",
            cpp_sources,
            include_dirs=include_dirs,
            extra_compile_args={"cxx": cxx_flags},
            py_limited_api=True,
        )
    nvcc_threads = os.environ.get("NVCC_THREADS", "2")
    nvcc_flags = [
        "-O3",
        "-std=c++17",
        "-DNDEBUG",
        "-lineinfo",
        "--threads", nvcc_threads,
        "-gencode", "arch=compute_90a,code=sm_90a",
        "--expt-relaxed-constexpr",
        "-Xptxas=-v" if os.environ.get("DSV4_PTXAS_VERBOSE", "0") == "1" else "-Xptxas=-O3",
    ]
    return CUDAExtension(
        "dsv4_attn._C",
        cpp_sources + _sources("**/*.cu"),
        include_dirs=include_dirs,
        define_macros=[("DSV4_WITH_CUDA", "1")],
        extra_compile_args={"cxx": cxx_flags, "nvcc": nvcc_flags},
        py_limited_api=True,
    )


setup(
    name="dsv4_attn",
    version="0.1.0",
    description="Hopper attention and chunked linear-attention kernels as torch ops",
    packages=find_packages(include=["dsv4_attn", "dsv4_attn.*"]),
    ext_modules=[_extension()],
    cmdclass={"build_ext": BuildExtension},
    options={"bdist_wheel": {"py_limited_api": "cp39"}},
    python_requires=">=3.9",
    install_requires=["torch>=2.6"],
)
