"""A TF1 SavedModel run in a `tf.compat.v1.Session`, as TF Serving's SavedModelBundle runs it.

`tf.saved_model.load` turns each SignatureDef of a TF1 graph into a function and sets each
output's declared shape on the graph's tensor (`WrapFunction.prune`), so a SignatureDef that
states an output shape its graph contradicts is refused. TF Serving's own
`saved_model_half_plus_three` is one: TF 1.0's `build_tensor_info` wrote no shape, which
reads as a scalar, for a `y` the graph makes `[-1, 1]`. TF Serving's session loader never
reads those shapes: it imports the graph, restores the variables and runs a signature by
feeding and fetching its tensor names, so the graph decides. `session_servable` does that for
exactly this case (a TF1 SavedModel that `tf.saved_model.load` refused, whose SignatureDefs
state an output shape the graph contradicts); any other failure keeps its own error.
GetModelMetadata shows the SignatureDefs as written (`metadata_signature_defs`); requests are
checked against the graph's dtypes and shapes (`signature_defs`), which is what the session
takes. A Session's run is thread-safe: requests run side by side, and server-side batching
merges them into one run as for any SavedModel.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from ampflow.errors import ModelLoadError
from ampflow.serving.model_format import (
    INIT_OP_SIGNATURE,
    SERVE_TAG,
    read_saved_model,
    serving_meta_graph,
)
from ampflow.serving.models.token_cost import read_token_cost

log = logging.getLogger(__name__)

def session_servable(model: str, version: int, path: Path, compute_precision: str,
                     error: Exception) -> SessionServable | None:
    """The version run in a Session, or None: then the caller raises `error` as it was.

    A Session serves it when `error` is `tf.saved_model.load` refusing a TF1 graph whose
    SignatureDefs state an output shape the graph contradicts. A Session that does not load
    it either (missing variables, an unknown op) is None too: the version fails with
    `tf.saved_model.load`'s error, as before.
    """
    if isinstance(error, ModelLoadError):  # our own refusals, before or after the load
        return None
    try:
        disagreements = output_shape_disagreements(path)
    except Exception as e:  # not a graph TensorFlow imports: the load's own error stands
        log.info("model %s version %d: not read as a TF1 graph (%s)", model, version, e)
        return None
    if not disagreements:
        return None
    if compute_precision != "float32":
        raise ModelLoadError(
            f"compute_precision {compute_precision} rewrites a SavedModel's functions; this "
            "version is a TF1 graph whose SignatureDefs disagree with it, run in a Session as "
            "TF Serving runs it (serve it with the default float32)") from error
    try:
        servable = SessionServable(model, version, path)
    except Exception as e:
        log.info("model %s version %d: a Session does not load it either (%s)", model,
                 version, e)
        return None
    log.warning("model %s version %d: tf.saved_model.load refused it (%s: %s); its "
                "SignatureDefs disagree with its graph (%s): running it in a TF1 Session, as "
                "TF Serving does (the graph decides shapes)", model, version,
                type(error).__name__, str(error).splitlines()[0] if str(error) else "",
                "; ".join(disagreements[:3]))
    return servable


def output_shape_disagreements(path: Path) -> list[str]:
    """Each SignatureDef output whose declared shape the TF1 graph's tensor contradicts.

    What `tf.saved_model.load` checks and TF Serving does not. [] for a TF2 SavedModel (one
    MetaGraph with an object graph: `tf.saved_model.load` never reads it as a TF1 graph).
    The graph is imported at its own GraphDef version, as a Session imports it.
    """
    import tensorflow as tf

    saved_model = read_saved_model(path)
    if len(saved_model.meta_graphs) == 1 and \
            saved_model.meta_graphs[0].HasField("object_graph_def"):
        return []
    meta_graph = serving_meta_graph(saved_model, path)
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(meta_graph.graph_def, name="")
    found = []
    for name, sig in sorted(meta_graph.signature_def.items()):
        for key, info in sorted(sig.outputs.items()):
            tensor = _tensor(graph, info)
            declared = tf.TensorShape(info.tensor_shape)
            if tensor is not None and not declared.is_compatible_with(tensor.shape):
                found.append(f"signature '{name}' output '{key}' declares shape "
                             f"{_shape_text(declared)}, the graph's {info.name} is "
                             f"{_shape_text(tensor.shape)}")
    return found


class SessionServable:
    """A loaded TF1 version run in a Session: a `servable.Servable` (see the module doc)."""

    platform = "tensorflow_savedmodel"  # what V2 model metadata calls this format
    model_format = "saved_model"
    runtime = "session"

    def __init__(self, model: str, version: int, path: Path) -> None:
        import tensorflow as tf

        self.model, self.version, self.path = model, version, path
        self.token_cost = read_token_cost(path)
        graph = tf.Graph()
        self._session = tf.compat.v1.Session(graph=graph)
        meta_graph = tf.compat.v1.saved_model.loader.load(self._session, [SERVE_TAG],
                                                          str(path))
        self.metadata_signature_defs = dict(meta_graph.signature_def)
        self.signature_defs = {name: graph_signature(sig, graph)
                               for name, sig in self.metadata_signature_defs.items()}
        self._calls = {name: SessionCall(self._session, sig)
                       for name, sig in self.metadata_signature_defs.items()
                       if name != INIT_OP_SIGNATURE and _runnable(graph, sig)}

    def can_run(self, signature: str) -> bool:
        """Whether `signature` names tensors of the graph (not the init op's SignatureDef)."""
        return signature in self._calls

    def run(self, signature: str, inputs: dict) -> dict:
        """Feed each input to its tensor name, fetch every output: one Session run."""
        return self._calls[signature](inputs)


class SessionCall:
    """One signature as a Session callable: its tensor names fed and fetched, in a fixed order.

    Made with the Session's `_make_callable_from_options` (TensorFlow's C++ MakeCallable, as
    Keras's TF1 backend used it), which feeds the arrays as they are: `Session.run` would first
    compare each fed shape with the tensor's static shape in Python, which TF Serving's session
    never does (`x` sent as `[3]` runs a graph whose `x` is `[-1, 1]`). A TensorFlow without it
    keeps `Session.run` and its check.
    """

    def __init__(self, session, sig) -> None:
        from tensorflow.core.protobuf import config_pb2

        self._feeds = sorted(sig.inputs)
        self._fetches = sorted(sig.outputs)
        feed_names = [sig.inputs[key].name for key in self._feeds]
        fetch_names = [sig.outputs[key].name for key in self._fetches]
        make = getattr(session, "_make_callable_from_options", None)
        if make is not None:
            self._call = make(config_pb2.CallableOptions(feed=feed_names, fetch=fetch_names))
        else:
            self._call = lambda *values: session.run(fetch_names, dict(zip(feed_names, values,
                                                                           strict=True)))

    def __call__(self, inputs: dict) -> dict:
        values = self._call(*(inputs[key] for key in self._feeds))
        return {key: np.asarray(value) for key, value in zip(self._fetches, values, strict=True)}


def graph_signature(sig, graph):
    """A copy of `sig` whose tensors carry the graph's dtypes and static shapes.

    What a request is checked against before it runs: the dtype a Session would take for each
    name, and its shape as far as the graph knows it (-1 or unknown rank where it does not).
    """
    checked = type(sig)()
    checked.CopyFrom(sig)
    for infos in (checked.inputs, checked.outputs):
        for info in infos.values():
            tensor = _tensor(graph, info)
            if tensor is not None:
                info.dtype = tensor.dtype.base_dtype.as_datatype_enum
                info.tensor_shape.CopyFrom(tensor.shape.as_proto())
    return checked


def _runnable(graph, sig) -> bool:
    """Every input and output is a dense tensor of the graph (what a Session feeds/fetches)."""
    infos = [*sig.inputs.values(), *sig.outputs.values()]
    return bool(sig.outputs) and all(_tensor(graph, info) is not None for info in infos)


def _tensor(graph, info):
    """The graph's tensor a TensorInfo names; None for a sparse/composite one or no tensor."""
    if info.WhichOneof("encoding") != "name":
        return None
    try:
        return graph.get_tensor_by_name(info.name)
    except (KeyError, ValueError):  # no such tensor, or an operation's name
        return None


def _shape_text(shape) -> str:
    """A shape as the serving errors write one: [-1, 1], [] for a scalar, <unknown>."""
    if shape.rank is None:
        return "<unknown>"
    return str([-1 if d is None else d for d in shape.as_list()])
