#!/usr/bin/env python3
"""A model of attention_wgmma_fused_grad.cuh's synchronisation, run on the CPU.

Each block is three actors: the producer lane, the consumers (both warpgroups as one: they
meet at named barriers every step) and the writer lane. They meet at transaction barriers with
phases (keysFull, full x2, empty x2, dqFull x2, dqEmpty x2, keysEmpty) and, across blocks, at
the counters of added query tiles. Random interleavings of every block's actors check:

- no deadlock, for a block an item and for persistent grids down to one block;
- no barrier runs two phases past a waiter (the parity would lie);
- no buffer (keys, a stage, a staging tile) is written while its reader still holds it;
- every query tile gets every key tile's dq once, in the fixed order (latest key tile first;
  reversed, earliest first).

`--mutations` checks that the model catches three broken protocols: without the keys-empty
wait, without the staging-free wait, and with the forward order's counter target in the
reversed order. The kernel's steps are the source of truth: change this model with them.
"""
import random
import sys

STAGES = 2


class Barrier:
    def __init__(self, name):
        self.name, self.completed = name, 0

    def arrive(self):
        self.completed += 1

    def passes(self, phase):
        """Whether a wait for phase `phase` (by its parity, as try_wait.parity) passes now."""
        if self.completed >= phase + 2:
            raise AssertionError(f"overrun: {self.name} has completed {self.completed}, a waiter wants {phase}")
        return self.completed > phase


def items(T, bh_count, reversed_):
    """FusedGradItem: (tile, bh, query tiles in the order walked) for each work item w."""
    ktiles, last = (T + 127) // 128, (T - 1) // 64
    for w in range(bh_count * ktiles):
        tile = w % ktiles if reversed_ else ktiles - 1 - w % ktiles
        first = tile * 2
        qts = list(range(last, first - 1, -1)) if reversed_ else list(range(first, last + 1))
        yield tile, w // ktiles, qts


def block_actors(work, added, order, T, reversed_, mutation):
    bars = {n: Barrier(n) for n in ["keysFull", "full0", "full1", "empty0", "empty1", "dqFull0", "dqFull1",
                                     "dqEmpty0", "dqEmpty1", "keysEmpty"]}
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

    def consumers():
        use = 0
        for k, (tile, bh, qts) in enumerate(work):
            yield lambda: bars["keysFull"].passes(k)
            for i in range(len(qts)):
                u = use + i
                yield lambda: bars[f"full{u % 2}"].passes(u // 2)
                held.pop(f"stage{u % 2}")
                bars[f"empty{u % 2}"].arrive()
                if u >= 2 and mutation != "no-staging-free":
                    yield lambda: bars[f"dqEmpty{u % 2}"].passes(u // 2 - 1)
                write(f"staging{u % 2}", u)
                bars[f"dqFull{u % 2}"].arrive()
            held.pop("keys")
            bars["keysEmpty"].arrive()
            use += len(qts)

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

    return [producer(), consumers(), writer()]


def run(T, bh_count, grid, reversed_, seed, mutation=None):
    work = list(items(T, bh_count, reversed_))
    added, order, actors = {}, {}, []
    for b in range(grid):
        actors += block_actors(work[b::grid], added, order, T, reversed_, mutation)
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
    for T in (200, 512, 1024):
        for bh_count in (1, 3, 8):
            total = bh_count * ((T + 127) // 128)
            for grid in sorted({1, 2, 5, total}):
                for reversed_ in (False, True):
                    if mutation == "forward-target" and not reversed_:
                        continue
                    for seed in range(seeds):
                        run(T, bh_count, grid, reversed_, seed, mutation)
                        runs += 1
    return runs


def main():
    if "--mutations" in sys.argv:
        for mutation in ("no-keys-empty", "no-staging-free", "forward-target"):
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
