"""A consumer's package whose ``__init__`` imports far more than the modules the tests use,
imported without running that ``__init__``: its submodules load from the package's own
directory as usual, and each name the ``__init__`` re-exports (``from .x import y``) is imported
from the module it names when first read, so ``from package import y`` gets the same object.

- ``megatron.training`` (megatron-core 0.19.2's wheel): its ``__init__`` imports ``training.py``
  (the training loop), whose checkpointing imports nvidia-modelopt, which imports transformers
  and diffusers: about 10 of the 19 CPU-seconds ``arguments`` and ``config`` cost with it, for
  modules neither of them imports.
- ``megatron.bridge``, ``megatron.bridge.models``, ``megatron.bridge.recipes`` (Megatron-Bridge
  0.6.2): the ``__init__`` files import every model family's bridge and every recipe;
  ``tests/bridge_probe.py`` imports the recipes it runs and the bridges registered for the
  architectures their ``config.json`` files name (``registering_modules``).

Nothing the ``__init__`` files run besides imports is skipped (``skip_init`` refuses one that
does more), and a package already imported is left as it is.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType


def _exports(name: str, tree: ast.Module) -> dict[str, tuple[str, str]]:
    """The names an ``__init__`` re-exports -> (module, name there)."""
    exports: dict[str, tuple[str, str]] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            relative = "." * node.level + (node.module or "")
            source = importlib.util.resolve_name(relative, name) if node.level else node.module
            for alias in node.names:  # a star import's names are not read (an AttributeError)
                if alias.name != "*":
                    exports[alias.asname or alias.name] = (source, alias.name)
    return exports


def _only_imports(tree: ast.Module) -> bool:
    """Imports, ``__all__`` and docstrings: nothing else runs in the ``__init__``."""
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["__all__"]:
            continue
        return False
    return True


def skip_init(name: str) -> ModuleType:
    """Package ``name`` as imported without running its ``__init__`` (see the module)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.submodule_search_locations, f"{name} is no package"
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    assert _only_imports(tree), f"{spec.origin} runs more than imports"
    exports = _exports(name, tree)
    module = importlib.util.module_from_spec(spec)

    def __getattr__(attr: str):
        if attr not in exports:
            raise AttributeError(f"module {name!r} has no attribute {attr!r}")
        source, original = exports[attr]
        value = getattr(importlib.import_module(source), original)
        setattr(module, attr, value)
        return value

    module.__getattr__ = __getattr__
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)
    return module


def registering_modules(package: str, architectures: set[str]) -> list[str]:
    """The modules under ``package`` (Megatron-Bridge's ``models``) that register a bridge
    (``MegatronModelBridge.register_bridge(source=...)``) for one of ``architectures``."""
    spec = importlib.util.find_spec(package)
    root = Path(spec.submodule_search_locations[0])
    found = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        sources = re.findall(r'\.register_bridge\(\s*source="?(\w+)"?', text)
        if set(sources) & architectures and path.parent.name != "conversion":
            found.append(".".join([package, *path.relative_to(root).with_suffix("").parts]))
    return found
