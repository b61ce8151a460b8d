"""The reload check: a user's model must load back from its .keras file, before training.

evaluate and export load the published model.keras; a custom layer whose config does not rebuild
it trains and saves fine and fails only there. check-model and train check it first here.
"""

from __future__ import annotations

import inspect
from pathlib import Path

from ampflow.errors import ConfigError
from ampflow.modeling.user_model import (
    ModelSpec,
    custom_objects_in,
    last_line,
    walk_layers,
)


def check_reloads(model, spec: ModelSpec, model_path: str | Path | None = None) -> None:
    """Save `model` as a `.keras` file and load it back, as evaluate and export will; or refuse.

    A custom layer Keras cannot rebuild from its config (an `__init__` without `**kwargs`, a
    `get_config` that leaves out an `__init__` argument) trains and saves fine and fails only
    when the next step loads the model: caught here, before any epoch, with the layer, the
    cause and the fix in one ConfigError line. The archive goes to a temporary dir (never next
    to the user's files) and is loaded with the user's module importable from `model_path`,
    exactly as `load_trained_model` loads the published one.

    Cost, measured on 2 shared CPU cores: 0.1-0.3 s for the small CNN; for a ResNet-50-sized
    model (24 M parameters) 1.3-2 s to save and 3-4.7 s to load (2-3.6 s in all when the host
    was quieter, up to 13 s at a load average of 10), the same on tmpfs as on disk: Keras's
    rebuild and weight reading dominate. The built-in architectures are ampflow's own code,
    reloaded by its tests, so they are not checked here (nothing to pay).
    """
    import tempfile

    import keras

    if spec.kind == "builtin":
        return
    source = f"model {spec.text!r}"
    with tempfile.TemporaryDirectory(prefix="ampflow-reload-check-") as tmp:
        archive = Path(tmp) / "model.keras"
        try:
            model.save(archive)
            keras.saving.load_model(archive, compile=False,
                                    custom_objects=custom_objects_in(archive, model_path))
        except ConfigError:
            raise
        except Exception as e:
            raise ConfigError(f"{source} will not reload from its .keras file, which evaluate "
                              f"and export load after training: {reload_failure(model, e)}"
                              ) from e


def reload_failure(model, error: BaseException) -> str:
    """Why `model` does not reload: the first layer whose config does not rebuild it, and the fix.

    Each layer of a class outside Keras is rebuilt alone (`from_config(get_config())`), the
    step Keras's loader takes for it; Keras's own message buries the cause in the whole
    model's config. Without such a layer, the last line of `error`.
    """
    for layer, path in walk_layers(model):
        cls = type(layer)
        if cls.__module__.split(".")[0] in ("keras", "tf_keras", "tensorflow"):
            continue
        try:
            cls.from_config(layer.get_config())
        except Exception as e:  # the user's own code: anything can be raised
            return f"layer {path!r} ({cls.__name__}) {_layer_fix(cls, e)}"
    return "Received: " + last_line(error)


def _layer_fix(cls, error: BaseException) -> str:
    """What is wrong with a custom layer class that does not rebuild, and the fix."""
    text = last_line(error)
    accepts_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD
                         for p in inspect.signature(cls.__init__).parameters.values())
    if not accepts_kwargs and "unexpected keyword argument" in text:
        return (f"has an __init__ without **kwargs, so Keras cannot pass back the name, "
                f"trainable and dtype its config holds (Received: {text}). Fix: "
                f"`def __init__(self, ..., **kwargs)` and `super().__init__(**kwargs)`")
    if "get_config" in text or "missing" in text and "argument" in text:
        return (f"has a get_config that does not return every __init__ argument (Received: "
                f"{text}). Fix: override get_config to return "
                "`{**super().get_config(), <each __init__ argument>: ...}`")
    return f"cannot be rebuilt from its own get_config() (Received: {text})"
