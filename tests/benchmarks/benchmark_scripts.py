"""Loading a script of `benchmarks/` in a test: the scripts are files, not an installed package.

`benchmarks/` is on sys.path only while the script is imported, because the scripts import
each other's helpers (`bench_host`, `op_ceiling`, ...); the module is registered under its
name, because dataclasses look their module up in sys.modules.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load_benchmark(name: str) -> ModuleType:
    """`benchmarks/<name>.py`, imported afresh."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCHMARKS))
