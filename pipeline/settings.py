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

# There is no published image to default to: `ampflow compile/submit` need `--image` (the one
# you built from the Dockerfile and pushed) unless $AMPFLOW_IMAGE names it. LOCAL_IMAGE is the
# tag `docker build -t ampflow:local .` gives, what the local runner's components name (it
# pulls nothing) and the Python API's default; a cluster can run it only where it was loaded
# (`kind load docker-image ampflow:local`).
IMAGE_ENV = "AMPFLOW_IMAGE"
LOCAL_IMAGE = "ampflow:local"


def configured_image() -> str | None:
    """The image $AMPFLOW_IMAGE names, or None (then `--image` is required)."""
    return os.environ.get(IMAGE_ENV) or None


def as_component(func: Callable, image: str = LOCAL_IMAGE):
    """Turn a plain typed function into a KFP component that runs in `image`."""
    from kfp import dsl

    return dsl.component(func, base_image=image, install_kfp_package=False)
