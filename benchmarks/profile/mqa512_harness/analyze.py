"""Prints one steady pair of key tiles from a bin/trace dump (relative cycles): the consumers'
events (A = consumer 0, B = consumer 1) and the producers' empty-barrier waits and box issues.
    python3 analyze.py trace.txt          # one pair's timeline
    python3 analyze.py trace.txt tiles    # per work tile (the persistent grid)
    python3 analyze.py trace.txt paged [until]  # bin/paged_trace: every event in time order
    python3 analyze.py trace.txt halves   # bin/paged_trace: each producer warp's stage halves
    python3 analyze.py trace.txt narrow   # the narrow form: where each work tile's cycles go
bin/trace prints `E slot point cycles` lines (harness.cu, csrc/sm90/shared/trace.cuh). The
mqa512 family's slots: 0 and 1 the consumer warpgroups (A, B), 2-5 the producer warps 0-3.
Its points: consumer 1, 2, 10-17, 20-23, 30-38, 40-45 (`names` below and the paged mode),
producer 0-5 a stage half's empty barrier passed (stage * 2 + half), 70-75 its boxes issued
(70 + stage * 2 + half), 8 Q issued, 9 the Q buffer free."""
import sys, collections
CONSUMER_A, CONSUMER_B = 0, 1   # slots
PRODUCERS = (2, 3, 4, 5)        # producer warps 0-3
ev = collections.defaultdict(list)
for line in open(sys.argv[1]):
    if line.startswith('E '):
        _, slot, i, t = line.split(); ev[int(slot)].append((int(i), int(t)))
names = {10:'A start',11:'A max0 arrive',12:'A pown ready',13:'A ownPV done',14:'A max1 synced',15:'A P0 arrive',16:'A P1 synced',17:'A rPV issued',
         20:'qk h-own issued',21:'qk between done',22:'qk h-other issued',23:'qk done',
         30:'B start',31:'B max0 synced',32:'B max1 arrive',33:'B P1 arrive',35:'B P0 synced',36:'B rPV issued',37:'B ownPV done',38:'B rPV done',40:'rowsums'}
# per-pair timeline: split consumer A's slot by event 10 and B's by 30
def pairs(slot, start):
    out, cur = [], None
    for i, t in ev[slot]:
        if i == start:
            cur = {}; out.append(cur)
        if cur is not None and i not in cur: cur[i] = t
    return out
if len(sys.argv) > 2 and sys.argv[2] == 'paged':
    # bin/paged_trace: every event of the traced CTA in time order (cycles from its first), the
    # producer warps' per half (empty wait passed, copies issued, landed, converted) and the
    # consumers' Q K^T and pair steps, until the given cycle (argv[3], default 60000).
    until = int(sys.argv[3]) if len(sys.argv) > 3 else 60000
    def what(slot, i):
        if slot in PRODUCERS:
            kinds = {0: 'empty ok', 70: 'issued', 50: 'landed', 54: 'converted'}
            for base, name in kinds.items():
                if base <= i < base + 4:
                    return f"P{slot - 2} {name} stage {(i - base) // 2} half {(i - base) % 2}"
            return f"P{slot - 2} " + {8: 'Q issued', 9: 'Q buffer free'}.get(i, str(i))
        return f"{'AB'[slot]} " + str(names.get(i, {1: 'tile start', 2: 'Q landed', 41: 'stored',
                                                    42: 'merge: stages free', 43: 'merge: sent',
                                                    44: 'merge: columns in',
                                                    45: 'merge: folded'}.get(i, i)))
    rows = sorted((t, what(slot, i)) for slot in ev for i, t in ev[slot] if t <= until)
    for t, w in rows: print(f"{t:8d} {w}")
    sys.exit(0)
if len(sys.argv) > 2 and sys.argv[2] == 'halves':
    # bin/paged_trace: per producer warp, the medians over its steady stage halves (the first
    # and second half of each key tile it fills) of: release to copies issued, issued to
    # landed, landed to converted, and converted to the next half's release; then consumer
    # A's pair period.
    med = lambda v: sorted(v)[len(v) // 2] if v else 0
    for slot in PRODUCERS:
        halves, cur = [], None
        for i, t in ev[slot]:
            if 0 <= i < 4:
                cur = {'empty': t}; halves.append(cur)
            elif cur is not None:
                for base, key in ((70, 'issued'), (50, 'landed'), (54, 'converted')):
                    if base <= i < base + 4: cur[key] = t
        parts = collections.defaultdict(list)
        steady = [h for h in halves[4:-4] if len(h) == 4]
        for n, (a, b) in enumerate(zip(steady, steady[1:])):
            k = n % 2  # the tile's first or second half
            parts[f'issue{k}'].append(a['issued'] - a['empty'])
            parts[f'land{k}'].append(a['landed'] - a['issued'])
            parts[f'convert{k}'].append(a['converted'] - a['landed'])
            parts[f'to next release{k}'].append(b['empty'] - a['converted'])
        print(f"producer warp {slot - 2} ({len(steady)} halves): " +
              ", ".join(f"{key} {med(v)}" for key, v in sorted(parts.items())))
    starts = [t for i, t in ev[CONSUMER_A] if i == 10]
    print('consumer A pair period', med([b - a for a, b in zip(starts, starts[1:])]))
    sys.exit(0)
if len(sys.argv) > 2 and sys.argv[2] == 'narrow':
    # Each consumer's work tiles (points 60-67, traits.h: kTraceNarrow*), split into: waiting
    # for a key tile's first block, busy on key tiles (first block to P V done), the tail after
    # its last P V until the end of the work tile (65), and from there to its next work tile;
    # for the merging consumer also the wait for the other's partial (66) and the merge and
    # stores (67). Medians over steady tiles, per role.
    for slot in (CONSUMER_A, CONSUMER_B):
        tiles, cur = [], None
        for i, t in ev[slot]:
            if i == 60:
                cur = [(i, t)]; tiles.append(cur)
            elif cur is not None:
                cur.append((i, t))
        parts = collections.defaultdict(lambda: collections.defaultdict(list))
        for a, b in zip(tiles[2:-2], tiles[3:-1]):
            start, nxt = a[0][1], b[0][1]
            wait = busy = 0; last = start; keys = 0
            for i, t in a:
                if i == 61: wait += t - last; first = t; keys += 1
                if i == 64: busy += t - first; last = t
            m = dict((i, t) for i, t in a if i >= 65)
            role = 'merging' if 67 in m else 'handing'
            q = parts[role]
            q['key tiles'].append(keys); q['wait block'].append(wait); q['busy'].append(busy)
            q['tail'].append(m[65] - last)
            if 66 in m: q['partial wait'].append(m[66] - m[65])
            if 67 in m: q['merge+store'].append(m[67] - m.get(66, m[65]))
            q['end to next take'].append(nxt - max(m.values()))
            q['total'].append(nxt - start)
        med = lambda v: sorted(v)[len(v) // 2] if v else 0
        for role, q in parts.items():
            print(f"consumer {'AB'[slot]} {role} ({len(q['total'])} tiles); medians: " +
                  ", ".join(f"{k} {med(v)}" for k, v in q.items()))
    k = len([1 for i, _ in ev[CONSUMER_A] if i == 60]) // 2
    starts = [t for i, t in ev[CONSUMER_A] if i == 60]
    base, end = starts[k], starts[k + 1] if k + 1 < len(starts) else 1 << 62
    nm = {60: 'take', 61: 'block0 landed', 62: 'S done', 63: 'P ready', 64: 'PV done', 65: 'end',
          66: 'partial in', 67: 'stored'}
    rows = sorted((t - base, 'AB'[slot], nm.get(i, i)) for slot in (0, 1) for i, t in ev[slot]
                  if base - 2000 <= t < end)
    # the producer warps in the same window: a ring slot (a key-tile half) freed (0-5), a
    # window tile's TMA issued (70-75), Q issued (8), the Q buffer free (9)
    def producer_event(i):
        if i in (8, 9): return {8: 'Q issued', 9: 'Q buffer free'}[i]
        kind = 'issued' if i >= 70 else 'empty ok'
        return f"{kind} slot {i % 70}"
    rows += [(t - base, f"P{w}", producer_event(i)) for w, slot in enumerate(PRODUCERS)
             for i, t in ev[slot] if base - 2000 <= t < end]
    rows.sort()
    for t, w, n in rows: print(f"{t:7d} {w} {n}")
    sys.exit(0)
if len(sys.argv) > 2 and sys.argv[2] == 'tiles':
    # Per work tile of the traced CTA (consumer 0's events 1 = tile start, 2 = Q landed, 23 = a Q K^T
    # done, 40 = row sums swapped, 41 = epilogue done; the producer's 9 = Q buffer free,
    # 8 = Q issued), relative to the tile's start.
    T = pairs(CONSUMER_A, 1)
    starts = [t[1] for t in T]
    per = [b - a for a, b in zip(starts, starts[1:])]
    print(f"work tiles {len(T)}, cycles per tile: median {sorted(per)[len(per)//2] if per else 0}")
    qi = [t for i, t in ev[PRODUCERS[0]] if i == 8]
    qf = [t for i, t in ev[PRODUCERS[0]] if i == 9]
    for k in range(2, min(len(T), 8)):
        base = T[k][1]
        qk = [t - base for i, t in ev[CONSUMER_A] if i == 23 and base <= t < (starts[k + 1] if k + 1 < len(starts) else 1 << 60)]
        iss = [t - base for t in qi if starts[k - 1] <= t < base + 100000][:2]
        print(f"tile {k}: Q landed {T[k].get(2, base) - base}, Q K^T done {qk}, row sums {T[k].get(40, base) - base}, "
              f"epilogue done {T[k].get(41, base) - base}, next {per[k] if k < len(per) else '-'}; Q issues (from tile start) {iss}")
    sys.exit(0)
A, B = pairs(CONSUMER_A, 10), pairs(CONSUMER_B, 30)
n = min(len(A), len(B))
print(f"pairs A {len(A)} B {len(B)}")
if n > 4:
    per = [A[k+1][10] - A[k][10] for k in range(2, n - 2)]
    print(f"cycles per pair (median over steady pairs): {sorted(per)[len(per)//2]}")
    k = n // 2
    base = A[k][10]
    rows = [(t - base, 'A', names.get(i, i)) for i, t in A[k].items()] + [(t - base, 'B', names.get(i, i)) for i, t in B[k].items()]
    for t, w, nm in sorted(rows): print(f"{t:7d} {w} {nm}")
    # producer events in that window
    end = A[k+1][10]
    for w, slot in enumerate(PRODUCERS):
        for i, t in ev[slot]:
            if base - 3000 <= t <= end:
                what = {8: 'Q issued', 9: 'Q buffer free'}.get(
                    i, f"{'empty ok' if i < 70 else 'issued'} stage {(i % 70) // 2} half {i % 2}")
                print(f"{t-base:7d} P{w} {what}")
