"""The serving side: TF Serving's and KServe V2's gRPC and REST APIs over SavedModels and TFLite.

One data plane, thin protocol adapters (the shape of KServe's model server). By floor, each
importing only its own or those below (tests/test_architecture.py): the base (`model_format`,
what a served model is, shared with export and deploy; `config`; `status`, TF Serving's codes;
`compute_precision`); `models/` (the `Servable` interface, SavedModel, TFLite, versions,
registry); `core/` (`InferenceCore`: infer, readiness, metadata, status; batching, dtypes);
`transport/` (one error envelope per port, connection limits); `protocols/`
(`TFServingProtocol` and `V2Protocol` over the core, their gRPC servicers and `RestDoor`s); on
top `server` and `workers` (assembly, `--workers N`), `client`, `rest_client`, `cli`,
`preflight`, `testing`. Each module's role: docs/explanation/design-notes.md,
"serving/__init__.py".
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what editors and type checkers see; at run time __getattr__ imports them
    from ampflow.serving.client import PredictionClient
    from ampflow.serving.rest_client import RestClient

# The Python clients, importable as `from ampflow.serving import PredictionClient` (README),
# loaded on first use so that importing `ampflow.serving` (the CLI does) pulls in no gRPC/TF.
_EXPORTS = {"PredictionClient": "client", "RestClient": "rest_client"}

__all__ = ["PredictionClient", "RestClient"]


def __getattr__(name: str):
    """Import the submodule that defines `name` when it is first asked for."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
