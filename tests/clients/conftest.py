"""The client distribution's tests (clients/python), in the main environment.

The main environment has TensorFlow, so these tests compare the client with it; the tests that
need an environment *without* TensorFlow build one (`client_venv`, test_client_venv.py).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import client_helpers  # noqa: E402, F401 - puts clients/python/src on sys.path if needed
