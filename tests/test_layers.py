"""The core package never depends on its callers: nothing under worker/ imports api_stub/ or tasks/.

(worker/celery_app.py names "tasks.episodes" in Celery's `include` setting, a string Celery imports when a
worker process boots; that is the app's configuration, not a dependency of the worker package's code.)"""

from __future__ import annotations

import ast

from tests.services import ROOT

CALLERS = ("api_stub", "tasks")


def imported(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_nothing_under_worker_imports_its_callers() -> None:
    found = {
        str(path.relative_to(ROOT)): sorted(
            n for n in imported(ast.parse(path.read_text())) if n.split(".")[0] in CALLERS
        )
        for path in (ROOT / "worker").rglob("*.py")
    }
    assert {path: names for path, names in found.items() if names} == {}
    assert imported(ast.parse("from api_stub.client import MemoryClient\nimport tasks.episodes")) == {
        "api_stub.client",
        "tasks.episodes",
    }  # the check sees both forms
