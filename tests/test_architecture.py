"""The shape of the code (issue 10): one-way imports, the cost-model seam, axes declared once."""

from __future__ import annotations

import ast
import dataclasses
import functools
import json
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest

import autopar
from autopar.base.axes import AXES, GRID_AXES, SEARCH_AXES
from autopar.base.errors import InputError
from autopar.cli import app
from autopar.costs.plugin import cost_model_names, load_cost_model
from autopar.costs.terms import CostModel
from autopar.layout.plan import Layout
from autopar.layout.results import flat_row
from autopar.outputs.report import estimate_text, runners_up_text

REPO = Path(__file__).resolve().parents[1]


@functools.cache
def _parsed(path: Path) -> ast.Module:
    """The file's syntax tree, parsed once per test process: seven tests walk every module
    (none changes a tree)."""
    return ast.parse(path.read_text())


def _runtime_nodes(tree: ast.AST):
    """Every node, less the bodies of ``if TYPE_CHECKING:`` (imports for annotations only)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            continue
        yield node
        yield from _runtime_nodes(node)


@functools.cache
def _imports(package: str) -> types.MappingProxyType[str, frozenset[str]]:
    """Module -> the ``autopar`` / ``cost_models`` modules it imports at run time (any depth in
    the file, functions included). Walked once per test process (three tests read the core's;
    each walk is about 0.1 CPU-s), hence read-only."""
    out: dict[str, frozenset[str]] = {}
    for path in sorted((REPO / package).rglob("*.py")):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        names: set[str] = set()
        for node in _runtime_nodes(_parsed(path)):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
                names |= {f"{node.module}.{alias.name}" for alias in node.names}
            elif isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
        out[module] = frozenset(n for n in names if n.split(".")[0] in ("autopar", "cost_models"))
    return types.MappingProxyType(out)


def test_the_core_never_imports_the_cost_models() -> None:
    offenders = {
        module: sorted(n for n in names if n.startswith("cost_models"))
        for module, names in _imports("autopar").items()
    }
    assert {m: n for m, n in offenders.items() if n} == {}


FLOORS: tuple[tuple[str, ...], ...] = (
    ("base",),
    ("inputs",),
    ("layout",),
    ("costs",),
    ("search", "outputs", "calibration"),
    ("pipeline",),
    ("api",),
    ("sweeps",),
    ("cli",),
)
"""The floors of ``autopar`` from the ground up (``docs/DESIGN.md``, "Floors"): a sub-package
imports only floors below its own, and never a neighbour on its own floor."""
FLOOR = {package: level for level, floor in enumerate(FLOORS, 1) for package in floor}
COST_MODELS_MAY_IMPORT = ("base", "inputs", "layout", "costs")


def _floor(module: str) -> int:
    """The floor of an ``autopar`` module (``autopar`` itself and ``__main__`` stand on top)."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] == "__main__":
        return len(FLOORS) + 1
    assert parts[1] in FLOOR, f"{module} stands on no floor: add its package to FLOORS"
    return FLOOR[parts[1]]


def test_every_import_runs_down_the_floors() -> None:
    """No import upwards and none sideways (``autopar.search`` never imports
    ``autopar.outputs``): each floor is understood from the floors below it."""
    wrong = []
    for module, names in _imports("autopar").items():
        here = _floor(module)
        for name in names:
            if not name.startswith("autopar.") or name.split(".")[1] == module.split(".")[1]:
                continue
            if name.split(".")[1] not in FLOOR and name.split(".")[1] != "__main__":
                continue  # a name imported from the package face (``from autopar import x``)
            there = _floor(name)
            if there >= here:
                wrong.append(f"{module} (floor {here}) imports {name} (floor {there})")
    assert wrong == []


def test_the_cost_models_import_only_the_floors_they_build_on() -> None:
    wrong = [
        f"{module} imports {name}"
        for module, names in _imports("cost_models").items()
        for name in names
        if name.startswith("autopar.") and name.split(".")[1] not in COST_MODELS_MAY_IMPORT
    ]
    assert wrong == []


GETATTR_ALLOWED: dict[tuple[str, str], str] = {
    ("autopar/costs/plugin.py", "__module__"): "checks a user's plug-in object",
    ("autopar/costs/terms.py", "name"): "reports a plug-in term that lacks the protocol",
    ("autopar/costs/terms.py", "depends_on"): "reports a plug-in term that lacks the protocol",
    ("autopar/costs/comm.py", "provenance"): "an optional method of the floor's own protocol",
    ("autopar/base/startup.py", "orig_argv"): "sys, Python < 3.10 has none",
    ("autopar/inputs/safe_yaml.py", "CSafeLoader"): "PyYAML built without libyaml",
    ("autopar/inputs/safe_yaml.py", "strerror"): "an OSError's message",
    ("autopar/inputs/safe_yaml.py", "problem_mark"): "a PyYAML error's position",
    ("autopar/inputs/safe_yaml.py", "problem"): "a PyYAML error's text",
}
"""``getattr(obj, "literal")``: duck typing on autopar's own types is not allowed (import the
type, or give it the field); these read objects from outside autopar, each for its reason."""


def test_no_duck_typing_of_autopar_types() -> None:
    found = set()
    for path in sorted((REPO / "autopar").rglob("*.py")):
        for node in ast.walk(_parsed(path)):
            call = isinstance(node, ast.Call) and getattr(node.func, "id", "") == "getattr"
            if call and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
                found.add((str(path.relative_to(REPO)), node.args[1].value))
    assert found - set(GETATTR_ALLOWED) == set()


def test_importing_one_floor_loads_neither_ortools_nor_pandas() -> None:
    """``import autopar.base.axes`` or one cost term is cheap: the package face is lazy
    (PEP 562) and only the search floor imports OR-Tools."""
    code = (
        "import sys, autopar.base.axes, autopar.costs.terms, cost_models.memory, autopar;"
        "print(sorted(m for m in ('ortools', 'pandas', 'typer') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    assert callable(autopar.solve) and autopar.Layout is Layout


def test_a_solve_that_scoring_answers_loads_neither_ortools_nor_pandas() -> None:
    """Issue 19, imports cost what they use: the default text answer of a uniform solve is
    scored in numpy (``autopar.costs.score``), so the command line never loads OR-Tools (nor
    pandas, which OR-Tools loads), the launcher emitters' dependencies or the other commands;
    CP-SAT's proof is imported when it runs (``autopar.search.prove``)."""
    code = textwrap.dedent(
        """
        import contextlib, io, sys
        from autopar.cli import main
        sys.argv = ["autopar", "solve", "--model", "llama-8b", "--gpus", "8"]
        out = io.StringIO()
        with contextlib.suppress(SystemExit), contextlib.redirect_stdout(out):
            main()
        modules = ("ortools", "pandas", "autopar.search.prove", "autopar.cli.sweep_cmd",
                   "autopar.cli.calibrate", "autopar.calibration")
        print(sorted(m for m in modules if m in sys.modules), "why this layout" in out.getvalue())
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["[]", "True"]


def _command_names(app) -> list[str]:
    import typer.main

    return list(typer.main.get_command(app).commands)


def test_each_command_alone_is_the_command_of_the_whole_app(runner) -> None:
    """``autopar CMD`` builds the app with CMD's module alone (``autopar.cli.COMMAND_MODULES``):
    the map names every command, in the order of ``autopar --help``, and a command alone has
    the same options and help as in the whole app."""
    from autopar.cli import COMMAND_MODULES, build_app

    assert _command_names(app) == list(COMMAND_MODULES)
    for command, module in COMMAND_MODULES.items():
        alone = _command_names(build_app(command))
        assert command in alone
        assert {COMMAND_MODULES[c] for c in alone} == {module}
    for command in ("solve", "bench"):
        whole = runner.invoke(app, [command, "--help"], terminal_width=200).output
        assert (
            runner.invoke(build_app(command), [command, "--help"], terminal_width=200).output
            == whole
        )


MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
OVER_THE_LIMIT_PENDING: dict[str, str] = {}
"""Modules over ``MAX_MODULE_LINES`` whose split is in flight elsewhere; each must still be
over it (a fixed one leaves this list)."""


def _function_lines(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines of a function's body: its parameter list is not counted (a typer command's option
    table is data), nor the functions and classes defined inside it, counted on their own."""
    lines = set(range(function.body[0].lineno, function.end_lineno + 1))
    for node in ast.walk(function):
        nested = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        if nested and node is not function:
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            lines -= set(range(first, node.end_lineno + 1))
    return len(lines)


def test_no_module_over_600_lines_and_no_function_over_80() -> None:
    """The developers' guide (issue 19): small modules with one job, functions that fit on a
    screen: the package and the default cost model."""
    long_modules, long_functions = {}, {}
    paths = [*(REPO / "autopar").rglob("*.py"), *(REPO / "cost_models").rglob("*.py")]
    for path in sorted(paths):
        name, text = str(path.relative_to(REPO)), path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            long_modules[name] = len(text.splitlines())
        for node in ast.walk(_parsed(path)):
            is_function = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            if is_function and _function_lines(node) > MAX_FUNCTION_LINES:
                long_functions[f"{name}:{node.lineno} {node.name}"] = _function_lines(node)
    assert long_functions == {}
    assert set(long_modules) == set(OVER_THE_LIMIT_PENDING), long_modules


def test_function_lines_leave_out_the_parameters_and_nested_functions() -> None:
    source = '''
def register(app):
    @app.command()
    def solve(
        a: int = 1,
        b: int = 2,
    ) -> None:
        """Doc."""
        x = a
        return x
    return app
'''
    register = ast.parse(source).body[0]
    solve = register.body[0]
    assert _function_lines(register) == 1 and _function_lines(solve) == 3


def test_the_core_import_graph_has_no_circle() -> None:
    graph = _imports("autopar")
    modules = set(graph)
    edges = {m: {n for n in names if n in modules and n != m} for m, names in graph.items()}
    # the package __init__ files re-export; a circle through them is not a design circle
    edges = {m: {n for n in ns if n not in ("autopar", "autopar.cli")} for m, ns in edges.items()}
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in edges.get(node, ()):
            if state.get(nxt) == 1:
                raise AssertionError(" -> ".join([*path, node, nxt]))
            if nxt not in state:
                visit(nxt, [*path, node])
        state[node] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [])


def test_layout_fields_grid_and_schema_follow_the_axes_table() -> None:
    attrs = [axis.layout_attr for axis in AXES]
    assert [f.name for f in dataclasses.fields(Layout)] == attrs
    layout = Layout(tp=2, pp=4, dp=8, vpp=3, recompute="full", zero=1, sequence_parallel=True)
    assert list(layout.grid_row()) == list(GRID_AXES)
    assert Layout.from_grid_row(layout.grid_row()) == layout
    assert "VPP=3" in layout.text() and "ZeRO-1" in layout.text() and "EP" not in layout.text()
    assert {"tp", "pp", "dp", "cp", "ep", "etp", "vpp", "mbs", "grad_accum"} == set(SEARCH_AXES)


def test_every_axis_has_cli_options_and_a_schema_entry(runner) -> None:
    solve_help = runner.invoke(app, ["solve", "--help"], terminal_width=200).output
    evaluate_help = runner.invoke(app, ["evaluate", "--help"], terminal_width=200).output
    for name in SEARCH_AXES:
        flag = "--" + name.replace("_", "-")
        assert flag in solve_help and f"--max-{name.replace('_', '-')}" in solve_help
    for flag in ("--tp", "--pp", "--cp", "--ep", "--etp", "--vpp", "--mbs", "--recompute"):
        assert flag in evaluate_help
    schema = json.loads(runner.invoke(app, ["schema", "evaluate"]).stdout)
    assert schema["properties"]["layout"]["required"] == [axis.layout_attr for axis in AXES]


def test_runners_up_table_shows_axes_that_vary() -> None:
    result = autopar.solve(
        model="mixtral-8x7b", gpus=64, seq_len=4096, global_batch=256, top=6, tp=4, ep=2
    )
    header = runners_up_text(result.layouts).splitlines()[0].split()
    assert {"EP", "SP", "VPP", "recompute", "ZeRO"} <= set(header)


@pytest.mark.parametrize("top", [3, 5, 10, 20])
def test_top_n_returns_n_layouts_when_n_exist(top: int) -> None:
    result = autopar.solve(model="llama-8b", gpus=64, seq_len=4096, global_batch=256, top=top)
    assert result.status == "optimal" and len(result.layouts) == top
    times = [e.step_time_s for e in result.layouts]
    assert times == sorted(times)
    assert len({e.layout for e in result.layouts}) == top


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _CheckpointStall:
    """A constant per-step time in a category the default model does not have."""

    name: str = "checkpoint_stall_s"
    category: str = "checkpoint"
    depends_on: tuple[str, ...] = ()
    seconds: float = 0.25

    def evaluate(self, grid, ctx) -> np.ndarray:
        return np.asarray(self.seconds)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Scratch:
    """Per-GPU bytes in a new memory category, scaled by TP (declared)."""

    name: str = "scratch_bytes"
    category: str = "scratch"
    depends_on: tuple[str, ...] = ("tp",)

    def evaluate(self, grid, ctx) -> np.ndarray:
        return 2.0 * 2**30 / np.asarray(grid["tp"], dtype=np.float64)


def test_a_new_category_is_a_row_of_every_breakdown() -> None:
    base = load_cost_model(None)
    model = dataclasses.replace(
        base,
        name="with-extras",
        step_terms=(*base.step_terms, _CheckpointStall()),
        static_memory_terms=(*base.static_memory_terms, _Scratch()),
    )
    estimate = autopar.evaluate(
        model="llama-8b", gpus=8, seq_len=4096, global_batch=64, tp=2, cost_model=model
    )
    assert estimate.time_s["checkpoint"] == pytest.approx(0.25)
    assert estimate.memory_bytes["scratch"] == pytest.approx(2**30)
    parts = sum(v for k, v in estimate.memory_bytes.items() if k != "total")
    assert parts == pytest.approx(estimate.memory_bytes["total"])
    assert sum(estimate.time_s.values()) == pytest.approx(estimate.step_time_s)
    text = estimate_text(estimate)
    assert "checkpoint" in text and "scratch" in text
    row = flat_row(estimate)
    assert "time_checkpoint_s" in row and "memory_scratch_gib" in row


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _ReadsUndeclared:
    name: str = "sneaky_s"
    category: str = "compute"
    depends_on: tuple[str, ...] = ("tp",)

    def evaluate(self, grid, ctx) -> np.ndarray:
        return np.asarray(grid["tp"], dtype=np.float64) * np.asarray(grid["pp"])


def test_cost_model_rejects_unknown_and_undeclared_axes() -> None:
    base = load_cost_model(None)
    with pytest.raises(InputError, match="did you mean 'tp'"):
        typo = dataclasses.replace(_Scratch(), depends_on=("tpp",))
        dataclasses.replace(base, step_terms=(typo,))
    with pytest.raises(InputError, match="reads grid axis 'pp'"):
        dataclasses.replace(base, step_terms=(*base.step_terms, _ReadsUndeclared()))
    assert isinstance(dataclasses.replace(base, step_terms=base.step_terms), CostModel)


def test_cost_models_are_found_by_name_and_bad_names_are_input_errors() -> None:
    assert {"default", "megatron-compatible"} <= set(cost_model_names())
    assert load_cost_model("megatron-compatible").name == "megatron-compatible"
    for bad in ("nonexistent", ":", "json:loads", "no_such_module:x", "autopar.base.axes:nothing"):
        with pytest.raises(InputError):
            load_cost_model(bad)


BASE_DEPENDENCIES = {"numpy", "pandas", "ortools", "typer", "yaml", "rich"}
"""What ``pip install -e .`` brings (pyproject ``dependencies``); everything else (torch,
plotly, dask, ...) is an extra and may only be imported inside the function that needs it."""


def test_module_level_imports_need_only_the_base_dependencies() -> None:
    """The README's main command installs the base dependencies alone: a module-level import
    of anything else (click came in only through dev extras) breaks ``autopar`` there."""
    import sys

    stdlib = set(sys.stdlib_module_names)
    offenders = []
    for package in ("autopar", "cost_models"):
        for path in sorted((REPO / package).rglob("*.py")):
            tree = _parsed(path)
            for node in tree.body:  # module level only; function-level imports are lazy
                names = []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module]
                for name in names:
                    top = name.split(".")[0]
                    if top not in stdlib | BASE_DEPENDENCIES | {"autopar", "cost_models"}:
                        offenders.append(f"{path.relative_to(REPO)}: {name}")
    assert offenders == []


# CLI-only options: how the answer is written, not what is asked
RENDER_OPTIONS = {"format", "output", "progress", "emit_fallback"}


@pytest.mark.parametrize("command", ["solve", "evaluate", "sweep"])
def test_every_cli_option_is_an_api_keyword_of_the_same_name(command: str) -> None:
    """Issue 21: one vocabulary. Each option of the command is a keyword its API function
    takes under the same name (``--max-mbs`` is ``max_mbs=``, ``--no-context-parallel`` is
    ``context_parallel=False``)."""
    import inspect

    import typer

    from autopar import api
    from autopar.base.axes import GIVEN_AXES
    from autopar.inputs.problem import KEYWORDS
    from autopar.sweeps.run import sweep

    click = typer.main.get_command(app).commands[command]
    function = {"solve": api.solve, "evaluate": api.evaluate, "sweep": sweep}[command]
    own = set(inspect.signature(function).parameters)
    if command == "evaluate":  # --time-limit bounds the optimum it is measured against
        own |= set(inspect.signature(api.optimum_of).parameters) - {"problem", "estimate"}
    if command == "solve":  # --fallback-nodes and its options are autopar.fallbacks' keywords
        from autopar.sweeps.fallbacks import FALLBACK_KEYWORDS, fallbacks

        own |= set(FALLBACK_KEYWORDS) | set(inspect.signature(fallbacks).parameters)
    solve_only = set(api.SOLVE_KEYWORDS) if command == "sweep" else set()
    layout = {axis.layout_attr for axis in GIVEN_AXES} if command == "evaluate" else set()
    accepted = own | set(KEYWORDS) | solve_only | layout
    missing = [p.name for p in click.params if p.name not in accepted | RENDER_OPTIONS]
    assert missing == []


def test_an_unknown_keyword_gets_a_did_you_mean() -> None:
    with pytest.raises(TypeError, match=r"tme_limit \(did you mean time_limit\?\)"):
        autopar.solve(model="llama-8b", gpus=8, tme_limit=5)
    with pytest.raises(TypeError, match=r"max_mb \(did you mean max_mbs\?\)"):
        autopar.solve(model="llama-8b", gpus=8, max_mb=4)
    with pytest.raises(TypeError, match=r"stage_layer \(did you mean stage_layers\?\)"):
        autopar.evaluate(model="llama-8b", gpus=8, stage_layer="4,4")
    assert autopar.solve(model="llama-8b", gpus=8, max_mbs=2).best.layout.mbs <= 2
