"""Generated sources stay in step with their generators (CPU only, no build needed).

csrc/ptx/wgmma_ops.cuh is written by scripts/gen_wgmma.py: the checked-in header must equal the
script's output byte for byte, so an edit by hand or a generator change without a rerun fails
here. The fix is `python scripts/gen_wgmma.py` and committing the result.
"""
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
GEN_WGMMA = ROOT / "scripts" / "gen_wgmma.py"
WGMMA_OPS = ROOT / "csrc" / "ptx" / "wgmma_ops.cuh"


def generated_wgmma(tmp_path) -> bytes:
    """What scripts/gen_wgmma.py writes, run as a script into a temporary file."""
    out = tmp_path / "wgmma_ops.cuh"
    subprocess.run([sys.executable, str(GEN_WGMMA), "-o", str(out)], check=True,
                   capture_output=True, cwd=tmp_path)
    return out.read_bytes()


def assert_same(want: bytes, path: pathlib.Path) -> None:
    have = path.read_bytes()
    if have == want:
        return
    have_lines, want_lines = have.split(b"\n"), want.split(b"\n")
    line = next((i for i, (a, b) in enumerate(zip(have_lines, want_lines)) if a != b),
                min(len(have_lines), len(want_lines)))
    raise AssertionError(
        f"{path} differs from the output of scripts/gen_wgmma.py from line {line + 1} "
        f"({len(have)} vs {len(want)} bytes): run `python scripts/gen_wgmma.py` and commit "
        "the result")


def test_wgmma_ops_matches_generator(tmp_path):
    assert_same(generated_wgmma(tmp_path), WGMMA_OPS)


def test_wgmma_check_can_fail(tmp_path):
    """The comparison catches a one-character change (on a copy, never the real header)."""
    want = generated_wgmma(tmp_path)
    copy = tmp_path / "perturbed.cuh"
    text = WGMMA_OPS.read_bytes()
    copy.write_bytes(text.replace(b"m64n256k16", b"m64n255k16", 1))
    try:
        assert_same(want, copy)
    except AssertionError as e:
        assert "differs" in str(e)
    else:
        raise AssertionError("a perturbed copy of wgmma_ops.cuh passed the check")
