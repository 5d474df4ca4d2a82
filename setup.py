"""Build dsv4_attn._C: one torch extension holding every dsv4 op.

CUDAExtension (with the sm_90a kernels) when torch has CUDA and a toolkit of the same major
version is found, CppExtension (reference path only) otherwise. abi3: one build serves every
CPython from torch's own limited-API floor on.

Three things are decided here rather than left to the environment:
- the C++ standard is the one the installed torch asks for (no -std flag of ours);
- the C++ compiler must link the shared C++ runtime (see _pick_cxx);
- after the build, an input error raised by the extension must reach Python as RuntimeError
  (see CheckedBuildExtension).
"""
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile

import torch
import torch.utils.cpp_extension as cpp_ext
from setuptools import setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

ROOT = os.path.dirname(os.path.abspath(__file__))
CUDA_ARCHS = ["sm_90a"]  # the kernels use wgmma and setmaxnreg: sm_90a only
# torch compiles abi3 extensions against its own floor (-DPy_LIMITED_API); tag the wheel to match.
PY_LIMITED_API = getattr(cpp_ext, "min_supported_cpython", "0x03090000")
PY_MIN = (int(PY_LIMITED_API, 16) >> 24, (int(PY_LIMITED_API, 16) >> 16) & 0xFF)


def _say(msg):
    print(f"dsv4_attn setup: {msg}", file=sys.stderr)


def _sources(pattern):
    return sorted(glob.glob(os.path.join("csrc", pattern), recursive=True))


# ----------------------------------------------------------------------------- CUDA or not


def _nvcc_version():
    out = subprocess.run([os.path.join(CUDA_HOME, "bin", "nvcc"), "--version"],
                         capture_output=True, text=True).stdout
    m = re.search(r"release (\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _cuda_plan():
    """(build the kernels?, why not). Raises when a toolkit is there but cannot build them."""
    if os.environ.get("DSV4_FORCE_CPU", "0") == "1":
        return False, "DSV4_FORCE_CPU=1"
    if torch.version.cuda is None:
        return False, f"torch {torch.__version__} has no CUDA support"
    if CUDA_HOME is None or not os.path.exists(os.path.join(CUDA_HOME, "bin", "nvcc")):
        return False, "no CUDA toolkit found (set CUDA_HOME to one with bin/nvcc)"
    nvcc = _nvcc_version()
    torch_major = int(torch.version.cuda.split(".")[0])
    if nvcc is not None and nvcc[0] != torch_major:
        raise RuntimeError(
            f"dsv4_attn: the CUDA toolkit at {CUDA_HOME} is {nvcc[0]}.{nvcc[1]}, but torch "
            f"{torch.__version__} was built with CUDA {torch.version.cuda}; the kernels need a "
            f"toolkit of the same major version. Point CUDA_HOME at a CUDA {torch_major}.x toolkit, "
            "or set DSV4_FORCE_CPU=1 to build the portable reference path only.")
    return True, ""


# ----------------------------------------------------------------------------- the C++ compiler


def _defines_cxx_runtime(cxx):
    """True if `cxx` links its own copy of the C++ runtime into a shared library (it then
    defines __cxa_throw), False if it links the shared libstdc++, None if we cannot tell."""
    nm = shutil.which("nm")
    if nm is None:
        return None
    with tempfile.TemporaryDirectory() as d:
        src, lib = os.path.join(d, "probe.cpp"), os.path.join(d, "probe.so")
        with open(src, "w") as f:
            f.write('#include <stdexcept>\nvoid dsv4_probe() { throw std::runtime_error("x"); }\n')
        try:
            built = subprocess.run(shlex.split(cxx) + ["-shared", "-fPIC", src, "-o", lib],
                                   capture_output=True).returncode == 0
        except OSError:
            return None
        if not built:
            return None
        syms = subprocess.run([nm, "-D", "--defined-only", lib], capture_output=True, text=True)
        return None if syms.returncode else " __cxa_throw" in syms.stdout


def _pick_cxx():
    """Torch's libraries use the shared libstdc++. An extension linked with a private copy of
    the C++ runtime (a compiler wrapper that adds -static-libstdc++, say) turns every C++
    exception it throws, TORCH_CHECK failures included, into a crash of the Python process.
    Keep the configured compiler when it links the shared runtime; otherwise switch to one
    that does, and say so."""
    current = os.environ.get("CXX") or sysconfig.get_config_var("CXX") or "c++"
    if _defines_cxx_runtime(current) is not True:
        return
    for name in ("g++", "c++", "x86_64-linux-gnu-g++", "clang++"):
        cand = shutil.which(name)
        if cand and _defines_cxx_runtime(cand) is False:
            _say(f"the C++ compiler {current!r} links a private copy of the C++ runtime, so "
                 f"exceptions from the extension would crash Python; building with {cand} instead "
                 "(set CXX to a compiler that links the shared libstdc++ to choose another)")
            os.environ["CXX"] = cand
            return
    raise RuntimeError(
        f"dsv4_attn: the C++ compiler {current!r} links a private copy of the C++ runtime into "
        "shared libraries, so every error raised by the extension would crash Python, and no "
        "other compiler on PATH links the shared libstdc++. Set CXX to one that does.")


# ----------------------------------------------------------------------------- build info


def _write_build_info(with_cuda):
    """csrc/generated/build_info.h: what this build used, exposed by dsv4_attn.build_info()."""
    cuda = ""
    if with_cuda:
        v = _nvcc_version()
        cuda = f"{v[0]}.{v[1]}" if v else "unknown"
    lines = [
        "// Written by setup.py for each build; read by torch_bindings.cpp.",
        "#pragma once",
        f'#define DSV4_BUILD_TORCH_VERSION "{torch.__version__}"',
        f'#define DSV4_BUILD_TORCH_CUDA "{torch.version.cuda or ""}"',
        f'#define DSV4_BUILD_CUDA_TOOLKIT "{cuda}"',
        f'#define DSV4_BUILD_CUDA_ARCHS "{",".join(CUDA_ARCHS) if with_cuda else ""}"',
        "",
    ]
    path = os.path.join(ROOT, "csrc", "generated", "build_info.h")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    text = "\n".join(lines)
    if not os.path.exists(path) or open(path).read() != text:  # keep ninja's timestamps
        with open(path, "w") as f:
            f.write(text)


# ----------------------------------------------------------------------------- the extension


def _extension(with_cuda):
    cxx_flags = ["-O3", "-DNDEBUG"]
    include_dirs = [os.path.join(ROOT, "csrc")]
    cpp_sources = _sources("**/*.cpp")
    if not with_cuda:
        return CppExtension("dsv4_attn._C", cpp_sources, include_dirs=include_dirs,
                            extra_compile_args={"cxx": cxx_flags}, py_limited_api=True)
    nvcc_flags = [
        "-O3",
        "-DNDEBUG",
        "-lineinfo",
        "--threads", os.environ.get("NVCC_THREADS", "2"),
        *[f"-gencode=arch=compute_{a[3:]},code={a}" for a in CUDA_ARCHS],
        "--expt-relaxed-constexpr",
        "-Xptxas=-v" if os.environ.get("DSV4_PTXAS_VERBOSE", "0") == "1" else "-Xptxas=-O3",
    ]
    return CUDAExtension("dsv4_attn._C", cpp_sources + _sources("**/*.cu"),
                         include_dirs=include_dirs, define_macros=[("DSV4_WITH_CUDA", "1")],
                         extra_compile_args={"cxx": cxx_flags, "nvcc": nvcc_flags},
                         py_limited_api=True)


_ERROR_CHECK = r"""
import sys, torch
torch.ops.load_library(sys.argv[1])
q = torch.zeros(1, 4, 3, 64, dtype=torch.bfloat16)
kv = torch.zeros(1, 4, 2, 64, dtype=torch.bfloat16)
try:
    torch.ops.dsv4.fmha(q, kv, kv)
except RuntimeError as e:
    print("raised:", str(e).splitlines()[0])
    sys.exit(0)
sys.exit("an invalid fmha call returned without an error")
"""


class CheckedBuildExtension(BuildExtension):
    """After building, call the extension with a bad input in a fresh process: the error must
    arrive as RuntimeError. A build whose exceptions crash the process fails here, loudly."""

    def run(self):
        _write_build_info(WITH_CUDA)
        super().run()
        for ext in self.extensions:
            lib = self.get_ext_fullpath(ext.name)
            r = subprocess.run([sys.executable, "-c", _ERROR_CHECK, lib],
                               capture_output=True, text=True)
            if r.returncode != 0:
                how = (f"the process died with signal {-r.returncode}" if r.returncode < 0
                       else f"exit code {r.returncode}")
                raise RuntimeError(
                    f"dsv4_attn build check failed: an input error raised inside {lib} did not "
                    f"reach Python as RuntimeError ({how}). This happens when the extension is "
                    "linked with its own copy of the C++ runtime; build with a compiler that "
                    f"links the shared libstdc++ (CXX=...).\n{r.stdout}{r.stderr}")
            _say(f"build check passed: {r.stdout.strip()}")


WITH_CUDA, _WHY_NOT_CUDA = _cuda_plan()
if not WITH_CUDA:
    _say(f"building without the CUDA kernels: {_WHY_NOT_CUDA}")
_pick_cxx()

# Metadata (name, version, dependencies, the test extra, packages under src/) is in
# pyproject.toml; this file adds what needs code: the extension and its build command.
setup(
    ext_modules=[_extension(WITH_CUDA)],
    cmdclass={"build_ext": CheckedBuildExtension},
    options={"bdist_wheel": {"py_limited_api": f"cp{PY_MIN[0]}{PY_MIN[1]}"}},
)
