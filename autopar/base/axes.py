"""The layout axes, declared once.

Every layout dimension is one ``Axis`` in ``AXES``: its grid name, the ``Layout`` attribute and
its type, the domain a problem gives it, whether a product rule derives it, the column title, the
tie-break preference, the CLI options and the JSON schema entry. ``Layout``, the grid, the CP-SAT
variables, the pins and limits, the CLI options, the reports, the sweep rows and the JSON schema
are all derived from this table; adding a parallel dimension touches the table, its rules
(``autopar/layout/rules.py``) and its cost terms, nothing else.

Glossary (names as torchtitan's mesh axes; flags as Megatron-LM's ``arguments.py``):

- ``tp``: tensor-parallel size (``--tensor-model-parallel-size``).
- ``pp``: pipeline-parallel size (number of pipeline ranks).
- ``dp``: data-parallel size of the dense layers: ``num_gpus = tp * pp * cp * dp``.
- ``cp``: context-parallel size (the sequence split over ranks, ring attention).
- ``ep``: expert-parallel size, carved out of ``dp * cp`` for the expert layers (Megatron
  ``parallel_state.py``); ``etp``: tensor-parallel size inside the expert layers.
- ``vpp``: virtual pipeline stages (model chunks) per pipeline rank; 1 = plain 1F1B.
- ``schedule``: the pipeline schedule (``Layout.pipeline_schedule``, ``PIPELINE_SCHEDULES``):
  ``1f1b`` is 1F1B, interleaved when ``vpp > 1`` (Megatron, torchtitan ``1F1B`` /
  ``Interleaved1F1B``, DeepSpeed); ``combined-1f1b`` Megatron's 1F1B with the MoE all-to-all of
  one micro-batch hidden behind another's compute (``--overlap-moe-expert-parallel-comm``);
  ``zb-h1``, ``zb-v``, ``dualpipe-v``, ``gpipe``, ``looped-bfs`` torchtitan's
  ``InterleavedZeroBubble``, ``ZBVZeroBubble``, ``DualPipeV``, ``GPipe``, ``LoopedBFS``.
- ``mbs``: micro-batch size in sequences.
- ``grad_accum``: micro-batches per optimizer step on each DP rank
  (``global_batch = mbs * dp * grad_accum``).
- ``recompute``: activation recomputation: ``none``, ``selective`` (attention core), ``full``.
- ``zero``: optimizer sharding over the DP·CP group: 0 none, 1 optimizer states (Megatron
  distributed optimizer), 2 also gradients, 3 also parameters (FSDP).
- ``sp``: sequence parallelism in the TP region (``Layout.sequence_parallel``).

Rank order is Megatron's default ``tp-cp-ep-dp-pp`` (TP fastest, PP slowest).

On a grid every axis is an integer column: a mode axis stores the index of its value in
``choices`` (``recompute``: 0 none, 1 selective, 2 full), a flag axis 0 or 1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

RECOMPUTE_MODES: tuple[str, ...] = ("none", "selective", "full")
ZERO_STAGES: tuple[int, ...] = (0, 1, 2, 3)
PIPELINE_SCHEDULES: tuple[str, ...] = (
    "1f1b",
    "combined-1f1b",
    "zb-h1",
    "zb-v",
    "dualpipe-v",
    "gpipe",
    "looped-bfs",
)
"""The pipeline schedules a framework autopar emits for ships, in tie-break order (the axis
glossary above; which framework offers which: ``autopar.inputs.frameworks.FRAMEWORK_SCHEDULES``)."""

Kind = Literal["size", "mode", "flag"]


class Problem(Protocol):
    """What an axis domain reads of a problem: ``autopar.inputs.specs.Problem`` is one. The
    ground floor names the four parts only; the domains below read their documented fields
    (``training.num_gpus``, ``model.num_layers`` ...)."""

    @property
    def model(self) -> Any: ...

    @property
    def cluster(self) -> Any: ...

    @property
    def training(self) -> Any: ...

    @property
    def options(self) -> Any: ...


VPP_CAP = 64
"""Largest virtual-stage count searched without ``--max-vpp`` (the largest ``--vpp`` autopar takes:
``autopar.inputs.limits.MAX_VPP``)."""


def divisors(n: int) -> tuple[int, ...]:
    """The divisors of ``n``, ascending."""
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return tuple(sorted({*small, *(n // d for d in small)}))


@dataclass(frozen=True, slots=True, kw_only=True)
class Axis:
    """One layout dimension (module docstring)."""

    name: str
    """Grid column and pin/limit key (``tp``)."""
    title: str
    """Column title in tables (``TP``)."""
    description: str
    """One line for ``--help``, tables and the JSON schema."""
    kind: Kind = "size"
    """``size``: a positive integer; ``mode``: one of ``choices``; ``flag``: a boolean."""
    attr: str = ""
    """``Layout`` attribute; the grid name when empty."""
    choices: tuple[Any, ...] = ()
    """The values of a ``mode`` axis; the grid holds their index."""
    default: Any = None
    """``Layout`` default; ``None`` = required."""
    evaluate_default: Any = None
    """``evaluate``'s default where it differs from ``default``."""
    domain: Callable[[Problem], tuple[int, ...]]
    """The grid values a problem allows before any rule (``values`` applies the upper bound)."""
    cap: int | None = None
    """Largest value searched when the user gives no ``--max-<name>`` (mbs 16)."""
    derived_from: tuple[str, ...] = ()
    """Axes that fix this one through a product rule (``dp`` from ``tp, pp, cp``)."""
    prefer: int = 1
    """Tie-break among layouts of equal step time: +1 smaller first, -1 larger first."""
    searchable: bool = True
    """``solve`` takes ``--<name>`` (pin) and ``--max-<name>`` (limit) for it."""
    given: bool = True
    """``evaluate`` takes a value for it (``--tp 8``, ``--recompute full``); false for ``sp``,
    which follows TP and ``--sequence-parallel/--no-sequence-parallel``."""
    show: Literal["always", "changed"] = "always"
    """When the short layout text shows it: always, or only when it differs from ``default``."""
    label: str = "{title}={value}"
    """How the short layout text writes it (``ZeRO-{value}``)."""

    @property
    def layout_attr(self) -> str:
        return self.attr or self.name

    @property
    def default_for_evaluate(self) -> Any:
        return self.default if self.evaluate_default is None else self.evaluate_default

    def values(self, problem: Problem) -> tuple[int, ...]:
        """The domain of this axis in ``problem``; a capped axis stops at its cap, or at the
        user's limit in its place (other limits are rules, so that explanations name them)."""
        values = self.domain(problem)
        if self.cap is None:
            return values
        bound = dict(problem.options.maxima).get(self.name, self.cap)
        return tuple(v for v in values if v <= bound)

    def encode(self, value: Any) -> int:
        """A ``Layout`` value as its grid integer."""
        if self.kind == "mode":
            return self.choices.index(value)
        return int(value)

    def decode(self, code: int) -> Any:
        """A grid integer as the ``Layout`` value."""
        if self.kind == "mode":
            return self.choices[int(code)]
        if self.kind == "flag":
            return bool(code)
        return int(code)

    def text(self, value: Any) -> str:
        """``value`` as the short layout text writes it (``TP=8``, ``ZeRO-1``, ``SP=on``)."""
        shown = ("on" if value else "off") if self.kind == "flag" else value
        return self.label.format(title=self.title, value=shown)

    def json_schema(self) -> dict[str, Any]:
        if self.kind == "mode":
            return {"enum": list(self.choices), "description": self.description}
        if self.kind == "flag":
            return {"type": "boolean", "description": self.description}
        return {"type": "integer", "minimum": 1, "description": self.description}


def _gpu_divisors(p: Problem) -> tuple[int, ...]:
    return divisors(p.training.num_gpus)


def _pp_domain(p: Problem) -> tuple[int, ...]:
    """Every divisor of the GPU count; the rule ``pp <= num_layers`` (``autopar.layout.rules``)
    prunes the rest, so that an explanation can name it."""
    return divisors(p.training.num_gpus)


def _ep_domain(p: Problem) -> tuple[int, ...]:
    if not p.model.is_moe:
        return (1,)
    return tuple(d for d in divisors(p.model.num_experts) if p.training.num_gpus % d == 0)


def _etp_domain(p: Problem) -> tuple[int, ...]:
    if not p.model.is_moe:
        return (1,)
    node = p.cluster.gpus_per_node
    return tuple(d for d in divisors(p.training.num_gpus) if d <= node)


def _vpp_domain(p: Problem) -> tuple[int, ...]:
    """Every virtual-stage count some pipeline size can fill with layers: at most
    ``floor(L/2) + 1`` (two stages, the embedding and the loss alone in an end chunk;
    ``autopar.layout.split.max_chunks``), which the split rule pairs with each ``pp``; searched up
    to ``VPP_CAP`` unless ``--max-vpp`` says otherwise (Nemotron-4 340B ran VP 12 at PP 8)."""
    return tuple(range(1, p.model.num_layers // 2 + 2))


def _recompute_domain(p: Problem) -> tuple[int, ...]:
    return tuple(sorted(RECOMPUTE_MODES.index(m) for m in p.options.recompute))


def _schedule_domain(p: Problem) -> tuple[int, ...]:
    return tuple(sorted(PIPELINE_SCHEDULES.index(s) for s in p.options.pipeline_schedules))


AXES: tuple[Axis, ...] = (
    Axis(
        name="tp",
        title="TP",
        description="Tensor-parallel size (Megatron --tensor-model-parallel-size).",
        evaluate_default=1,
        domain=_gpu_divisors,
    ),
    Axis(
        name="pp",
        title="PP",
        description="Pipeline-parallel size (pipeline ranks).",
        evaluate_default=1,
        domain=_pp_domain,
    ),
    Axis(
        name="dp",
        title="DP",
        description="Data-parallel size of the dense layers: num_gpus = tp*pp*cp*dp.",
        domain=_gpu_divisors,
        derived_from=("tp", "pp", "cp"),
    ),
    Axis(
        name="cp",
        title="CP",
        description="Context-parallel size (sequence split over ranks).",
        default=1,
        domain=_gpu_divisors,
    ),
    Axis(
        name="ep",
        title="EP",
        description="Expert-parallel size, carved out of dp*cp for the expert layers.",
        default=1,
        domain=_ep_domain,
        show="changed",
    ),
    Axis(
        name="etp",
        title="ETP",
        description="Tensor-parallel size inside the expert layers.",
        default=1,
        domain=_etp_domain,
        show="changed",
    ),
    Axis(
        name="vpp",
        title="VPP",
        description="Virtual pipeline stages (model chunks) per pipeline rank; 1 = plain 1F1B.",
        default=1,
        domain=_vpp_domain,
        cap=VPP_CAP,
        show="changed",
    ),
    Axis(
        name="schedule",
        title="schedule",
        attr="pipeline_schedule",
        label="schedule={value}",
        description="Pipeline schedule: 1f1b (interleaved with vpp > 1), combined-1f1b, zb-h1, "
        "zb-v, dualpipe-v, gpipe or looped-bfs.",
        kind="mode",
        choices=PIPELINE_SCHEDULES,
        default="1f1b",
        domain=_schedule_domain,
        searchable=False,
        show="changed",
    ),
    Axis(
        name="mbs",
        title="mbs",
        label="mbs={value}",
        description="Micro-batch size in sequences.",
        default=1,
        domain=lambda p: divisors(p.training.global_batch_sequences),
        cap=16,
        prefer=-1,
    ),
    Axis(
        name="grad_accum",
        title="GA",
        description="Micro-batches per step on each DP rank: global_batch = mbs*dp*grad_accum.",
        default=1,
        domain=lambda p: divisors(p.training.global_batch_sequences),
        derived_from=("mbs", "dp"),
        label="grad_accum={value}",
    ),
    Axis(
        name="recompute",
        title="recompute",
        description="Activation recomputation: none, selective (attention core) or full.",
        label="recompute={value}",
        kind="mode",
        choices=RECOMPUTE_MODES,
        default="none",
        domain=_recompute_domain,
        searchable=False,
    ),
    Axis(
        name="zero",
        title="ZeRO",
        description="Optimizer sharding: 0 none, 1 optimizer states, 2 +gradients, 3 +parameters.",
        kind="mode",
        choices=ZERO_STAGES,
        default=0,
        evaluate_default=1,
        label="ZeRO-{value}",
        domain=lambda p: tuple(sorted(p.options.zero_stages)),
        searchable=False,
    ),
    Axis(
        name="sp",
        title="SP",
        description="Sequence parallelism in the tensor-parallel region.",
        kind="flag",
        attr="sequence_parallel",
        default=False,
        domain=lambda p: (0, 1),
        searchable=False,
        given=False,
    ),
)

AXIS: dict[str, Axis] = {axis.name: axis for axis in AXES}
GRID_AXES: tuple[str, ...] = tuple(axis.name for axis in AXES)
"""The columns of a cost-term grid, in table order."""
SEARCH_AXES: tuple[str, ...] = tuple(axis.name for axis in AXES if axis.searchable)
"""The axes ``solve`` can pin (``--tp 8``) or limit (``--max-tp 8``)."""
FREE_AXES: tuple[str, ...] = tuple(axis.name for axis in AXES if not axis.derived_from)
"""The axes that no product rule fixes: the ones a layout is chosen by."""
GIVEN_AXES: tuple[Axis, ...] = tuple(a for a in AXES if a.name in FREE_AXES and a.given)
"""The axes ``evaluate`` takes values for (``dp``, ``grad_accum`` and ``sp`` follow)."""
PRODUCTS: dict[str, tuple[str, ...]] = {
    axis.name: (*axis.derived_from, axis.name) for axis in AXES if axis.derived_from
}
"""Each product rule by the axis it derives: ``dp`` -> ``tp*pp*cp*dp`` (= the GPU count),
``grad_accum`` -> ``mbs*dp*grad_accum`` (= the global batch); ``autopar.layout.space`` pairs
them with their totals."""


def tie_key(row: dict[str, int]) -> tuple[int, ...]:
    """The documented secondary order among layouts of equal predicted step time: the free axes
    in table order, each by its preference (smaller tp, pp, cp, ep, etp, vpp first; the
    schedule in ``PIPELINE_SCHEDULES`` order; larger micro-batch; less recompute; lower ZeRO
    stage), then the derived ones."""
    ordered = (*FREE_AXES, *(a for a in GRID_AXES if a not in FREE_AXES))
    return tuple(AXIS[a].prefer * int(row[a]) for a in ordered)
