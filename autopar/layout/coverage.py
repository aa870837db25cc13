"""What a search covered (issue 21: every answer states what its proof covers): the framework
whose layouts the space holds, and each restriction in force beyond what that framework raises
on, autopar's defaults (with the flag that lifts each) and the user's own.

The space holds every combination of the layout axes (TP, PP, VPP, CP, EP, ETP, DP, micro-batch,
recompute none / selective / full, ZeRO stage) that the framework's rules allow
(``Rule.kind == "framework"``, each citing where the framework raises); a rule of kind
``default`` or ``user``, a search cap on an axis (``Axis.cap``), a recompute mode or ZeRO stage
left out, is a restriction and is named here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autopar.base.axes import AXES, RECOMPUTE_MODES, ZERO_STAGES
from autopar.inputs.problem import AXIS_MAXIMA, default_zero
from autopar.inputs.specs import Problem
from autopar.layout.space import Space

FRAMEWORK_NAMES: dict[str, str] = {
    "megatron": "Megatron-LM",
    "torchtitan": "torchtitan",
    "deepspeed": "DeepSpeed",
}
AXES_TEXT = "TP, PP, VPP, CP, EP, ETP, DP, micro-batch, recompute and ZeRO"


@dataclass(frozen=True, slots=True, kw_only=True)
class Restriction:
    """One limit on the space beyond the framework's own rules."""

    text: str
    kind: str
    """``default`` (autopar's) or ``user``."""
    lift: str | None = None
    """The autopar flag that lifts it, as typed (``--no-tp-within-node``); ``None``: none."""

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "kind": self.kind, "lift": self.lift}

    def line(self) -> str:
        return f"{self.text} ({self.lift})" if self.lift else self.text


@dataclass(frozen=True, slots=True, kw_only=True)
class Coverage:
    """The framework whose layouts the space holds and the restrictions in force."""

    framework: str
    restrictions: tuple[Restriction, ...] = ()

    def text(self, layouts: int | None = None) -> str:
        """``all 890,334 layouts Megatron-LM accepts (TP, PP, ...), within: ...``."""
        name = FRAMEWORK_NAMES.get(self.framework, self.framework)
        if layouts == 0:
            head = f"every layout {name} accepts ({AXES_TEXT}): none for this problem"
        else:
            count = f"all {layouts:,} layouts" if layouts is not None else "every layout"
            head = f"{count} {name} accepts ({AXES_TEXT})"
        if not self.restrictions:
            return head
        return head + ", within: " + "; ".join(r.line() for r in self.restrictions)

    def to_dict(self) -> dict[str, Any]:
        return {
            "framework": self.framework,
            "restrictions": [r.to_dict() for r in self.restrictions],
        }


def coverage(problem: Problem, space: Space) -> Coverage:
    """The coverage of ``space`` (module docstring)."""
    out: list[Restriction] = []
    for rule in space.all_rules:
        if rule.kind != "framework":
            out.append(Restriction(text=rule.brief or rule.text, kind=rule.kind, lift=rule.lift))
    out += _caps(problem, space)
    out += _modes(problem)
    unique = {r.text: r for r in out}
    return Coverage(framework=problem.options.framework, restrictions=tuple(unique.values()))


def _caps(problem: Problem, space: Space) -> list[Restriction]:
    """An axis searched up to its default cap where its values go on (``Axis.cap``)."""
    limited = dict(problem.options.maxima)
    out = []
    for axis in AXES:
        if axis.cap is None or axis.name in limited:
            continue
        if any(v > axis.cap for v in axis.domain(problem)):
            flag = f"--max-{axis.name.replace('_', '-')}"
            out.append(
                Restriction(
                    text=f"{axis.name} <= {axis.cap}",
                    kind="default",
                    lift=f"{flag} N" if axis.cap < AXIS_MAXIMA.get(axis.name, 1 << 20) else None,
                )
            )
    return out


def _modes(problem: Problem) -> list[Restriction]:
    options = problem.options
    out = []
    if set(options.recompute) != set(RECOMPUTE_MODES):
        modes = ",".join(options.recompute)
        out.append(Restriction(text=f"recompute {modes}", kind="user", lift="--recompute any"))
    if set(options.zero_stages) != set(ZERO_STAGES):
        stages = ",".join(map(str, options.zero_stages))
        default = tuple(sorted(options.zero_stages)) == default_zero(options.framework)
        out.append(
            Restriction(
                text=f"ZeRO {stages}",
                kind="default" if default else "user",
                lift="--zero any",
            )
        )
    return out
