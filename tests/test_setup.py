"""setup.py's decisions, run as `python setup.py --version` in a fresh process (no build):

- a C++ compiler that links a private copy of the C++ runtime is replaced, with a message (the
  GPU machine's CXX wrapper did this, and every TORCH_CHECK then crashed Python);
- a CUDA toolkit whose major version differs from torch's stops with an error naming the fixes;
- DSV4_FORCE_CPU=1 says that the kernels are left out, and why.

Needs the project's source tree (CI runs the tests from a clone).
"""
import os
import shutil
import stat
import subprocess
import sys

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.skipif(not os.path.isfile(os.path.join(REPO, "setup.py")),
                                reason="needs the project's source tree")


def _setup_py(**env):
    full = dict(os.environ)
    full.update(env)
    return subprocess.run([sys.executable, "setup.py", "--version"], cwd=REPO, env=full,
                          capture_output=True, text=True, timeout=300)


def _script(path, body):
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


@pytest.mark.skipif(shutil.which("g++") is None or shutil.which("nm") is None,
                    reason="needs g++ and nm")
def test_compiler_with_private_cxx_runtime_is_replaced(tmp_path):
    wrapper = _script(tmp_path / "static-g++", f'exec {shutil.which("g++")} -static-libstdc++ "$@"')
    r = _setup_py(CXX=wrapper, DSV4_FORCE_CPU="1")
    assert r.returncode == 0, r.stderr
    assert f"the C++ compiler '{wrapper}' links a private copy of the C++ runtime" in r.stderr
    assert "building with" in r.stderr


@pytest.mark.skipif(torch.version.cuda is None, reason="needs a CUDA build of torch")
def test_mismatched_cuda_toolkit_is_a_clear_error(tmp_path):
    other = 11 if int(torch.version.cuda.split(".")[0]) != 11 else 12
    (tmp_path / "bin").mkdir()
    _script(tmp_path / "bin" / "nvcc", f'echo "Cuda compilation tools, release {other}.8, V{other}.8.89"')
    r = _setup_py(CUDA_HOME=str(tmp_path))
    assert r.returncode != 0
    assert f"the CUDA toolkit at {tmp_path} is {other}.8" in r.stderr
    assert "DSV4_FORCE_CPU=1" in r.stderr and "CUDA_HOME" in r.stderr


def test_force_cpu_says_why():
    r = _setup_py(DSV4_FORCE_CPU="1")
    assert r.returncode == 0, r.stderr
    assert "building without the CUDA kernels: DSV4_FORCE_CPU=1" in r.stderr
