"""Goodput under failures (issue 22): the checkpoint a layout writes, the interval between
checkpoints that maximises the fraction of wall time that trains, and that fraction.

**Failures** arrive as a Poisson process of mean ``M = gpu_mtbf_hours * 3600 / num_gpus``
seconds (``autopar.inputs.reliability``). **Checkpoint**: the most loaded rank writes
``rank_bytes`` (the cost model's ``checkpoint`` term, ``cost_models.checkpoint``); a server's
GPUs share its storage bandwidth, so a checkpoint takes ``write_s = gpus_per_server x rank_bytes
/ server_bytes_per_s`` (the slowest server: with ``tp*cp*dp >= gpus_per_server`` a server holds
ranks of one stage only; otherwise this is an upper bound), after a copy of the rank's shards to
host memory, ``snapshot_s = rank_bytes / host_bytes_per_s``. A synchronous save blocks for
``delta = snapshot_s + write_s``; an asynchronous one (Megatron ``--async-save``, torch DCP
``async_save``) for ``delta = snapshot_s`` only, and its files are durable ``write_s`` later: a
failure in that window rolls back one more interval (probability ``write_s / tau``, cost
``tau``), so the work lost per failure grows by ``write_s``, which enters as restart time, and
the interval may not be shorter than ``write_s`` (the worker must be done: Megatron warns
"Starting a checkpoint save before previous has finished", ``checkpointing.py`` L650-653).

**Wall time** (Daly 2006, "A higher order estimate of the optimum checkpoint interval for
restart dumps", FGCS 22(3) 303-312, the complete model): with ``tau`` training seconds between
checkpoints and ``R`` seconds lost per failure besides the interval (restart, and the async
write lag), the wall time per second of training is

    T_w / T_s = M e^{R/M} (e^{(tau + delta)/M} - 1) / tau,      goodput = T_s / T_w.

Its exact minimiser solves ``(1 - tau/M) e^{(tau+delta)/M} = 1``, i.e. ``tau = M (1 +
W0(-e^{-delta/M - 1}))`` (Lambert W, principal branch), which ``optimal_interval_s`` computes;
Young's first-order ``sqrt(2 delta M)`` (Young 1974, CACM 17(9) 530-531) and Daly's perturbation
estimate (his eq. for ``delta < 2M``) are its approximations (``young_interval_s``,
``daly_interval_s``; tests/test_goodput.py checks all three against each other and against a
brute-force minimisation of ``T_w``). ``R`` scales ``T_w`` and so does not move the optimum.

The search ranks layouts by ``step_time_s / goodput`` at the optimal (continuous) interval:
that factor depends on the layout only through the checkpoint term's axes, so it is a table
(``OverheadFactor``) that multiplies every time table (``autopar.search.cpsat``). Reports round
the interval to whole steps (the better of the two neighbours), which moves the goodput by
far less than its last printed digit once the interval is a few steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.base.errors import InputError
from autopar.costs.terms import CheckpointTerm, CostModel, Grid, TermContext
from autopar.inputs.reliability import DEFAULT_HOST_BYTES_PER_S
from autopar.layout.plan import Goodput

SECONDS_PER_DAY = 86_400.0
SECONDS_PER_HOUR = 3_600.0
_NEWTON_STEPS = 50


def young_interval_s(delta_s: np.ndarray, mtbf_s: np.ndarray) -> np.ndarray:
    """Young 1974: ``sqrt(2 delta M)``."""
    return np.sqrt(2.0 * np.asarray(delta_s, dtype=np.float64) * mtbf_s)


def daly_interval_s(delta_s: np.ndarray, mtbf_s: np.ndarray) -> np.ndarray:
    """Daly 2006's higher-order estimate: ``sqrt(2 delta M) [1 + sqrt(delta/2M)/3 + delta/18M]
    - delta`` for ``delta < 2M``, else ``M``."""
    delta = np.asarray(delta_s, dtype=np.float64)
    x = delta / (2.0 * mtbf_s)
    estimate = np.sqrt(2.0 * delta * mtbf_s) * (1.0 + np.sqrt(x) / 3.0 + x / 9.0) - delta
    return np.where(delta < 2.0 * mtbf_s, estimate, mtbf_s)


def optimal_interval_s(delta_s: np.ndarray, mtbf_s: np.ndarray) -> np.ndarray:
    """The exact minimiser of Daly's wall time: ``u = tau/M`` solves ``log(1 - u) + u + d = 0``
    with ``d = delta/M`` (module docstring), by Newton's method from the branch-point series of
    Lambert W (``u ~ p - p^2/3 + 11 p^3/72``, ``p = sqrt(2(1 - e^-d))``), which is within 1% at
    the start and converges quadratically; ``_log1p_neg_plus`` keeps it exact for tiny ``d``."""
    d = np.asarray(delta_s, dtype=np.float64) / mtbf_s
    p = np.sqrt(2.0 * -np.expm1(-d))
    u = np.clip(p - p * p / 3.0 + 11.0 * p**3 / 72.0, 1e-300, 1.0 - 1e-16)
    for _ in range(_NEWTON_STEPS):
        f = _log1p_neg_plus(u) + d
        step = f * (1.0 - u) / u
        nxt = np.clip(u + step, 1e-300, 1.0 - 1e-16)
        if np.all(np.abs(nxt - u) <= 1e-15 * u):
            u = nxt
            break
        u = nxt
    return u * mtbf_s


def _log1p_neg_plus(u: np.ndarray) -> np.ndarray:
    """``log(1 - u) + u`` without cancellation: ``-sum_{k>=2} u^k / k`` below 0.5 (48 terms
    leave less than 0.5^48 of it), ``log1p`` above."""
    series = np.zeros_like(u)
    power = u * u
    for k in range(2, 50):
        series -= power / k
        power = power * u
    return np.where(u < 0.5, series, np.log1p(-u) + u)


def goodput_fraction(
    interval_s: np.ndarray, delta_s: np.ndarray, mtbf_s: np.ndarray, lost_s: np.ndarray
) -> np.ndarray:
    """``T_s / T_w`` of Daly's model (module docstring): ``tau / (M e^{R/M} (e^{(tau +
    delta)/M} - 1))``."""
    tau = np.asarray(interval_s, dtype=np.float64)
    with np.errstate(over="ignore"):  # steps far longer than the job's MTBF: goodput 0
        return tau / (mtbf_s * np.exp(lost_s / mtbf_s) * np.expm1((tau + delta_s) / mtbf_s))


@dataclass(frozen=True, slots=True)
class CheckpointCost:
    """Per layout (arrays): what one checkpoint costs and what a failure loses."""

    rank_bytes: np.ndarray
    server_bytes: np.ndarray
    write_s: np.ndarray
    snapshot_s: np.ndarray
    blocking_s: np.ndarray
    """Seconds training stops per checkpoint (``delta``)."""
    lag_s: np.ndarray
    """Seconds a checkpoint takes to become durable after training resumes (async: the write)."""
    mtbf_s: float
    restart_s: float


def checkpoint_cost(
    rank_bytes: np.ndarray, server_bytes: np.ndarray, ctx: TermContext
) -> CheckpointCost:
    """The checkpoint that makes the most loaded rank write ``rank_bytes`` and the most loaded
    server ``server_bytes``, on ``ctx``'s cluster."""
    cluster, training = ctx.cluster, ctx.training
    reliability = cluster.reliability
    rank_bytes = np.asarray(rank_bytes, dtype=np.float64)
    server_bytes = np.broadcast_to(np.asarray(server_bytes, dtype=np.float64), rank_bytes.shape)
    write_s = server_bytes / reliability.server_bytes_per_s(cluster.gpus_per_server)
    snapshot_s = rank_bytes / (cluster.gpu.host_bytes_per_s or DEFAULT_HOST_BYTES_PER_S)
    asynchronous = training.stack.async_checkpoint
    return CheckpointCost(
        rank_bytes=rank_bytes,
        server_bytes=server_bytes,
        write_s=write_s,
        snapshot_s=snapshot_s,
        blocking_s=snapshot_s if asynchronous else snapshot_s + write_s,
        lag_s=write_s if asynchronous else np.zeros_like(write_s),
        mtbf_s=reliability.job_mtbf_s(training.num_gpus),
        restart_s=reliability.restart_s,
    )


def best_interval_s(cost: CheckpointCost) -> np.ndarray:
    """The optimal training time between checkpoints, no shorter than the async write lag."""
    return np.maximum(optimal_interval_s(cost.blocking_s, cost.mtbf_s), cost.lag_s)


def best_goodput(cost: CheckpointCost) -> np.ndarray:
    """The goodput at ``best_interval_s``."""
    return goodput_fraction(
        best_interval_s(cost), cost.blocking_s, cost.mtbf_s, cost.restart_s + cost.lag_s
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class OverheadFactor:
    """``1 / goodput`` at the optimal interval, per layout: the expected wall seconds per
    training second, a table over the checkpoint term's axes that the search multiplies into
    every time table to minimise the expected time per useful step (``--objective goodput``)."""

    checkpoint: CheckpointTerm
    """The cost model's checkpoint term."""
    name: str = "failure_overhead"
    category: str = "goodput"

    @property
    def depends_on(self) -> tuple[str, ...]:
        return tuple(self.checkpoint.depends_on)

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        cost = checkpoint_of(self.checkpoint, grid, ctx)
        return 1.0 / best_goodput(cost)


def checkpoint_of(term: CheckpointTerm, grid: Grid, ctx: TermContext) -> CheckpointCost:
    """``checkpoint_cost`` of the layouts of ``grid`` under the cost model's checkpoint term."""
    return checkpoint_cost(term.rank_bytes(grid, ctx), term.evaluate(grid, ctx), ctx)


def overhead_factor(cost_model: CostModel) -> OverheadFactor:
    """The factor for ``cost_model``; ``InputError`` when it has no checkpoint term."""
    if cost_model.checkpoint is None:
        raise InputError(
            f"cost model {cost_model.name!r} has no checkpoint term; --objective goodput "
            "needs one (CostModel.checkpoint)",
            source="--objective",
        )
    return OverheadFactor(checkpoint=cost_model.checkpoint)


def _whole_steps(cost: CheckpointCost, step_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The interval in whole steps (the better neighbour of the optimum, at least one step and
    at least the async lag) and its goodput."""
    best = best_interval_s(cost) / step_s
    low = np.maximum(1.0, np.floor(best))
    high = np.maximum(low + 1.0, np.ceil(best))
    lag_steps = np.ceil(cost.lag_s / step_s - 1e-9)
    low, high = np.maximum(low, lag_steps), np.maximum(high, lag_steps)
    lost = cost.restart_s + cost.lag_s

    def fraction(steps: np.ndarray) -> np.ndarray:
        return goodput_fraction(steps * step_s, cost.blocking_s, cost.mtbf_s, lost)

    g_low, g_high = fraction(low), fraction(high)
    steps = np.where(g_low >= g_high, low, high)
    return steps, np.maximum(g_low, g_high)


def goodput_figures(
    step_s: np.ndarray, grid: Grid, ctx: TermContext, cost_model: CostModel
) -> list[Goodput] | None:
    """One ``Goodput`` per layout of ``grid`` (with its step times), or ``None`` without a
    checkpoint term."""
    if cost_model.checkpoint is None:
        return None
    size = len(step_s)
    cost = checkpoint_of(cost_model.checkpoint, grid, ctx)
    steps, fraction = _whole_steps(cost, np.asarray(step_s, dtype=np.float64))
    reliability = ctx.cluster.reliability
    per_day = SECONDS_PER_DAY / cost.mtbf_s

    def at(values: np.ndarray, i: int) -> float:
        return float(np.broadcast_to(values, (size,))[i])

    return [
        Goodput(
            num_gpus=ctx.training.num_gpus,
            gpu_mtbf_hours=reliability.gpu_mtbf_hours,
            restart_s=reliability.restart_s,
            job_mtbf_s=cost.mtbf_s,
            interruptions_per_day=per_day,
            checkpoint_bytes_per_gpu=at(cost.rank_bytes, i),
            checkpoint_bytes_per_server=at(cost.server_bytes, i),
            checkpoint_write_s=at(cost.write_s, i),
            checkpoint_snapshot_s=at(cost.snapshot_s, i),
            checkpoint_blocking_s=at(cost.blocking_s, i),
            async_checkpoint=ctx.training.stack.async_checkpoint,
            checkpoint_interval_s=float(steps[i] * step_s[i]),
            checkpoint_interval_steps=int(steps[i]),
            goodput=float(fraction[i]),
            time_per_useful_step_s=float(step_s[i] / fraction[i]) if fraction[i] > 0 else None,
        )
        for i in range(size)
    ]


def run_figures(
    tokens_per_s: float, goodput: float | None, ctx: TermContext
) -> dict[str, float | None]:
    """Days to train and cost with failures (``goodput``) and without, for the job's
    ``train_tokens`` and ``gpu_hour_cost`` (``None`` where not given)."""
    training = ctx.training
    out: dict[str, float | None] = {
        "days_to_train": None,
        "days_to_train_failure_free": None,
        "cost": None,
        "cost_failure_free": None,
    }
    if training.train_tokens is None or tokens_per_s <= 0:
        return out
    free_s = training.train_tokens / tokens_per_s
    wall_s = free_s / goodput if goodput else None
    out["days_to_train_failure_free"] = free_s / SECONDS_PER_DAY
    out["days_to_train"] = wall_s / SECONDS_PER_DAY if wall_s is not None else None
    if training.gpu_hour_cost is not None:
        per_s = training.num_gpus * training.gpu_hour_cost / SECONDS_PER_HOUR
        out["cost_failure_free"] = free_s * per_s
        out["cost"] = wall_s * per_s if wall_s is not None else None
    return out
