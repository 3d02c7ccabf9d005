"""Callers import api_stub and workers import worker without paying for litellm (≈6 s, ≈200 MB)."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "module", ["api_stub", "worker", "worker.extraction", "worker.keywords", "worker.graph.neo4j_store"]
)
def test_import_does_not_load_litellm(module: str) -> None:
    code = f"import sys, {module}; print('litellm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "False"
