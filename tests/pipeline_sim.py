"""A discrete-event simulation of Megatron's pipeline schedules, the check on the step-time
formula of ``autopar.stages``.

Each rank runs its operations in Megatron's order, one at a time: 1F1B
(``forward_backward_pipelining_without_interleaving``: ``p - i - 1`` warm-up forwards, then
forward/backward pairs, then the remaining backwards) or interleaved
(``forward_backward_pipelining_with_interleaving``: ``2*(p - i - 1) + (v-1)*p`` warm-up forwards
in ``get_schedule_table`` order, then pairs, then backwards, backward chunks in reverse). An
operation starts when its rank is free and its input is ready: the forward of micro-batch ``b``
on virtual stage ``q`` after its forward on ``q - 1``; the backward after the backward on
``q + 1`` (after its own forward on the last virtual stage). Communication is free.
"""

from __future__ import annotations

from autopar.stages import schedule_chunks


def rank_ops(p: int, v: int, m: int, rank: int) -> list[tuple[str, int, int]]:
    """``(F|B, micro-batch, chunk)`` in the order ``rank`` runs them."""
    if v == 1:
        warmup = min(p - rank - 1, m)
        forwards = [("F", b, 0) for b in range(m)]
        backwards = [("B", b, 0) for b in range(m)]
    else:
        total = m * v
        warmup = min(2 * (p - rank - 1) + (v - 1) * p, total)
        chunks = schedule_chunks(m, v, p)
        seen = [0] * v
        forwards, backwards = [], []
        seen_b = [0] * v
        for k in range(total):
            c = chunks[k]
            forwards.append(("F", seen[c], c))
            seen[c] += 1
            cb = v - 1 - c
            backwards.append(("B", seen_b[cb], cb))
            seen_b[cb] += 1
    ops = forwards[:warmup]
    steady = len(forwards) - warmup
    for k in range(steady):
        ops.append(forwards[warmup + k])
        ops.append(backwards[k])
    ops += backwards[steady:]
    return ops


def simulate(fwd: list[list[float]], bwd: list[list[float]], m: int) -> float:
    """Makespan of one step; ``fwd[i][j]`` / ``bwd[i][j]``: chunk ``j`` of rank ``i``."""
    p, v = len(fwd), len(fwd[0])
    stages = p * v
    ops = [rank_ops(p, v, m, i) for i in range(p)]
    done: dict[tuple[str, int, int], float] = {}
    pos = [0] * p
    free = [0.0] * p
    remaining = sum(len(o) for o in ops)
    while remaining:
        progressed = False
        for i in range(p):
            while pos[i] < len(ops[i]):
                kind, b, c = ops[i][pos[i]]
                q = c * p + i
                if kind == "F":
                    dep = ("F", b, q - 1) if q > 0 else None
                else:
                    dep = ("B", b, q + 1) if q < stages - 1 else ("F", b, q)
                if dep is not None and dep not in done:
                    break
                start = max(free[i], done[dep] if dep else 0.0)
                free[i] = start + (fwd[i][c] if kind == "F" else bwd[i][c])
                done[(kind, b, q)] = free[i]
                pos[i] += 1
                remaining -= 1
                progressed = True
        assert progressed, "schedule deadlocked"
    return max(free)
