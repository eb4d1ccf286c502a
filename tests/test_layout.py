"""The tests' own layout: no module under tests/ imports a test module (what several use lives in
tests/helpers), and the helpers' asserts are rewritten by pytest as a test module's are."""

import ast
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.helpers.runs import check_passed

TESTS = Path(__file__).resolve().parent


def imported(source: str, package: str) -> set[str]:
    """Every module that source in `package` imports, at its top or inside a function, relative
    imports resolved; `from tests import test_x` counts as importing tests.test_x."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(p for p in (base, node.module) if p)
            names.add(module)
            names.update(f"{module}.{a.name}" for a in node.names)
    return names


def test_no_test_module_imports_another():
    imports = {}
    for path in sorted(TESTS.rglob("*.py")):
        package = ".".join(path.relative_to(TESTS.parent).parent.parts)
        imports[str(path.relative_to(TESTS.parent))] = sorted(
            m for m in imported(path.read_text(), package) if re.fullmatch(r"tests\.test_\w+(\..*)?", m))
    assert {path: modules for path, modules in imports.items() if modules} == {}, "move what both use to tests/helpers"


def test_a_test_module_is_seen_however_it_is_imported():
    source = ("from tests.test_a import f\nimport tests.test_b as b\n\ndef g():\n    from tests import test_c\n"
              "from .. import test_d\nfrom ..test_e import h\nfrom . import kv\n")
    seen = {m for m in imported(source, "tests.helpers") if re.fullmatch(r"tests\.test_\w+(\..*)?", m)}
    assert seen == {"tests.test_a", "tests.test_a.f", "tests.test_b", "tests.test_c", "tests.test_d", "tests.test_e",
                    "tests.test_e.h"}
    assert "tests.helpers.kv" in imported(source, "tests.helpers")


def test_a_failing_helper_check_shows_the_values_it_compared():
    """tests/conftest.py registers tests.helpers for pytest's assertion rewriting: without it a
    check there would fail with a bare AssertionError."""
    run = SimpleNamespace(code=0, stderr="", summary={"status": "mismatch", "match_rate": 0.5, "requests": 4})
    with pytest.raises(AssertionError, match="'mismatch' == 'ok'"):
        check_passed(run)
