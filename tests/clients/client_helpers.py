"""Shared by the client tests (a uniquely named module: tests/ dirs share sys.path)."""

from __future__ import annotations

import sys
from pathlib import Path

CLIENT_ROOT = Path(__file__).resolve().parents[2] / "clients" / "python"
if str(CLIENT_ROOT / "src") not in sys.path:  # the main venv has it installed; a checkout may not
    sys.path.insert(0, str(CLIENT_ROOT / "src"))
