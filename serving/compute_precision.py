"""`--compute-precision bfloat16`: a float32 SavedModel's math run in bfloat16 where the CPU has it.

TensorFlow's own grappler oneDNN auto-mixed-precision rewrite, switched on per model: an eager
call carries the ConfigProto it runs under, so `PrecisionScope` turns the rewrite on around one
call and the same signature answers in float32 outside it. A serve-time option, not an
exported variant: the rewrite cannot be saved, and whether bfloat16 is native is the serving
host's fact. Refused on a CPU without AVX512_BF16/AMX-BF16. The mechanism:
docs/explanation/design-notes.md, "compute_precision.py".
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from ampflow.errors import ConfigError
from ampflow.serving import cpu_features

COMPUTE_PRECISIONS = ("float32", "bfloat16")
FLAG = "--compute-precision"
_BF16_DTYPE = 14  # types_pb2.DT_BFLOAT16 (a literal: this module imports no TensorFlow)


def unsupported_reason(precision: str, cpu_flags: frozenset[str] | None = None) -> str | None:
    """Why `precision` cannot be served with `cpu_flags` (None: read them here); None: it can."""
    if precision not in COMPUTE_PRECISIONS:
        return f"compute_precision must be one of {COMPUTE_PRECISIONS}. Received: {precision!r}"
    if precision == "float32":
        return None
    flags = cpu_features.read_cpu_flags() if cpu_flags is None else cpu_flags
    if cpu_features.bf16_flags(flags):
        return None
    return (f"{FLAG} bfloat16 needs a CPU with AVX512_BF16 or AMX-BF16; this one has neither "
            "(/proc/cpuinfo), so oneDNN would emulate bfloat16, slower than float32. "
            "Received: compute_precision='bfloat16' (serve float32, the default)")


def check_supported(precision: str, cpu_flags: frozenset[str] | None = None) -> None:
    """ConfigError (one line) unless `precision` runs natively here."""
    reason = unsupported_reason(precision, cpu_flags)
    if reason:
        raise ConfigError(reason)


class PrecisionScope:
    """Calls inside `scope()` run with the bf16 rewrite ON, on this thread only (module doc).

    The ConfigProto is the one this thread's calls use by default at load time, with the one
    rewrite switched on, so thread pools and placement stay what they were.
    """

    def __init__(self, precision: str) -> None:
        from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2
        from tensorflow.python.eager import context

        if precision != "bfloat16":
            raise ValueError(f"no scope for compute precision {precision!r}")
        self._context = context.context()
        config = config_pb2.ConfigProto.FromString(  # this thread's defaults, as a copy
            self._context.function_call_options.config_proto_serialized)
        config.graph_options.rewrite_options.auto_mixed_precision_onednn_bfloat16 = (
            rewriter_config_pb2.RewriterConfig.ON)
        self._options = context.FunctionCallOptions(config_proto=config)

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """This thread's function calls run under the bf16 options; its own come back after."""
        previous = self._context.function_call_options
        self._context.function_call_options = self._options
        try:
            yield
        finally:
            self._context.function_call_options = previous


def bf16_graph_evidence(first_call: Callable[[], object]) -> dict:
    """What the runtime executed for a function's FIRST call: its nodes computing in bfloat16.

    Run metadata records a function's optimized graphs when it is instantiated, so `first_call`
    must be the first call of a freshly loaded signature under its scope; later calls record
    none (`graphs` 0 then says so). Returns the counts, the op types that run in bfloat16 and
    every op type executed (`ops`: a frozen bfloat16 model's hold no ReadVariableOp).
    """
    from tensorflow.python.eager import context

    ctx = context.context()
    ctx.enable_run_metadata()
    try:
        ctx.export_run_metadata()  # drops graphs left from earlier calls (a load, a save)
        first_call()
        metadata = ctx.export_run_metadata()
    finally:
        ctx.disable_run_metadata()
    nodes, ops, graphs, executed = 0, set(), 0, set()
    for function in metadata.function_graphs:
        for graph in function.partition_graphs or [function.post_optimization_graph]:
            graphs += 1
            for node in graph.node:
                executed.add(node.op)
                if any(attr.type == _BF16_DTYPE for attr in node.attr.values()):
                    nodes += 1
                    ops.add(node.op)
    return {"graphs": graphs, "bfloat16_nodes": nodes, "bfloat16_ops": sorted(ops),
            "ops": sorted(executed)}
