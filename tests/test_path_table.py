"""The README's path table is what the ops' own launch plans answer (scripts/path_table.py
renders it; run `python3 scripts/path_table.py --write` after a change to a plan)."""
import importlib.util
import os

import dsv4_attn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _path_table():
    spec = importlib.util.spec_from_file_location(
        "path_table", os.path.join(ROOT, "scripts", "path_table.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_path_table_matches_the_plans():
    path_table = _path_table()
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = path_table.readme_table(f.read())
    assert readme == path_table.render(), (
        "README.md's path table differs from the plans: run `python3 scripts/path_table.py "
        "--write` and check the change")


def test_plan_reports_the_reference_path_and_why():
    import torch
    q = torch.empty(1, 16, 4, 96, dtype=torch.bfloat16)
    assert dsv4_attn.launch_plan("fmha", q, q, q).startswith("reference: ")
    assert dsv4_attn.fmha_path(q, q, q) == "reference"
