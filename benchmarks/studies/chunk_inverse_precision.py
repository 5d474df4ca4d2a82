"""How accurate the delta rule's chunk inverse is with a 16-bit workspace: a CPU emulation of
`invert_unit_lower_64` (csrc/sm90/chunk/tiles.cuh) with A and T kept in fp32 (the kernel before
it moved to fp16), fp16 (the kernel now) or bf16, against the float64 inverse. It is
what chose fp16, which halves the workspace (docs/chunk.md, the fused-inverse step). A
tool for choosing, not a test. It follows the kernel's steps, not its code, so re-check it
against the kernel before trusting it after the kernel changes.

    python benchmarks/studies/chunk_inverse_precision.py    # random and adversarial chunks

Emulated: A = strict_lower(beta_i k_i.k_j) from 16-bit keys, rounded to the workspace type as
the fill writes it; the diagonal blocks by forward substitution in fp32; every block product a
tensor-core MMA with fp32 accumulation, operands rounded to tf32 with cvt.rna as the fp32
kernel did (exact for fp16 operands, so the fp16 column is the kernel's m16n8k16 f16 MMA);
every stored block rounded to the workspace type; T_u rounded to the output type at the end.
Printed: ||T - T_exact|| / ||T_exact|| per workspace, and the output rounding alone ("bound").
"""
import argparse

import numpy as np
import torch
import torch.nn.functional as F


def f32(x):
    return np.asarray(x, np.float32)


def round_bits(x, add, mask):
    b = f32(x).view(np.uint32).astype(np.uint64)
    return ((add(b) & mask).astype(np.uint32)).view(np.float32)


def tf32(x):  # cvt.rna.tf32.f32: nearest, ties away from zero
    return round_bits(x, lambda b: b + 0x1000, 0xFFFFE000)


def bf16(x):  # nearest even
    return round_bits(x, lambda b: b + 0x7FFF + ((b >> 16) & 1), 0xFFFF0000)


def fp16(x):
    return f32(x).astype(np.float16).astype(np.float32)


WORKSPACE = {"fp32": f32, "fp16": fp16, "bf16": bf16}


def mma(c, a, b):
    return f32(c.astype(np.float64) + tf32(a).astype(np.float64) @ tf32(b).astype(np.float64))


def substitute(d):
    """(I + strict_lower(d))^-1 by forward substitution in fp32 registers, one column per lane."""
    n = d.shape[0]
    col = np.zeros((n, n), np.float32)
    for i in range(n):
        acc = (np.arange(n) == i).astype(np.float32)
        for j in range(i):
            acc = f32(acc - f32(d[i, j] * col[j]))
        col[i] = acc
    return col


def invert(a_lower, store, diag=16):
    """T = (I + A)^-1 by the kernel's 16 x 16 block steps, blocks kept in `store`'s type.
    diag 8: each diagonal 16 x 16 block from two 8 x 8 substitutions and one merge,
    [[T1, 0], [-(T2 L21) T1, T2]], T2 L21 rounded to `store`'s type between the two MMAs."""
    a, t = store(a_lower).copy(), np.zeros((64, 64), np.float32)
    blk = lambda m, r, c: m[16 * r:16 * r + 16, 16 * c:16 * c + 16]  # noqa: E731
    zero = np.zeros((16, 16), np.float32)
    for w in range(4):  # diagonal blocks
        d = blk(a, w, w)
        if diag == 16:
            blk(t, w, w)[:] = store(substitute(d))
            continue
        t1, t2 = store(substitute(d[:8, :8])), store(substitute(d[8:, 8:]))
        z = store(mma(np.zeros((8, 8), np.float32), t2, d[8:, :8]))
        blk(t, w, w)[:8, :8], blk(t, w, w)[8:, 8:] = t1, t2
        blk(t, w, w)[8:, :8] = store(-mma(np.zeros((8, 8), np.float32), z, t1))
    for r, m in ((1, 0), (2, 1), (3, 2), (2, 0), (3, 1), (3, 0)):  # E_rm = -D_r A_rm over A_rm
        blk(a, r, m)[:] = store(-mma(zero, blk(t, r, r), blk(a, r, m)))
    for w in range(3):  # distance 1
        blk(t, w + 1, w)[:] = store(mma(zero, blk(a, w + 1, w), blk(t, w, w)))
    for r, c in ((2, 0), (3, 1)):  # distance 2
        x = mma(zero, blk(a, r, c), blk(t, c, c))
        blk(t, r, c)[:] = store(mma(x, blk(a, r, c + 1), blk(t, c + 1, c)))
    x = mma(mma(zero, blk(a, 3, 0), blk(t, 0, 0)), blk(a, 3, 1), blk(t, 1, 0))  # distance 3
    blk(t, 3, 0)[:] = store(mma(x, blk(a, 3, 2), blk(t, 2, 0)))
    return np.tril(t)


def errors(k, beta, out_dtype):
    k = k.to(out_dtype).double().numpy()
    a = f32(np.tril(beta[:, None] * f32(k @ k.T), -1))
    exact = np.linalg.inv(np.eye(64) + a.astype(np.float64))
    out = bf16 if out_dtype == torch.bfloat16 else fp16
    rel = lambda t: np.linalg.norm(t - exact) / np.linalg.norm(exact)  # noqa: E731
    with np.errstate(all="ignore"):
        res = {name: rel(out(invert(a, store))) for name, store in WORKSPACE.items()}
        res["fp16 d8"] = rel(out(invert(a, fp16, diag=8)))
        res["bound"] = rel(out(exact))
    res["max|T|"] = np.abs(exact).max()
    return res


def cases(seed):
    g = torch.Generator().manual_seed(seed)
    key = torch.randn(1, 128, generator=g)
    ones = np.ones(64)
    rand_beta = torch.rand(64, generator=g).clamp_min(1e-3).double().numpy()
    k = F.normalize(torch.randn(64, 128, generator=g), dim=-1)
    yield "random keys, beta U(0, 1)", k, rand_beta
    yield "random keys, beta 1", F.normalize(torch.randn(64, 128, generator=g), dim=-1), ones
    for noise in (0.0, 0.01, 0.1):
        k = F.normalize(key + noise * torch.randn(64, 128, generator=g), dim=-1)
        yield f"one key + {noise} noise, beta 1", k, ones
    k = F.normalize(torch.randn(8, 128, generator=g), dim=-1).repeat(8, 1)
    yield "8 keys repeated, beta 1", k, ones
    k = F.normalize(key + 0.1 * torch.randn(64, 128, generator=g), dim=-1)
    yield "one key + 0.1 noise, beta 2 (past sigmoid)", k, 2 * ones
    yield "unnormalized randn keys, beta U(0, 1)", torch.randn(64, 128, generator=g), rand_beta


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=5, help="chunks per case (the worst is shown)")
    args = p.parse_args()
    cols = ["fp32", "fp16", "fp16 d8", "bf16", "bound", "max|T|"]
    for out_dtype in (torch.bfloat16, torch.float16):
        print(f"T_u stored as {str(out_dtype)[6:]}; worst of {args.seeds} chunks per case")
        print(f"  {'case':44}" + "".join(f"{c:>11}" for c in cols))
        names = [name for name, _, _ in cases(0)]
        for i, name in enumerate(names):
            rows = [errors(*list(cases(s))[i][1:], out_dtype) for s in range(args.seeds)]
            worst = {c: max(r[c] for r in rows) for c in cols}
            print(f"  {name:44}" + "".join(f"{worst[c]:11.2e}" for c in cols))


if __name__ == "__main__":
    main()
