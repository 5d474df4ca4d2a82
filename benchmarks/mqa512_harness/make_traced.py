"""Writes traced/mqa512/mqa512_sm90_kernel.cuh: a copy of the kernel with clock64() trace points
(TRC: consumer events, TRP: producer events) inserted after anchor lines. An anchor that no
longer matches the kernel stops the script: move it with the code."""
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
src = open(sys.argv[1] if len(sys.argv) > 1 else
           os.path.join(here, '../../csrc/sm90/mqa512/kernel.cuh')).read()
out_dir = sys.argv[2] if len(sys.argv) > 2 else os.path.join(here, 'traced')
def after(anchor, code, count=1):
    global src
    assert src.count(anchor) >= count, anchor
    i = src.index(anchor)
    src = src[:i + len(anchor)] + code + src[i + len(anchor):]
def before(anchor, code):
    global src
    assert src.count(anchor) == 1, anchor
    i = src.index(anchor)
    src = src[:i] + code + src[i:]
C = lambda i: f"\n TRC({i});\n"
P = lambda e: f"\n TRP({e});\n"
after('// 1. Fold S into the running max, publish it, exponentiate.', C(10))
after('  const int num_work = p.num_work;', '\n  int _trn = 0;\n')
after('publish(s.row_max[0], m_new, kMax0Ready);', C(11))
after('ptx::named_barrier_sync(kPOwn0Ready, 128);', C(12))
after('ptx::mbarrier_arrive(kv_empty(0, 0));', C(13))
after('wait_handoff(kMax1Ready, phase0);', C(14))
after('publish(s.row_scale, factor, kP0Ready);', C(15))
after('wait_handoff(kP1Ready, phase1);', C(16))
after('issue_pv_smem(s.p[1], 1);\n            ptx::wgmma_commit();', C(17))
after('issue_qk_half(wg, true, phase);', C(20))
after('        between();', C(21))
after('issue_qk_half(1 - wg, false, phase);', C(22))
after('for (int i = 0; i < 32; ++i) ptx::fence_operand(sacc[i]);', C(23))
after('float mx[2] = {neg_inf, neg_inf};', C(30))
after('wait_handoff(kMax0Ready, phase0);', C(31))
after('publish(s.row_max[1], m_new, kMax1Ready);', C(32))
after('ptx::mbarrier_arrive(ptx::smem_addr(&s.handoff[kP1Ready]));', C(33))
after('wait_handoff(kP0Ready, phase0);', C(35))
after('issue_pv_smem(s.p[0], 0);\n          ptx::wgmma_commit();', C(36))
after('if (has_odd) ptx::mbarrier_arrive(kv_empty(1, 1));', C(37))
after('ptx::mbarrier_arrive(kv_empty(0, 1));', C(38))
after('wait_handoff(kRowSums, progress.slot());', C(40))
# Work-tile events: tile start, Q landed, epilogue done; the producer's Q wait and issue.
after("    const int n = info.n;  // this split's key tiles", C(1))
after('ptx::mbarrier_wait(q_full, progress.q());', C(2))
before('  }\n}\n\n}  // namespace dsv4', C(41))
after('ptx::mbarrier_wait(q_empty, progress.q() ^ 1);', P(9))
after('w.q_start + w.tok0, w.head0, w.batch);\n          }', P(8))
after('ptx::mbarrier_wait(kv_empty(stage, half), phase ^ 1);', P('stage * 2 + half'))
after('ptx::mbarrier_arrive_expect_tx(full, T::kBlockBytes);', P('4 + stage * 2 + half'))
src = src.replace('namespace dsv4 {', '#define TRC(i) do { if (tid == 0) TR(1 + wg, i); } while (0)\n#define TRP(i) do { if (lane == 0) TR(3 + threadIdx.x / 32, i); } while (0)\nnamespace dsv4 {', 1)
os.makedirs(out_dir + '/mqa512', exist_ok=True)
open(out_dir + '/mqa512/mqa512_sm90_kernel.cuh', 'w').write(src)
print('traced kernel written')
