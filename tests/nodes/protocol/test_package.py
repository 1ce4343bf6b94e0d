"""The protocol package stands alone: both sides import it, so it needs neither Django nor torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_the_protocol_needs_neither_django_nor_torch() -> None:
    probe = (
        "import pkgutil, importlib, sys, nodes_app.protocol as p; "
        "[importlib.import_module(m.name) "
        " for m in pkgutil.iter_modules(p.__path__, p.__name__ + '.')]; "
        "print(sorted(m for m in ('django', 'torch', 'httpx') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
