"""The client distribution's tests: `clients/python/src` importable in the main environment.

The main environment has TensorFlow, so these tests compare the client with it; the tests that
need an environment *without* TensorFlow build one (`client_venv`, test_client_venv.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

CLIENT_ROOT = Path(__file__).resolve().parents[2] / "clients" / "python"
if str(CLIENT_ROOT / "src") not in sys.path:
    sys.path.insert(0, str(CLIENT_ROOT / "src"))
