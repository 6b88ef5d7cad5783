"""A CPU model of the warp-specialized forward's barrier protocol (not a test of the kernel: of its schedule): the
shipped kernel `vsagen/kernels/bsa_forward_ws.py` (one consumer, one producer, a ring of 3) and the variants of the
retired experiment `benchmarks/gluon_ws_fwd.py` (two consumers, ping-pong, a shared ring; source at commit 86581d0,
measured slower on the H100, BENCHMARKS.md 2026-12-06).

The warp-specialized kernel cannot run here (Gluon has no interpreter) and a wrong phase or a missing arrive only
shows on the GPU as a hang or as a K / V buffer overwritten while it is read. This script replays the kernel's
producer and consumer loops event by event, as written there, against a model of Hopper's mbarriers (a phase
completes when its arrivals are in; `wait(bar, parity)` passes while the phase of that parity is the last one
completed, so a fresh barrier passes parity 1; a TMA load arrives when it lands, at a random later time), under
random interleavings of the four agents (two consumers, two producers), for one or two consumers, with and
without ping-pong, one ring per consumer or one shared by both (the `:s` variants), rings of 2-4 buffers (one
deadlocks, as it must: the kernel needs two) and key-list lengths 0, 1, 2, ... It checks that nothing deadlocks,
that every consumer computes with the tile it expects in the buffer it reads, that no load lands in a buffer still
being read, and (ping-pong) that the two consumers' issue events alternate while both have events left.

Usage: python3 benchmarks/ws_protocol.py [--trials 3000] [--seed 0]
"""

from __future__ import annotations

import argparse
import random
import sys


class Barrier:
    """An mbarrier: `count` arrivals complete a phase; `completed` phases so far."""

    def __init__(self, count: int = 1) -> None:
        self.count, self.pending, self.completed = count, count, 0

    def arrive(self) -> None:
        self.pending -= 1
        if self.pending == 0:
            self.completed += 1
            self.pending = self.count

    def passes(self, parity: int) -> bool:
        """`mbarrier.try_wait.parity`: true once the phase of this parity has completed (and not the next one)."""
        return (self.completed & 1) != parity


class Violation(AssertionError):
    pass


def consumer(ci, cnt, cnt_other, stages, ping, shared, st):
    """Consumer `ci`'s events as `_consumer` issues them; yields ("wait", barrier, parity) where it waits. With
    `shared` both consumers walk one ring (producer 0's), each releasing every buffer."""
    events_other = (cnt_other + 1 if cnt_other > 0 else 0) if ping else 0
    ring = 0 if shared else ci
    slot = lambda j: ring * stages + j % stages  # noqa: E731 - as the kernel indexes its ring

    def turn_wait(j):
        if not ping:
            return
        if ci == 0 and j >= 1 and j - 1 < events_other:
            yield ("wait", st["turn"][0], (j - 1) & 1)
        if ci == 1 and j < events_other:
            yield ("wait", st["turn"][1], j & 1)

    def issue(j):
        if ping:
            st["order"].append((ci, j))
            st["turn"][1 - ci].arrive()

    def read(s, j, what):
        if st["content"][s] != (ring, j):
            raise Violation(f"consumer {ci} {what} of tile {j} read buffer {s} holding {st['content'][s]}")
        st["reading"][s] += 1

    def release(s):
        st["reading"][s] -= 1
        st["empty"][s].arrive()

    if cnt > 0:  # event 0
        yield from turn_wait(0)
        yield ("wait", st["ready"][slot(0)], 0)
        read(slot(0), 0, "Q K^T")
        issue(0)
        yield ("step",)
    for j in range(1, cnt):
        yield from turn_wait(j)
        yield ("wait", st["ready"][slot(j)], (j // stages) & 1)
        read(slot(j), j, "Q K^T")
        issue(j)
        yield ("step",)  # the products run; the softmax; the P V product of tile j - 1 completes
        release(slot(j - 1))
    if cnt > 0:  # event cnt: the last product
        yield from turn_wait(cnt)
        issue(cnt)
        yield ("step",)
        release(slot(cnt - 1))


def producer(ci, cnt, stages, st):
    """Producer `ci`'s loads as `_producer` issues them."""
    for j in range(cnt):
        s = ci * stages + j % stages
        yield ("wait", st["empty"][s], ((j // stages) & 1) ^ 1)
        if st["reading"][s]:
            raise Violation(f"producer {ci} loads tile {j} into buffer {s} while it is read")
        st["inflight"].append((s, (ci, j)))  # lands later: then it arrives on ready[s]
        yield ("step",)


def simulate(ncons, stages, ping, counts, rng, shared=False) -> list[tuple[int, int]]:
    """Run one CTA's protocol under a random interleaving; returns the ping-pong issue order.

    Raises:
        Violation: a deadlock, a wrong buffer read, a load into a buffer being read, or issues out of turn.
    """
    rings = 1 if shared else ncons
    st = {"ready": [Barrier() for _ in range(rings * stages)],
          "empty": [Barrier(2 if shared else 1) for _ in range(rings * stages)],
          "turn": [Barrier(), Barrier()], "content": [None] * (rings * stages), "reading": [0] * (rings * stages),
          "inflight": [], "order": []}
    agents = []
    for ci in range(ncons):
        other = counts[1 - ci] if ncons == 2 else 0
        agents.append(consumer(ci, counts[ci], other, stages, ping, shared, st))
        if ci < rings:
            agents.append(producer(ci, counts[ci], stages, st))
    blocked = {i: None for i in range(len(agents))}
    live = set(range(len(agents)))
    while live or st["inflight"]:
        runnable = [i for i in live if blocked[i] is None or blocked[i][0].passes(blocked[i][1])]
        if st["inflight"] and (not runnable or rng.random() < 0.3):  # a load lands
            s, tag = st["inflight"].pop(rng.randrange(len(st["inflight"])))
            if st["reading"][s]:
                raise Violation(f"a load of tile {tag} lands in buffer {s} while it is read")
            st["content"][s] = tag
            st["ready"][s].arrive()
            continue
        if not runnable:
            raise Violation(f"deadlock: ncons {ncons} stages {stages} ping {ping} counts {counts}")
        i = rng.choice(runnable)
        blocked[i] = None
        try:
            ev = next(agents[i])
        except StopIteration:
            live.discard(i)
            continue
        if ev[0] == "wait":
            blocked[i] = (ev[1], ev[2])
    if ping:
        both = min(counts) + 1 if min(counts) > 0 else 0  # events while both consumers have some
        want = [(c, j) for j in range(both) for c in (0, 1)]
        if st["order"][:2 * both] != want:
            raise Violation(f"issues out of turn: {st['order'][:2 * both]} for counts {counts}")
    return st["order"]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    rng = random.Random(a.seed)
    runs = 0
    for ncons, ping, shared in ((1, 0, False), (2, 0, False), (2, 1, False), (2, 0, True), (2, 1, True)):
        try:  # one buffer cannot work: event j's Q K_j^T needs tile j while P_{j-1} V_{j-1} still reads j - 1
            simulate(ncons, 1, ping, [3, 3], rng, shared)
            raise AssertionError("one buffer did not deadlock")
        except Violation as e:
            assert "deadlock" in str(e), e
        for stages in (2, 3, 4):
            for _ in range(a.trials // 12):
                counts = [rng.choice([0, 1, 2, 3, rng.randrange(0, 12)]) for _ in range(2)]
                if shared:  # one list for both consumers
                    counts[1] = counts[0]
                simulate(ncons, stages, ping, counts if ncons == 2 else counts[:1] + [0], rng, shared)
                runs += 1
    print(f"{runs} interleavings: no deadlock, every read of the right tile, no load into a buffer being read, "
          "ping-pong issues alternating")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
