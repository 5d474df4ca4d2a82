"""A small varlen call of each chunked op on the sm90 path, for compute-sanitizer
memcheck/racecheck: lengths straddle the 64-token chunk, one sequence is empty, GVA ratio 2,
initial and final state, so every role and both pipeline stages wrap around; the delta rule
also runs with use_qk_l2norm_in_kernel, both ops once more cut into segments (the delta
rule's state-map pass reads no v; once more with six segments, two plan CTAs per head), and
the delta rule in its half-fused form (the prep solves the even chunks' inverses)."""
import os

import torch
import torch.nn.functional as F

import dsv4_attn

torch.manual_seed(0)
lens = [1, 64, 0, 65, 200]
cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
t, h, hv = sum(lens), 1, 2
q = F.normalize(torch.randn(1, t, h, 128, device="cuda"), dim=-1).bfloat16()
k = F.normalize(torch.randn(1, t, h, 128, device="cuda"), dim=-1).bfloat16()
v = torch.randn(1, t, hv, 128, device="cuda").bfloat16()
g = -torch.rand(1, t, hv, device="cuda")
beta = torch.rand(1, t, hv, device="cuda")
s0 = torch.randn(len(lens), hv, 128, 128, device="cuda")
path = dsv4_attn.chunk_gated_delta_rule_path(q, k, v, g, beta, cu_seqlens=cu)
assert path == "sm90", f"expected the sm90 path, got {path}"
o1, f1 = dsv4_attn.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=s0,
                                          output_final_state=True, cu_seqlens=cu)
o2, f2 = dsv4_attn.chunk_simple_gla(q, k, v, g, initial_state=s0, output_final_state=True,
                                    cu_seqlens=cu)
# The fused l2norm rewrites q and k in shared memory before the prep's and chain's reads.
o3, f3 = dsv4_attn.chunk_gated_delta_rule(3 * q, k, v, g.bfloat16(), beta.bfloat16(),
                                          initial_state=s0, output_final_state=True,
                                          cu_seqlens=cu.long(), use_qk_l2norm_in_kernel=True)
# Both ops cut into segments, dense with B = 2: from warm-ups (these gates fade within a
# chunk), then through the exact combine (state-only passes, combine, last pass).
os.environ["DSV4_CHUNK_SEGMENTS"] = "3"
dense = [x.view(2, 165, *x.shape[2:])[:, :160].contiguous() for x in (q, k, v, g, beta)]
segmented = []
for warmup in ("1", "0"):
    os.environ["DSV4_CHUNK_WARMUP"] = warmup
    segmented += dsv4_attn.chunk_simple_gla(*dense[:4], initial_state=s0[:2],
                                            output_final_state=True)
    segmented += dsv4_attn.chunk_gated_delta_rule(*dense, initial_state=s0[:2],
                                                  output_final_state=True)
del os.environ["DSV4_CHUNK_WARMUP"]
# Six segments: the delta rule's plan takes two CTAs per head. Head 0 has no decay (the exact
# combine, which marks its segments for the last pass), head 1 decays (warm-ups).
os.environ["DSV4_CHUNK_SEGMENTS"] = "6"
g6 = g[:, :384].clone()
g6[..., 0] = 0.0
segmented += dsv4_attn.chunk_gated_delta_rule(q[:, :384], k[:, :384], v[:, :384], g6,
                                              beta[:, :384], initial_state=s0[:1],
                                              output_final_state=True)
del os.environ["DSV4_CHUNK_SEGMENTS"]
os.environ["DSV4_CHUNK_FUSED"] = "1"
fused = dsv4_attn.chunk_gated_delta_rule(*dense, initial_state=s0[:2], output_final_state=True)
del os.environ["DSV4_CHUNK_FUSED"]
torch.cuda.synchronize()
assert all(torch.isfinite(x).all() for x in (o1, f1, o2, f2, o3, f3, *segmented, *fused))
print("sanitize_chunk: sm90 path ran for both ops (and the fused l2norm), outputs finite")

# The decode step (csrc/sm90/linear_decode): a pool with a skipped and an out-of-range slot,
# T = 2, bf16 state, with the qk l2norm (its block reductions).
qd = torch.randn(5, 2, 2, 128, device="cuda", dtype=torch.bfloat16)
vd = torch.randn(5, 2, 4, 128, device="cuda", dtype=torch.bfloat16)
gd, bd = -torch.rand(5, 2, 4, device="cuda"), torch.rand(5, 2, 4, device="cuda")
pool = (torch.randn(9, 4, 128, 128, device="cuda") * 0.1).bfloat16()
slots = torch.tensor([4, -1, 0, 9, 7], device="cuda")
assert dsv4_attn.gated_delta_rule_decode_path(qd, qd, vd, gd, bd, pool, state_indices=slots) == "sm90"
od = dsv4_attn.gated_delta_rule_decode(qd, qd, vd, gd, bd, pool, state_indices=slots,
                                       use_qk_l2norm_in_kernel=True)
# T = 4 (every Gram product) on an fp32 state.
q4 = torch.randn(3, 4, 2, 128, device="cuda", dtype=torch.bfloat16)
v4 = torch.randn(3, 4, 4, 128, device="cuda", dtype=torch.bfloat16)
g4, b4 = -torch.rand(3, 4, 4, device="cuda"), torch.rand(3, 4, 4, device="cuda")
pool32 = torch.randn(4, 4, 128, 128, device="cuda") * 0.1
o4 = dsv4_attn.gated_delta_rule_decode(q4, q4, v4, g4, b4, pool32,
                                       state_indices=torch.tensor([2, 0, 3], device="cuda"))
torch.cuda.synchronize()
assert torch.isfinite(od).all() and torch.isfinite(pool.float()).all()
assert torch.isfinite(o4).all() and torch.isfinite(pool32).all()
print("sanitize_chunk: gated_delta_rule_decode sm90 path ran, outputs finite")
