"""A user's own model: a builder in their package, or a saved `.keras` file to fine-tune.

`--model` is a built-in name, `package.module:function` (a builder called under the chosen
policy, for images or texts), or a `.keras` path. Whatever the form, the model then gets the
standard float32 head (`logits`, `probabilities`) that evaluate, export and TFLite rely on, and
`rebuild_with_policy` rebuilds a saved float32 model under the policy (a saved model keeps its
layers' float32 policies). The contract: docs/explanation/design-notes.md, "user_model.py", and
docs/how-to/own-model.md.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import inspect
import re
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ampflow.errors import ConfigError

LOGITS_LAYER = "logits"
PROBABILITIES_LAYER = "probabilities"
HEAD_LAYERS = (LOGITS_LAYER, PROBABILITIES_LAYER)
_BUILDER = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")
KINDS = ("builtin", "builder", "file", "checkpoint")
# A pretrained checkpoint given by a hub handle: the download is the user's (pretrained.py).
_HANDLES = ("hf://", "kaggle://")
# A builder's arguments per kind of data: a sample call its signature must bind, and their names.
_BUILDER_CONTRACTS = {"image": (((8, 8, 1), 2), "input_shape, num_classes"),
                      "text": ((16, 100, 2), "sequence_length, vocabulary_size, num_classes")}


@dataclass(frozen=True)
class ModelSpec:
    """What `--model` names: its kind and the text the user gave."""

    kind: str  # one of KINDS
    text: str

    @property
    def module(self) -> str:
        """The builder's module (`package.module`); only for kind "builder"."""
        return self.text.split(":")[0]

    @property
    def function(self) -> str:
        """The builder's function name; only for kind "builder"."""
        return self.text.split(":")[1]


def parse_model_spec(text: str, builtin_names: tuple[str, ...]) -> ModelSpec:
    """Classify `--model`; a ConfigError naming the three accepted forms otherwise."""
    text = (text or "").strip()
    if text in builtin_names:
        return ModelSpec("builtin", text)
    if text.endswith(".keras"):
        return ModelSpec("file", text)
    if _BUILDER.match(text):
        return ModelSpec("builder", text)
    if text.startswith(_HANDLES):
        from ampflow.modeling.pretrained import read_pretrained_bert

        read_pretrained_bert(text)  # one line: the download command to run where the network is
    if Path(text).expanduser().is_dir():  # a pretrained checkpoint as downloaded: checked when read
        return ModelSpec("checkpoint", str(Path(text).expanduser()))
    close = difflib.get_close_matches(text, builtin_names, n=1, cutoff=0.6)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ConfigError(
        f"model must be a built-in name ({', '.join(builtin_names)}), a builder "
        f"'package.module:function', a path ending in .keras, or the directory of a pretrained "
        f"BERT checkpoint. Received: model={text!r}.{hint}")


def add_model_path(model_path: str | Path | None) -> None:
    """Put `model_path` first on `sys.path` (once), so the user's package imports from it."""
    if not model_path:
        return
    path = Path(model_path).expanduser().resolve()
    if not path.is_dir():
        raise ConfigError(f"model_path must be an existing directory. Received: "
                          f"model_path={str(model_path)!r}")
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))


def import_builder(spec: ModelSpec, model_path: str | Path | None = None, task: str = "image"):
    """Import the builder function named by `spec`; every failure is one ConfigError line.

    `task` ("image" or "text") is the contract its arguments are checked against.
    """
    add_model_path(model_path)
    module = import_user_module(spec.module, model_path)
    builder = getattr(module, spec.function, None)
    if builder is None:
        found = sorted(n for n, v in vars(module).items()
                       if callable(v) and not n.startswith("_")
                       and getattr(v, "__module__", None) == module.__name__)
        raise ConfigError(f"model builder {spec.text!r}: module {spec.module!r} has no function "
                          f"{spec.function!r}. Received: a module defining {found}")
    if not callable(builder):
        raise ConfigError(f"model builder {spec.text!r} must be a function. Received: "
                          f"{type(builder).__name__}")
    probe, arguments = _BUILDER_CONTRACTS[task]
    try:
        inspect.signature(builder).bind(*probe)
    except TypeError as e:
        raise ConfigError(f"model builder {spec.text!r} must accept ({arguments}). "
                          f"Received: a function with signature {inspect.signature(builder)} "
                          f"({e})") from e
    except ValueError:  # a builtin without a signature: let the call decide
        pass
    return builder


def import_user_module(module_name: str, model_path: str | Path | None = None):
    """Import the user's module; an import that fails shows its error's last line."""
    add_model_path(model_path)
    try:
        return importlib.import_module(module_name)
    except Exception as e:  # ImportError, SyntaxError, or anything the module raises
        last = f"{type(e).__name__}: {e}".strip().splitlines()[-1]
        where = f" (model_path={str(model_path)!r})" if model_path else \
            " (not on sys.path: pass --model-path DIR)"
        raise ConfigError(f"model module {module_name!r} does not import{where}. "
                          f"Received: {last}") from e


def call_builder(spec: ModelSpec, builder, input_shape: tuple[int, int, int], num_classes: int):
    """Call the user's builder and check what it returned against the contract."""
    import keras

    try:
        model = builder(tuple(input_shape), int(num_classes))
    except Exception as e:
        last = f"{type(e).__name__}: {e}".strip().splitlines()[-1]
        raise ConfigError(f"model builder {spec.text!r} failed when called with "
                          f"input_shape={tuple(input_shape)}, num_classes={num_classes}. "
                          f"Received: {last}") from e
    if not isinstance(model, keras.Model):
        raise ConfigError(f"model builder {spec.text!r} must return a keras.Model. Received: "
                          f"{type(model).__name__}")
    if isinstance(model, keras.Sequential) and not _has_inputs(model):
        model.build((None, *map(int, input_shape)))  # a Sequential without keras.Input
    if not _has_inputs(model):
        raise ConfigError(f"model builder {spec.text!r} must return a functional or Sequential "
                          "model (a subclassed keras.Model has no graph to check or give a "
                          f"float32 head). Received: a {type(model).__name__} without inputs")
    return model


def _has_inputs(model) -> bool:
    try:
        return bool(model.inputs)
    except (AttributeError, ValueError):  # an unbuilt Sequential raises on `.inputs`
        return False


def custom_objects_in(archive_path: str | Path, model_path: str | Path | None = None) -> dict:
    """The classes a `.keras` archive names outside Keras, imported by their recorded module.

    Keras finds a custom class only if it is registered (`register_keras_serializable`) or
    passed in `custom_objects`; its config records the class's module anyway. Importing those
    modules (from `model_path` first) and passing their classes lets a user's unregistered
    custom layer load, in every step, from nothing but the archive and the user's code.
    """
    import json

    with zipfile.ZipFile(archive_path) as archive:
        config = json.loads(archive.read("config.json"))
    wanted: dict[str, set[str]] = {}
    _collect_classes(config, wanted)
    found = {}
    for module_name, class_names in sorted(wanted.items()):
        module = import_user_module(module_name, model_path)
        for name in class_names:
            if hasattr(module, name):
                found[name] = getattr(module, name)
    return found


def _collect_classes(node, wanted: dict[str, set[str]]) -> None:
    if isinstance(node, dict):
        module, name = node.get("module"), node.get("class_name")
        if (isinstance(module, str) and isinstance(name, str)
                and module.split(".")[0] not in ("keras", "builtins", "tensorflow", "tf_keras")):
            wanted.setdefault(module, set()).add(name)
        for value in node.values():
            _collect_classes(value, wanted)
    elif isinstance(node, list):
        for value in node:
            _collect_classes(value, wanted)


def load_model_file(path: str | Path, model_path: str | Path | None = None):
    """Load a `.keras` file given as `--model`; a missing, corrupt or foreign file is one line."""
    import keras

    import ampflow.modeling.layers  # noqa: F401  (registers FusedBatchNormalization)

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"model must be an existing .keras file. Received: model={str(path)!r} "
                          "(no such file)")
    try:
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
            damaged = archive.testzip()
    except (zipfile.BadZipFile, OSError) as e:
        raise ConfigError(f"model must be a Keras v3 .keras archive. Received: {str(path)!r}, "
                          f"which is not a zip archive ({e})") from e
    if damaged is not None or "config.json" not in names:
        reason = (f"member {damaged!r} fails its CRC check" if damaged
                  else f"no config.json in it (members: {sorted(names)[:5]})")
        raise ConfigError(f"model must be a Keras v3 .keras archive. Received: {str(path)!r}: "
                          f"{reason}")
    try:
        return keras.saving.load_model(path, compile=False,
                                       custom_objects=custom_objects_in(path, model_path))
    except ConfigError:
        raise
    except Exception as e:
        last = f"{type(e).__name__}: {e}".strip().splitlines()[-1]
        raise ConfigError(f"model file {str(path)!r} could not be loaded (a custom layer in it "
                          f"must be importable: pass --model-path). Received: {last}") from e


def last_line(error: BaseException) -> str:
    """`Type: the last line of the message` (Keras puts the cause last, after the config)."""
    lines = str(error).strip().splitlines()
    if not lines:
        return type(error).__name__
    return f"{type(error).__name__}: {lines[-1].removeprefix('Exception encountered: ')}"


def check_io(model, input_shape: tuple[int, int, int], num_classes: int, source: str) -> None:
    """The model takes `(None, *input_shape)` and returns `(None, num_classes)`, or ConfigError."""
    inputs, outputs = list(model.inputs or []), list(model.outputs or [])
    if len(inputs) != 1 or len(outputs) != 1:
        raise ConfigError(f"{source} must be a functional or Sequential model with one input "
                          f"and one output. Received: {len(inputs)} input(s), {len(outputs)} "
                          "output(s)")
    got_in = tuple(inputs[0].shape)
    want_in = (None, *map(int, input_shape))
    if got_in != want_in:
        raise ConfigError(
            f"{source} must take the data's images {list(want_in)} (raw pixels 0..255; prepare "
            f"the data with --image-size to change H, W). Received: a model whose input is "
            f"{list(got_in)}")
    check_output(outputs[0], num_classes, source)


def check_output(output, num_classes: int, source: str) -> None:
    """The model's one output is `(None, num_classes)`, image or text model alike."""
    got_out = tuple(output.shape)
    if len(got_out) != 2 or got_out[-1] != num_classes:
        raise ConfigError(f"{source} must return [batch, {num_classes}] (logits or softmax "
                          f"probabilities, one per class). Received: output shape "
                          f"{list(got_out)}")


def standard_head(model) -> tuple[Any, list[str]]:
    """`model` ending in float32 `logits` → float32 `probabilities`; and what was changed.

    A model already in that form (the built-ins, or a model ampflow saved) is returned as it is.
    Otherwise the output is read, through nested models: a softmax (an Activation/Softmax layer,
    `keras.ops.softmax`, or a Dense with softmax activation) is taken off and recomputed in
    float32 from its input (the Dense's weights reused in a float32 Dense), since a
    half-precision softmax has already lost what a cast afterwards cannot bring back; any other
    output is taken as logits and cast to float32. User layers named `logits`/`probabilities`
    are renamed (`<name>_user`) so that the head's names stay unique.
    """
    import keras

    if _has_standard_head(model):
        return model, []
    model, fixes = _free_head_names(model)
    source = _softmax_source(model)
    if source is None:
        logits = model.outputs[0]
        layer = output_layer(model)
        fixes.append(f"output of {layer.name!r} ({compute_dtype(layer)}) taken as logits")
    elif source.dense is None:
        logits = source.pre_softmax
        fixes.append(f"output softmax {source.name!r} ({source.dtype}) recomputed in float32 "
                     "from its input")
    else:
        dense = source.dense
        float32_dense = keras.layers.Dense(dense.units, use_bias=dense.use_bias,
                                           dtype="float32", name=f"{dense.name}_float32")
        logits = float32_dense(source.pre_softmax)
        float32_dense.set_weights(dense.get_weights())
        fixes.append(f"output Dense {dense.name!r} ({source.dtype}, softmax) recomputed in "
                     "float32 without its softmax")
    logits = keras.layers.Activation("linear", dtype="float32", name=LOGITS_LAYER)(logits)
    probabilities = keras.layers.Activation("softmax", dtype="float32",
                                            name=PROBABILITIES_LAYER)(logits)
    fixes.append("float32 head appended: logits (float32) → probabilities (float32 softmax)")
    return keras.Model(model.inputs, probabilities, name=model.name), fixes


@dataclass(frozen=True)
class _SoftmaxSource:
    """Where a model's output softmax is, and the tensor before it in the top-level graph."""

    name: str
    dtype: str
    pre_softmax: Any  # the softmax's (or the softmax Dense's) input, a top-level KerasTensor
    dense: Any = None  # the Dense(activation="softmax") to recompute, if that is the softmax


def _softmax_source(model) -> _SoftmaxSource | None:
    """The output softmax of `model` (looking inside a nested model's output), or None."""
    import keras

    operation, node_index = _producer(model.outputs[0])
    if operation is None:
        return None
    node_inputs = operation._inbound_nodes[node_index].input_tensors
    if isinstance(operation, keras.Model):
        inner = _softmax_source(operation) if len(operation.inputs) == 1 else None
        if inner is None or len(node_inputs) != 1:
            return None
        # the inner graph up to the softmax's input, called on what the nested model was
        # called on: shares its layers and weights, in the top-level graph
        before = keras.Model(operation.inputs, inner.pre_softmax)(node_inputs[0])
        return _SoftmaxSource(inner.name, inner.dtype, before, inner.dense)
    if len(node_inputs) != 1:
        return None
    if _is_softmax(operation):
        return _SoftmaxSource(operation.name, compute_dtype(operation), node_inputs[0])
    if isinstance(operation, keras.layers.Dense) and _activation_name(operation) == "softmax":
        return _SoftmaxSource(operation.name, compute_dtype(operation), node_inputs[0],
                              dense=operation)
    return None


def _free_head_names(model) -> tuple[Any, list[str]]:
    """`model` with any user layer named `logits`/`probabilities` renamed `<name>_user`."""
    import keras

    clashing = {layer.name for layer in model.layers} & set(HEAD_LAYERS)
    if not clashing:
        return model, []

    def rename(layer):
        if layer.name not in clashing:
            return layer  # the same layer object: shares its weights
        config = {**layer.get_config(), "name": f"{layer.name}_user"}
        return layer.__class__.from_config(config)

    renamed = keras.models.clone_model(model, clone_function=rename)
    for name in clashing:
        renamed.get_layer(f"{name}_user").set_weights(model.get_layer(name).get_weights())
    return renamed, [f"layer {name!r} renamed {name}_user: ampflow's float32 head uses that name"
                     for name in sorted(clashing)]


@contextlib.contextmanager
def policy_scope(policy: str | None) -> Iterator[None]:
    """Temporarily set the Keras global dtype policy (no-op for None)."""
    import keras

    if policy is None:
        yield
        return
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(policy)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(previous)


def rebuild_with_policy(model, policy: str, keep_float32: tuple[str, ...] = HEAD_LAYERS):
    """A copy of `model` whose layers compute under `policy` (the head stays float32).

    Every layer, nested models included, is re-created from its config with the config's dtype
    replaced; the weights are then copied, so nothing changes but the compute dtype. A layer
    whose config cannot be re-created is a ConfigError naming it (custom layers must implement
    `get_config` and accept `**kwargs`, as Keras requires for saving anyway).
    """
    import keras

    def convert(layer):
        config = layer.get_config()
        if "dtype" in config:
            config["dtype"] = "float32" if layer.name in keep_float32 else policy
        try:
            return layer.__class__.from_config(config)
        except Exception as e:
            raise ConfigError(
                f"layer {layer.name!r} ({type(layer).__name__}) could not be re-created under "
                f"{policy}: its get_config/from_config must round-trip. Received: "
                f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e

    with policy_scope(policy):  # layers without a dtype in their config, and custom layers'
        clone = keras.models.clone_model(model, clone_function=convert,  # own sublayers,
                                         recursive=True)  # take the global policy
    try:
        clone.set_weights(model.get_weights())
    except ValueError as e:
        raise ConfigError(f"the weights of {model.name!r} do not fit its copy under {policy}: "
                          f"{e}") from e
    return clone


def layer_dtypes(model) -> list[dict[str, str]]:
    """Every layer, nested models' and custom layers' sublayers too: compute/variable dtype."""
    return [{"name": path, "class": type(layer).__name__,
             "compute_dtype": layer.dtype_policy.compute_dtype,
             "variable_dtype": layer.dtype_policy.variable_dtype}
            for layer, path in walk_layers(model)]


def walk_layers(model) -> list[tuple[Any, str]]:
    """Every layer below `model` (nested models and a custom layer's sublayers), with its path."""
    found, seen = [], set()

    def visit(layer, path):
        for child in children(layer):
            if id(child) in seen:
                continue
            seen.add(id(child))
            child_path = f"{path}/{child.name}" if path else child.name
            if type(child).__name__ != "InputLayer":
                found.append((child, child_path))
            visit(child, child_path)

    visit(model, "")
    return found


def children(layer) -> list:
    """Sublayers (Keras ops such as GetItem in a functional graph are not layers: left out)."""
    import keras

    children = layer._layers if hasattr(layer, "_layers") else getattr(layer, "layers", [])
    return [c for c in children or [] if isinstance(c, keras.layers.Layer)]


def _has_standard_head(model) -> bool:
    names = {layer.name: layer for layer in model.layers}
    probabilities, logits = names.get(PROBABILITIES_LAYER), names.get(LOGITS_LAYER)
    return (probabilities is not None and logits is not None
            and _producer(model.outputs[0])[0] is probabilities
            and compute_dtype(probabilities) == "float32" and compute_dtype(logits) == "float32")


def output_layer(model):
    """The layer (or Keras op) producing the model's output, inside nested models too."""
    import keras

    for _ in range(64):
        operation, _node = _producer(model.outputs[0]) if getattr(model, "outputs", None) \
            else (None, None)
        if not isinstance(operation, keras.Model) or not getattr(operation, "outputs", None):
            return operation
        model = operation
    return None


def compute_dtype(layer) -> str:
    """A layer's compute dtype; a Keras op (`keras.ops.softmax`) has no policy: float32."""
    policy = getattr(layer, "dtype_policy", None)
    return policy.compute_dtype if policy is not None else "float32"


def _producer(tensor):
    """(the operation that made `tensor`, its node index), or (None, None)."""
    history = getattr(tensor, "_keras_history", None)
    return (history[0], history[1]) if history is not None else (None, None)


def _is_softmax(operation) -> bool:
    """A Softmax layer, an Activation("softmax") or the `keras.ops.softmax` op."""
    import keras

    if isinstance(operation, keras.layers.Activation):
        return _activation_name(operation) == "softmax"
    return type(operation).__name__ == "Softmax"  # the layer, or keras.ops' Softmax op


def _activation_name(layer) -> str:
    activation = getattr(layer, "activation", None)
    return getattr(activation, "__name__", str(activation))


# ---- text models (the contract in the module docstring) -------------------------------------


def call_text_builder(spec: ModelSpec, builder, sequence_length: int, vocabulary_size: int,
                      num_classes: int):
    """Call the user's text builder and check it returned a functional or Sequential model.

    A Sequential without `keras.Input` gets the int32 token-id input of the contract.
    """
    import keras

    arguments = f"sequence_length={sequence_length}, vocabulary_size={vocabulary_size}, " \
                f"num_classes={num_classes}"
    try:
        model = builder(int(sequence_length), int(vocabulary_size), int(num_classes))
    except Exception as e:
        last = f"{type(e).__name__}: {e}".strip().splitlines()[-1]
        raise ConfigError(f"model builder {spec.text!r} failed when called with {arguments}. "
                          f"Received: {last}") from e
    if not isinstance(model, keras.Model):
        raise ConfigError(f"model builder {spec.text!r} must return a keras.Model. Received: "
                          f"{type(model).__name__}")
    if isinstance(model, keras.Sequential) and not _has_inputs(model):
        model = keras.Sequential([keras.Input((int(sequence_length),), dtype="int32"),
                                  *model.layers], name=model.name)
    if not _has_inputs(model):
        raise ConfigError(f"model builder {spec.text!r} must return a functional or Sequential "
                          "model (a subclassed keras.Model has no graph to check or give a "
                          f"float32 head). Received: a {type(model).__name__} without inputs")
    return model


def check_text_io(model, sequence_length: int, num_classes: int, source: str) -> None:
    """The model takes int32 ids `(None, sequence_length)`, returns `(None, num_classes)`.

    `(None, None)` too: ampflow's own encoders take any length up to their position table's,
    so one trained here can be fine-tuned from its `.keras` file.
    """
    inputs, outputs = list(model.inputs or []), list(model.outputs or [])
    if len(inputs) != 1 or len(outputs) != 1:
        raise ConfigError(f"{source} must be a functional or Sequential model with one input "
                          f"(the token ids) and one output. Received: {len(inputs)} input(s), "
                          f"{len(outputs)} output(s)")
    got_in, dtype = tuple(inputs[0].shape), str(inputs[0].dtype)
    if got_in not in ((None, int(sequence_length)), (None, None)) or dtype != "int32":
        raise ConfigError(
            f"{source} must take int32 token ids [None, {sequence_length}] (0 = padding: "
            f"keras.Input(shape=({sequence_length},), dtype='int32'); the sequence length is "
            f"--max-sequence-length). Received: a model whose input is {list(got_in)} {dtype}")
    check_output(outputs[0], num_classes, source)
