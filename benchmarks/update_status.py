#!/usr/bin/env python3
"""Put the status blocks the benchmarks wrote into benchmarks/RESULTS.md (no GPU, no torch).

    python3 benchmarks/update_status.py out/status.md               # gpu_check.sh's $OUT
    python3 benchmarks/update_status.py --results /tmp/R.md FILE...  # another copy

A status block is what bench_fmha.py, bench_dsv4.py and bench_chunk.py write with
--status-out PATH (scripts/gpu_check.sh collects them in $OUT/status.md):

    <!-- status:NAME begin -->
    **NAME** — date, GPU, torch, CUDA, commit, ceilings
    ...the bench's summary table...
    <!-- status:NAME end -->

Every block in every FILE replaces the block of the same NAME in RESULTS.md, markers included;
the rest of RESULTS.md is left as it is. A NAME whose marker pair RESULTS.md lacks (or holds
twice, or out of order), a FILE without a block, or a NAME given twice is an error, and then
nothing is written.
"""
import argparse
import os
import re
import sys
from typing import Dict, List, Tuple

NAME = r"[A-Za-z0-9_.-]+"
BLOCK_RE = re.compile(r"^<!-- status:(" + NAME + r") begin -->\n.*?^<!-- status:\1 end -->$",
                      re.S | re.M)


def begin_marker(name: str) -> str:
    return f"<!-- status:{name} begin -->"


def end_marker(name: str) -> str:
    return f"<!-- status:{name} end -->"


def valid_name(name: str) -> bool:
    return re.fullmatch(NAME, name) is not None


def read_blocks(path: str) -> List[Tuple[str, str]]:
    """(name, block text from its begin marker to its end marker) for each block in path."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    return [(m.group(1), m.group(0)) for m in BLOCK_RE.finditer(text)]


def replace_block(text: str, name: str, block: str) -> str:
    """text with the block NAME (markers included) replaced by block; ValueError without it."""
    begin, end = begin_marker(name), end_marker(name)
    if text.count(begin) != 1 or text.count(end) != 1:
        raise ValueError(f"needs exactly one '{begin}' and one '{end}' "
                         f"(has {text.count(begin)} and {text.count(end)})")
    i, j = text.index(begin), text.index(end)
    if j < i:
        raise ValueError(f"'{end}' comes before '{begin}'")
    return text[:i] + block + text[j + len(end):]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", metavar="FILE", help="files holding status blocks")
    ap.add_argument("--results", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                      "RESULTS.md"),
                    help="the markdown file to update (default: benchmarks/RESULTS.md)")
    args = ap.parse_args(argv)

    blocks: Dict[str, Tuple[str, str]] = {}  # name -> (block, file it came from)
    for path in args.files:
        found = read_blocks(path)
        if not found:
            sys.exit(f"update_status: {path} holds no status block "
                     f"('{begin_marker('NAME')}' ... '{end_marker('NAME')}')")
        for name, block in found:
            if name in blocks:
                sys.exit(f"update_status: block {name} is in both {blocks[name][1]} and {path}")
            blocks[name] = (block, path)

    with open(args.results, encoding="utf-8") as f:
        text = f.read()
    for name, (block, path) in blocks.items():
        try:
            text = replace_block(text, name, block)
        except ValueError as e:
            sys.exit(f"update_status: {args.results}: block {name} (from {path}): {e}")
    with open(args.results, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    print(f"update_status: {args.results}: replaced " + ", ".join(sorted(blocks)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
