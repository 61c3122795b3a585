#!/usr/bin/env python3
"""A model of attention_wgmma_fused_grad.cuh's synchronisation, run on the CPU.

Each block is three actors: the producer lane, the consumers (both warpgroups as one: they
meet at named barriers every step) and the writer lane; in the lagged flavour, four: each
consumer warpgroup on its own, meeting the other at the ds^T tiles' ready and freed named
barriers (bar.arrive and bar.sync, 256 threads). They meet at transaction barriers with
phases (keysFull, full x2, empty x2, dqFull x2, dqEmpty x2, keysEmpty) and, across blocks, at
the counters of added query tiles. Random interleavings of every block's actors check:

- no deadlock, for a block an item and for persistent grids down to one block;
- no barrier runs two phases past a waiter (the parity would lie);
- no buffer (keys, a stage, a staging tile, a ds^T tile) is written while its reader still
  holds it, and every dq product reads both halves of its own step's ds^T;
- every query tile gets every key tile's dq once, in the fixed order (latest key tile first;
  reversed, earliest first).

`--mutations` checks that the model catches four broken protocols: without the keys-empty
wait, without the staging-free wait, with the forward order's counter target in the reversed
order, and (lagged) without the ds^T tile's freed sync. The kernel's steps are the source of
truth: change this model with them.
"""
import random
import sys

STAGES = 2


class Barrier:
    """A transaction barrier: a phase completes after `count` arrivals (one an actor here)."""

    def __init__(self, name, count=1):
        self.name, self.count, self.pending, self.completed = name, count, 0, 0

    def arrive(self):
        self.pending += 1
        if self.pending == self.count:
            self.pending, self.completed = 0, self.completed + 1

    def passes(self, phase):
        """Whether a wait for phase `phase` (by its parity, as try_wait.parity) passes now."""
        if self.completed >= phase + 2:
            raise AssertionError(f"overrun: {self.name} has completed {self.completed}, a waiter wants {phase}")
        return self.completed > phase


class NamedBarrier:
    """A named barrier of the two consumer warpgroups (256 threads): a generation completes when
    both have arrived (bar.arrive) or synced (bar.sync). One warpgroup arriving twice in a
    generation would complete it without the other: an error."""

    def __init__(self, name):
        self.name, self.arrived, self.generation = name, set(), 0

    def arrive(self, wg):
        assert wg not in self.arrived, f"{self.name}: warpgroup {wg} arrives twice in a generation"
        self.arrived.add(wg)
        if len(self.arrived) == 2:
            self.arrived, self.generation = set(), self.generation + 1

    def sync(self, wg):
        """bar.sync as a generator: arrive, then wait for the generation to complete."""
        target = self.generation + 1
        self.arrive(wg)
        yield lambda: self.generation >= target


def items(T, bh_count, reversed_):
    """FusedGradItem: (tile, bh, query tiles in the order walked) for each work item w."""
    ktiles, last = (T + 127) // 128, (T - 1) // 64
    for w in range(bh_count * ktiles):
        tile = w % ktiles if reversed_ else ktiles - 1 - w % ktiles
        first = tile * 2
        qts = list(range(last, first - 1, -1)) if reversed_ else list(range(first, last + 1))
        yield tile, w // ktiles, qts


def block_actors(work, added, order, T, reversed_, mutation, lagged=False):
    consumers_n = 2 if lagged else 1  # the consumer actors: both warpgroups as one, or each
    bars = {n: Barrier(n) for n in ["keysFull", "full0", "full1", "dqEmpty0", "dqEmpty1"]}
    for n in ["empty0", "empty1", "dqFull0", "dqFull1", "keysEmpty"]:
        bars[n] = Barrier(n, consumers_n)
    held = {}  # buffer -> the step that still reads it

    def write(buffer, step):
        assert buffer not in held, f"hazard: {buffer} written at {step} while step {held[buffer]} reads it"
        held[buffer] = step

    def producer():
        use = 0
        for k, (tile, bh, qts) in enumerate(work):
            def stage(u):
                if u >= STAGES:
                    yield lambda: bars[f"empty{u % 2}"].passes(u // 2 - 1)
                write(f"stage{u % 2}", u)
                bars[f"full{u % 2}"].arrive()
            early = min(STAGES, len(qts))
            for i in range(early):
                yield from stage(use + i)
            if k > 0 and mutation != "no-keys-empty":
                yield lambda: bars["keysEmpty"].passes(k - 1)
            write("keys", k)
            bars["keysFull"].arrive()
            for i in range(early, len(qts)):
                yield from stage(use + i)
            use += len(qts)

    def post(u, writes):
        """postQueryGrads: step u's dq into its staging tile once the writer has freed it (the
        tile written by `writes`: one actor for both warpgroups' halves), then dqFull."""
        if u >= 2 and mutation != "no-staging-free":
            yield lambda: bars[f"dqEmpty{u % 2}"].passes(u // 2 - 1)
        if writes:
            write(f"staging{u % 2}", u)
        bars[f"dqFull{u % 2}"].arrive()

    def consumers():
        use = 0
        for k, (tile, bh, qts) in enumerate(work):
            yield lambda: bars["keysFull"].passes(k)
            for i in range(len(qts)):
                u = use + i
                yield lambda: bars[f"full{u % 2}"].passes(u // 2)
                held.pop(f"stage{u % 2}")
                bars[f"empty{u % 2}"].arrive()
                yield from post(u, True)
            held.pop("keys")
            bars["keysEmpty"].arrive()
            use += len(qts)

    named = {(kind, b, c): NamedBarrier(f"{kind}{b}.{c}") for kind in ("ready", "freed") for b in (0, 1)
             for c in (0, 1)}
    ds = {}  # (tile, half) -> the step whose ds^T it holds
    ds_read = set()  # (step, warpgroup): that warpgroup's dq product has read the step's tile

    def lagged_consumer(c):
        """consumeFusedItemLagged and the kernel's drain, for warpgroup c."""
        other, use = 1 - c, 0

        def query_grads(u):  # the dq product of step u, then its staging
            yield from named[("ready", u % 2, other)].sync(c)
            for half in (0, 1):
                assert ds.get((u % 2, half)) == u, f"step {u}'s dq reads tile {u % 2} half {half}: " \
                    f"it holds step {ds.get((u % 2, half))}"
            ds_read.add((u, c))
            named[("freed", u % 2, c)].arrive(c)
            yield from post(u, c == 0)

        for k, (tile, bh, qts) in enumerate(work):
            yield lambda: bars["keysFull"].passes(k)
            for i in range(len(qts)):
                u = use + i
                yield lambda: bars[f"full{u % 2}"].passes(u // 2)
                if u >= 2 and mutation != "no-ds-freed":
                    yield from named[("freed", u % 2, other)].sync(c)
                if u >= 2:
                    assert (u - 2, other) in ds_read, f"step {u}: ds^T tile {u % 2} written before read"
                ds[(u % 2, c)] = u
                named[("ready", u % 2, c)].arrive(c)
                if i > 0:
                    yield from query_grads(u - 1)
                if c == 1:
                    held.pop(f"stage{u % 2}")
                bars[f"empty{u % 2}"].arrive()
            yield from query_grads(use + len(qts) - 1)
            if c == 1:
                held.pop("keys")
            bars["keysEmpty"].arrive()
            use += len(qts)
        for u in range(max(0, use - 2), use):
            yield from named[("freed", u % 2, other)].sync(c)

    def writer():
        use, ktiles = 0, (T + 127) // 128
        for tile, bh, qts in work:
            for i, qt in enumerate(qts):
                u, rows = use + i, min(64, T - qt * 64)
                latest = min(ktiles - 1, (qt * 64 + rows - 1) // 128)
                yield lambda: bars[f"dqFull{u % 2}"].passes(u // 2)
                want = tile if reversed_ and mutation != "forward-target" else latest - tile
                yield lambda: added.get((bh, qt), 0) == want
                order.setdefault((bh, qt), []).append(tile)
                added[(bh, qt)] = added.get((bh, qt), 0) + 1
                held.pop(f"staging{u % 2}")
                bars[f"dqEmpty{u % 2}"].arrive()
            use += len(qts)

    if lagged:
        return [producer(), lagged_consumer(0), lagged_consumer(1), writer()]
    return [producer(), consumers(), writer()]


def run(T, bh_count, grid, reversed_, seed, mutation=None, lagged=False):
    work = list(items(T, bh_count, reversed_))
    added, order, actors = {}, {}, []
    for b in range(grid):
        actors += block_actors(work[b::grid], added, order, T, reversed_, mutation, lagged)
    rnd, waiting = random.Random(seed), []
    for actor in actors:
        try:
            waiting.append([actor, next(actor)])
        except StopIteration:
            pass
    while waiting:
        ready = [w for w in waiting if w[1]()]
        if not ready:
            raise AssertionError("deadlock")
        chosen = rnd.choice(ready)
        try:
            chosen[1] = chosen[0].send(None)
        except StopIteration:
            waiting.remove(chosen)
    ktiles = (T + 127) // 128
    for (bh, qt), tiles in order.items():
        assert tiles == sorted(tiles, reverse=not reversed_), f"query tile {qt}: added in the order {tiles}"
        rows = min(64, T - qt * 64)
        assert len(tiles) == min(ktiles - 1, (qt * 64 + rows - 1) // 128) + 1, f"query tile {qt}: {tiles}"


def sweep(mutation=None, seeds=20):
    runs = 0
    for lagged in (False, True):
        runs += sweep_flavour(mutation, seeds, lagged)
    return runs


def sweep_flavour(mutation, seeds, lagged):
    runs = 0
    for T in (200, 512, 1024):
        for bh_count in (1, 3, 8):
            total = bh_count * ((T + 127) // 128)
            for grid in sorted({1, 2, 5, total}):
                for reversed_ in (False, True):
                    if mutation == "forward-target" and not reversed_:
                        continue
                    for seed in range(seeds):
                        run(T, bh_count, grid, reversed_, seed, mutation, lagged)
                        runs += 1
    return runs


def main():
    if "--mutations" in sys.argv:
        for mutation in ("no-keys-empty", "no-staging-free", "forward-target", "no-ds-freed"):
            try:
                sweep(mutation, seeds=3)
            except AssertionError as caught:
                print(f"{mutation}: caught ({caught})")
                continue
            print(f"{mutation}: NOT caught")
            return 1
    print(f"the fused gradient's protocol: {sweep()} interleavings, no deadlock, overrun or hazard")
    return 0


if __name__ == "__main__":
    sys.exit(main())
