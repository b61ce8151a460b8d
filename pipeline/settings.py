"""The one place that names the container image every pipeline step runs in.

Components are KFP *lightweight* Python components whose `base_image` is our image and whose
body imports the installed `ampflow` package (`install_kfp_package=False`): docs/DESIGN.md
("Pipeline") records that this is the form both `kfp.local.SubprocessRunner` and a real KFP
cluster run, whereas a Containerized Python Component (`target_image=`) is refused by the
local runner.
"""

from __future__ import annotations

import os
from collections.abc import Callable

# Override with AMPFLOW_IMAGE or `ampflow compile --image ...` after you build and push the
# Dockerfile at the repository root (see README "Going to a real cluster").
DEFAULT_IMAGE = os.environ.get("AMPFLOW_IMAGE", "ghcr.io/ampflow/ampflow:0.1.0")


def as_component(func: Callable, image: str = DEFAULT_IMAGE):
    """Turn a plain typed function into a KFP component that runs in `image`."""
    from kfp import dsl

    return dsl.component(func, base_image=image, install_kfp_package=False)
