"""The architecture holds itself: every import in the product's packages goes down the layers, and
no module is longer than MAX_LINES. `make lint` runs it; a violation is one line each, exit 1.

    python tools/check_architecture.py [ROOT]

The layers, top down (a module may import its own layer's and those below; harness/__init__.py,
PROJECT_ROOT's home, is under all of harness):

    entry      harness/__main__.py, harness/benchmark.py, tools/
    runners    harness/offline/, harness/serving/: neither imports the other
    report     harness/report/: run directories in, tables out; never a runner, nor the core
    core       harness/*.py: checks, engine processes, workloads, scenarios, links, tracking
    records    harness/records/: the rows, the join, summaries, the verdict
    connectors transfer_strategies/: never imports harness

Every import counts, at a module's top or inside a function (a lazy import is still a
dependency), as does `importlib.import_module("...")` of a literal name.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

MAX_LINES = 400
PACKAGES = ("harness", "transfer_strategies", "tools")
LAYERS = {  # layer: those it may import
    "entry": {"entry", "offline", "serving", "report", "core", "records", "connectors", "root"},
    "offline": {"offline", "core", "records", "connectors", "root"},
    "serving": {"serving", "core", "records", "connectors", "root"},
    "report": {"report", "records", "root"},
    "core": {"core", "records", "connectors", "root"},
    "records": {"records", "connectors", "root"},
    "connectors": {"connectors"},
    "root": set(),
}


def layer(module: str) -> str | None:
    """The layer of a module of the project (None: not the project's)."""
    parts = module.split(".")
    if parts[0] == "transfer_strategies":
        return "connectors"
    if parts[0] == "tools":
        return "entry"
    if parts[0] != "harness":
        return None
    if len(parts) == 1:
        return "root"
    if parts[1] in ("__main__", "benchmark"):
        return "entry"
    if parts[1] in ("offline", "serving", "report", "records"):
        return parts[1]
    return "core"


def imports(path: Path, module: str, root: Path) -> list[tuple[int, str]]:
    """(line, module) for every import in the file, relative ones resolved; `from harness import
    records` names the submodule where it is one, else the package."""
    out = []
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            name = ".".join(p for p in (base, node.module) if p)
            out += [(node.lineno, f"{name}.{a.name}" if is_module(root, f"{name}.{a.name}") else name)
                    for a in node.names]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            out.append((node.lineno, node.args[0].value))
    return out


def is_module(root: Path, name: str) -> bool:
    path = Path(root, *name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def violations(root: Path) -> list[str]:
    root = Path(root)
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            module = module_name(root, path)
            rel = path.relative_to(root)
            lines = len(path.read_text().splitlines())
            if lines > MAX_LINES:
                found.append(f"{rel}: {lines} lines, over {MAX_LINES}: split it by what it owns")
            mine = layer(module)
            for lineno, name in imports(path, module, root):
                theirs = layer(name)
                if theirs is None or theirs == mine and mine not in ("offline", "serving"):
                    continue
                if theirs not in LAYERS[mine] and not (mine in ("offline", "serving") and theirs == mine):
                    found.append(f"{rel}:{lineno}: imports {name}: the {mine} layer may not import the {theirs} "
                                 f"layer (tools/check_architecture.py)")
    return found


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    root = Path(argv[0]) if argv else Path(__file__).resolve().parent.parent
    found = violations(root)
    for line in found:
        print(line, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
