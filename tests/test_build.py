"""What a user meets around the ops: the build itself, errors that reach Python instead of
crashing the process, build_info(), empty and meta inputs, and the source-tree import trap."""
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

import dsv4_attn
from dsv4_attn import ops

from conftest import randn

BF16 = torch.bfloat16
PKG_DIR = os.path.dirname(os.path.abspath(dsv4_attn.__file__))
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python(code, cwd=None, pythonpath=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = pythonpath if pythonpath is not None else os.path.dirname(PKG_DIR)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


# ----------------------------------------------------------------------------- errors, never crashes

_BAD_CALLS = """
import torch, dsv4_attn
from dsv4_attn import ops
dev = "{device}"
bf = torch.bfloat16
calls = {{
    "fmha": lambda: ops.fmha(torch.zeros(1, 4, 3, 64, dtype=bf, device=dev),
                             torch.zeros(1, 4, 2, 64, dtype=bf, device=dev),
                             torch.zeros(1, 4, 2, 64, dtype=bf, device=dev)),
    "merge_attn_states": lambda: ops.merge_attn_states(
        torch.zeros(1, 2, 2, 8, device=dev), torch.zeros(1, 2, 3, device=dev),
        torch.zeros(1, 2, 2, 8, device=dev), torch.zeros(1, 2, 2, device=dev)),
    "chunk_gated_delta_rule": lambda: ops.chunk_gated_delta_rule(
        *[torch.zeros(1, 4, 2, 32, dtype=bf, device=dev)] * 3,
        torch.zeros(1, 4, 3, device=dev), torch.zeros(1, 4, 2, device=dev)),
    "chunk_simple_gla": lambda: ops.chunk_simple_gla(
        *[torch.zeros(1, 4, 2, 32, dtype=torch.float64, device=dev)] * 3,
        torch.zeros(1, 4, 2, device=dev)),
}}
for name, call in calls.items():
    try:
        call()
    except RuntimeError as e:
        print(name, "raised:", str(e).splitlines()[0])
    else:
        print(name, "returned without an error")
"""


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_errors_reach_python_in_a_fresh_process(device):
    # A build linked with its own copy of the C++ runtime dies here with SIGSEGV (issue #8).
    r = _python(_BAD_CALLS.format(device=device))
    assert r.returncode == 0, f"exit code {r.returncode}\n{r.stdout}\n{r.stderr}"
    lines = r.stdout.splitlines()
    assert len(lines) == 4, r.stdout
    for line in lines:
        assert " raised: " in line, line
    assert "fmha raised: fmha: the query heads must be a multiple of the KV heads" in r.stdout
    assert "merge_attn_states raised: merge_attn_states: lse_a must have shape" in r.stdout
    assert "chunk_gated_delta_rule raised: chunk_gated_delta_rule: g must have shape" in r.stdout
    assert "chunk_simple_gla raised: chunk_simple_gla: q must be bf16, fp16 or fp32" in r.stdout


# ----------------------------------------------------------------------------- build_info


def test_build_info_describes_this_build():
    info = dsv4_attn.build_info()
    assert set(info) == {"version", "cuda_kernels", "cuda_archs", "torch_version", "torch_cuda",
                         "cuda_toolkit", "cxx_standard", "runtime_torch_version"}
    assert info["version"] == dsv4_attn.__version__
    assert info["runtime_torch_version"] == torch.__version__
    # Built against the torch that runs it (same release line).
    assert info["torch_version"].split("+")[0].split(".")[:2] == \
        torch.__version__.split("+")[0].split(".")[:2]
    assert info["cxx_standard"] >= 201703
    assert dsv4_attn._C.__file__.endswith(".abi3.so")  # one build for every CPython >= torch's floor
    if info["cuda_kernels"]:
        assert info["cuda_archs"] == ["sm_90a"]
        assert info["cuda_toolkit"].split(".")[0] == info["torch_cuda"].split(".")[0]
    else:
        assert info["cuda_archs"] == [] and info["cuda_toolkit"] is None


@pytest.mark.gpu
def test_build_info_has_kernels_on_a_hopper_gpu():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 (Hopper) GPU")
    assert dsv4_attn.build_info()["cuda_kernels"]


# ----------------------------------------------------------------------------- empty and meta inputs


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_zero_heads_give_empty_outputs(gen, device):
    q = randn(gen, 2, 5, 0, 64, device=device)
    out, lse = ops.fmha(q, q, q, return_lse=True)
    assert out.shape == (2, 5, 0, 64) and lse.shape == (2, 0, 5)
    x = randn(gen, 1, 9, 0, 32, device=device)
    o, s = ops.chunk_gated_delta_rule(x, x, x, torch.zeros(1, 9, 0, device=device),
                                      torch.zeros(1, 9, 0, device=device),
                                      output_final_state=True)
    assert o.shape == (1, 9, 0, 32) and s.shape == (1, 0, 32, 32)


def test_meta_and_cpu_mixed_is_an_error(gen):
    q = randn(gen, 1, 4, 3, 64)
    kv = torch.empty(1, 4, 3, 64, dtype=BF16, device="meta")
    with pytest.raises(RuntimeError, match=r"fmha: k must be on the same device as q "
                                           r"\(q: cpu, k: meta\)"):
        torch.ops.dsv4.fmha(q, kv, kv)
    x = torch.empty(1, 9, 2, 32, dtype=BF16, device="meta")
    with pytest.raises(RuntimeError, match=r"chunk_simple_gla: g must be on the same device as q"):
        torch.ops.dsv4.chunk_simple_gla(x, x, x, torch.zeros(1, 9, 2))
    with pytest.raises(RuntimeError, match=r"merge_attn_states: lse_b must be on the same device"):
        o = torch.empty(1, 2, 2, 8, device="meta")
        torch.ops.dsv4.merge_attn_states(o, torch.empty(1, 2, 2, device="meta"), o,
                                         torch.zeros(1, 2, 2))


def test_meta_calls_validate_and_shape():
    q = torch.empty(2, 7, 8, 64, dtype=BF16, device="meta")
    kv = torch.empty(2, 9, 2, 64, dtype=BF16, device="meta")
    out, lse = torch.ops.dsv4.fmha(q, kv, kv)
    assert out.device.type == "meta" and out.shape == (2, 7, 8, 64) and lse.shape == (2, 8, 7)
    with pytest.raises(RuntimeError, match=r"fmha: k must have the same head_dim as q"):
        torch.ops.dsv4.fmha(q, kv[..., :32], kv)


# ----------------------------------------------------------------------------- source-tree trap


def test_unbuilt_source_tree_import_explains_itself(tmp_path):
    pkg = tmp_path / "dsv4_attn"
    pkg.mkdir()
    for name in os.listdir(PKG_DIR):
        if name.endswith(".py"):
            shutil.copy(os.path.join(PKG_DIR, name), pkg / name)
    r = _python("import dsv4_attn", cwd=tmp_path, pythonpath=str(tmp_path))
    assert r.returncode != 0
    assert "holds no built extension (dsv4_attn._C)" in r.stderr, r.stderr
    assert "pip install --no-build-isolation ." in r.stderr


@pytest.mark.skipif(not os.path.isdir(os.path.join(REPO, "src", "dsv4_attn")),
                    reason="needs the project's source tree")
def test_package_imports_from_the_project_root():
    # The package lives under src/, so running from the root cannot shadow the built copy.
    r = _python("import dsv4_attn; print(dsv4_attn.build_info()['version']); "
                "print(dsv4_attn.__file__)", cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert os.path.dirname(r.stdout.split()[-1]) == PKG_DIR
