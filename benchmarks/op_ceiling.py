"""The op-level ceiling of a model's training step: its own conv and matmul shapes, in isolation.

Each distinct convolution or matmul of the model (and, for a Transformer, attention's two
batched matmuls and its softmax) runs forward and backward (input and weight gradients, as
`tape.gradient` makes them in the real step) alone, in float32 and in bfloat16, interleaved
round by round so a shared machine's load falls on both alike. The ceiling is what the step's
bf16/float32 ratio would be if everything but these ops were free:

    ceiling = sum(count * float32 time) / sum(count * bfloat16 time)   over the conv/matmul ops

(the softmax is reported beside it, not in it: the models here keep softmax in float32 under
every policy). An op a dtype cannot run here (no kernel) is recorded with its error, never
fatal. Used by step_profile.py.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class OpShape:
    """One distinct op of the step: `count` of them per step, each `gflop` forward + backward."""

    kind: str  # conv, depthwise, matmul, batch_matmul, softmax
    label: str
    count: int
    gflop: float  # forward + input gradient + weight gradient, per occurrence (0 for softmax)
    params: tuple  # what the builder needs (shapes, strides, padding)


def image_op_shapes(model, batch: int) -> list[OpShape]:
    """The distinct Conv2D / DepthwiseConv2D / Dense ops of an image model, with their counts."""
    import keras

    found: dict[tuple, int] = {}
    for layer in _leaf_layers(model):
        if isinstance(layer, keras.layers.DepthwiseConv2D):
            key = ("depthwise", (batch, *layer.input.shape[1:]), tuple(layer.kernel_size),
                   tuple(layer.strides), layer.padding.upper())
        elif isinstance(layer, keras.layers.Conv2D):
            key = ("conv", (batch, *layer.input.shape[1:]), (*layer.kernel_size,
                   layer.input.shape[-1], layer.filters), tuple(layer.strides),
                   layer.padding.upper())
        elif isinstance(layer, keras.layers.Dense):
            key = ("matmul", (batch, layer.input.shape[-1]), (layer.input.shape[-1],
                   layer.units))
        else:
            continue
        found[key] = found.get(key, 0) + 1
    return [_image_shape(key, count, model) for key, count in found.items()]


def _image_shape(key: tuple, count: int, model) -> OpShape:
    kind = key[0]
    if kind == "matmul":
        (m, k), (_, n) = key[1], key[2]
        return OpShape("matmul", f"matmul {m}x{k} @ {k}x{n}", count, 3 * 2 * m * k * n / 1e9,
                       (m, k, n))
    x_shape, kernel, strides, padding = key[1:]
    b, h, w, c = x_shape
    out_h, out_w = _out_size(h, kernel[0], strides[0], padding), _out_size(
        w, kernel[1], strides[1], padding)
    if kind == "depthwise":
        macs = b * out_h * out_w * c * kernel[0] * kernel[1]
        label = f"depthwise {kernel[0]}x{kernel[1]}/{strides[0]} {b}x{h}x{w}x{c}"
    else:
        macs = b * out_h * out_w * kernel[3] * kernel[0] * kernel[1] * c
        label = f"conv {kernel[0]}x{kernel[1]}/{strides[0]} {b}x{h}x{w}x{c}->{kernel[3]}"
    return OpShape(kind, label, count, 3 * 2 * macs / 1e9, (x_shape, kernel, strides, padding))


def _out_size(size: int, kernel: int, stride: int, padding: str) -> int:
    return -(-size // stride) if padding == "SAME" else (size - kernel) // stride + 1


def _leaf_layers(model):
    for layer in model.layers:
        if hasattr(layer, "layers"):
            yield from _leaf_layers(layer)
        else:
            yield layer


def encoder_op_shapes(layers: int, hidden: int, heads: int, intermediate: int,
                      sequence: int, batch: int) -> list[OpShape]:
    """A BERT-style encoder's matmuls per step: projections, attention, feed-forward, pooler.

    Per layer: the Q, K, V and output projections ([B*S, H] x [H, H]), the feed-forward
    ([B*S, H] x [H, 4H], [B*S, 4H] x [4H, H]), attention's scores Q K^T and its weighted
    values ([B*A, S, d] batched, d = H/A) and the softmax over [B, A, S, S]; once, the
    pooler ([B, H] x [H, H]).
    """
    tokens, d = batch * sequence, hidden // heads
    shapes = [
        OpShape("matmul", f"projection {tokens}x{hidden} @ {hidden}x{hidden}", 4 * layers,
                3 * 2 * tokens * hidden * hidden / 1e9, (tokens, hidden, hidden)),
        OpShape("matmul", f"feed-forward in {tokens}x{hidden} @ {hidden}x{intermediate}",
                layers, 3 * 2 * tokens * hidden * intermediate / 1e9,
                (tokens, hidden, intermediate)),
        OpShape("matmul", f"feed-forward out {tokens}x{intermediate} @ {intermediate}x{hidden}",
                layers, 3 * 2 * tokens * intermediate * hidden / 1e9,
                (tokens, intermediate, hidden)),
        OpShape("batch_matmul", f"attention scores {batch * heads}x({sequence}x{d} @ "
                f"{d}x{sequence})", layers, 3 * 2 * batch * heads * sequence * sequence * d / 1e9,
                (batch * heads, sequence, d, sequence)),
        OpShape("batch_matmul", f"attention values {batch * heads}x({sequence}x{sequence} @ "
                f"{sequence}x{d})", layers, 3 * 2 * batch * heads * sequence * sequence * d / 1e9,
                (batch * heads, sequence, sequence, d)),
        OpShape("softmax", f"softmax {batch}x{heads}x{sequence}x{sequence}", layers, 0.0,
                (batch, heads, sequence, sequence)),
        OpShape("matmul", f"pooler {batch}x{hidden} @ {hidden}x{hidden}", 1,
                3 * 2 * batch * hidden * hidden / 1e9, (batch, hidden, hidden)),
    ]
    return shapes


def _train_fn(tf, op: OpShape, dtype: str):
    """(function, arguments): the op forward and its gradients w.r.t. every input."""
    def normal(shape, scale=1.0):
        return tf.cast(tf.random.normal(shape) * scale, dtype)

    if op.kind in ("conv", "depthwise"):
        x_shape, kernel, strides, padding = op.params
        if op.kind == "conv":
            k = normal(kernel, 0.05)
            forward = lambda x, k: tf.nn.conv2d(x, k, strides, padding)  # noqa: E731
        else:
            k = normal((*kernel, x_shape[-1], 1), 0.05)
            forward = lambda x, k: tf.nn.depthwise_conv2d(  # noqa: E731
                x, k, (1, *strides, 1), padding)
        inputs = (normal(x_shape), k)
    elif op.kind == "matmul":
        m, k_, n = op.params
        inputs, forward = (normal((m, k_)), normal((k_, n), 0.05)), tf.matmul
    elif op.kind == "batch_matmul":
        b, m, k_, n = op.params
        inputs, forward = (normal((b, m, k_)), normal((b, k_, n))), tf.matmul
    else:
        inputs, forward = (normal(op.params),), tf.nn.softmax
    dy = tf.ones_like(forward(*inputs))

    @tf.function
    def step(*args):
        with tf.GradientTape() as tape:
            tape.watch(args)
            y = forward(*args)
        return y, tape.gradient(y, args, output_gradients=dy)  # y returned: never pruned

    return step, inputs


def _seconds(fn, inputs, min_seconds: float) -> float:
    """Seconds per call, over at least `min_seconds` and 2 calls, after one untimed call."""
    fn(*inputs)
    calls, began = 0, time.perf_counter()
    while calls < 2 or time.perf_counter() - began < min_seconds:
        out = fn(*inputs)
        calls += 1
    out[0].numpy()
    return (time.perf_counter() - began) / calls


class Probe:
    """The ops' functions, built and warmed up once; `round()` times each op in each dtype.

    step_profile.py runs a probe round between its step rounds, so the ceiling and the step
    are measured side by side; `measure` runs the rounds back to back.
    """

    def __init__(self, ops: list[OpShape], min_seconds: float = 0.2) -> None:
        import tensorflow as tf

        self.ops, self.min_seconds = ops, min_seconds
        self.fns: dict[tuple[int, str], tuple] = {}
        self.errors: dict[tuple[int, str], str] = {}
        self.times: dict[tuple[int, str], list[float]] = {}
        self.rounds = 0
        for i, op in enumerate(ops):
            for dtype in DTYPES:
                try:
                    self.fns[(i, dtype)] = _train_fn(tf, op, dtype)
                    _seconds(*self.fns[(i, dtype)], 0.0)  # trace and warm up
                except Exception as e:  # no kernel for this dtype here: recorded, not fatal
                    self.fns.pop((i, dtype), None)
                    self.errors[(i, dtype)] = (str(e).strip().splitlines()
                                               or [type(e).__name__])[0][:160]

    def round(self) -> None:
        """Every op in both dtypes, side by side (the dtypes' order flipped every round)."""
        order = DTYPES if self.rounds % 2 == 0 else DTYPES[::-1]
        for i in range(len(self.ops)):
            for dtype in order:
                if (i, dtype) in self.fns:
                    self.times.setdefault((i, dtype), []).append(
                        _seconds(*self.fns[(i, dtype)], self.min_seconds))
        self.rounds += 1

    def rows(self) -> list[dict]:
        """Per op: each dtype's median ms, GFLOP/s and per-round ms; the bf16 speed-up."""
        rows = []
        for i, op in enumerate(self.ops):
            row = {**asdict(op), "params": repr(op.params)}
            for dtype in DTYPES:
                if (i, dtype) in self.times:
                    ms = 1000 * statistics.median(self.times[(i, dtype)])
                    row[dtype] = {"ms": ms,
                                  "gflops": op.gflop / ms * 1000 if op.gflop else None,
                                  "rounds_ms": [1000 * t for t in self.times[(i, dtype)]]}
                else:
                    row[dtype] = {"error": self.errors.get((i, dtype), "not measured")}
            f32, bf16 = row["float32"].get("ms"), row["bfloat16"].get("ms")
            row["bf16_speedup"] = f32 / bf16 if f32 and bf16 else None
            rows.append(row)
        return rows


def measure(ops: list[OpShape], rounds: int = 3, min_seconds: float = 0.2) -> list[dict]:
    """Each op in each dtype, interleaved over `rounds` (the order flipped every round)."""
    probe = Probe(ops, min_seconds)
    for _ in range(rounds):
        probe.round()
    return probe.rows()


def ceiling(rows: list[dict]) -> dict:
    """The step-level ceiling from the measured ops: count-weighted times per dtype, ratio.

    `ratio` is the median over rounds of each round's ratio (both dtypes of every op were
    timed side by side in a round, so a busy spell of the shared host falls on both);
    `ms_per_step` the per-op medians summed.
    """
    compute = [r for r in rows if r["kind"] != "softmax"]
    ok = [r for r in compute if r["bf16_speedup"]]
    total = {d: sum(r["count"] * r[d]["ms"] for r in ok) for d in DTYPES}
    gflop = sum(r["count"] * r["gflop"] for r in ok)
    softmax = [r for r in rows if r["kind"] == "softmax"]
    rounds = min((len(r[d]["rounds_ms"]) for r in ok for d in DTYPES), default=0)
    per_round = [sum(r["count"] * r["float32"]["rounds_ms"][k] for r in ok)
                 / sum(r["count"] * r["bfloat16"]["rounds_ms"][k] for r in ok)
                 for k in range(rounds)]
    return {
        "ops_measured": len(ok), "ops_failed": len(compute) - len(ok),
        "gflop_per_step": gflop,
        "ms_per_step": total,
        "gflops": {d: gflop / total[d] * 1000 if total[d] else None for d in DTYPES},
        "rounds_ratio": per_round,
        "ratio": statistics.median(per_round) if per_round else None,
        "softmax_ms_per_step": {d: sum(r["count"] * r[d].get("ms", 0) for r in softmax)
                                for d in DTYPES} if softmax else None,
    }
