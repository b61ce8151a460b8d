"""The ResNet-50 tests of test_applications_end_to_end.py on MobileNetV2 (see that module).

A file of its own so that `make test`'s xdist workers (--dist loadfile) run the two models'
pipelines at the same time; the tests and fixtures are that module's, only `name` differs.
MobileNetV2's run converts all four TFLite variants and starts from random weights, so the
--weights run's test is ResNet-50's alone (PLANS there).
"""

from __future__ import annotations

import pytest
from test_applications_end_to_end import *  # noqa: F403 (the tests, fixtures and pytestmark)

MODELS = ("mobilenet_v2",)
del test_weights_held_while_frozen_then_every_tensor_fine_tuned  # noqa: F821


@pytest.fixture(params=MODELS)
def name(request) -> str:
    """The keras.applications model the tests of this file run on."""
    return request.param
