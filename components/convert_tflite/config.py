"""The convert step's config: the variants, the checks' inputs, and each variant's gate.

The gate thresholds are per variant (`<variant>_min_agreement`, `<variant>_max_accuracy_drop`,
and for float32/float16 `<variant>_max_prob_diff`); `gates_for(variant)` lists the ones a
variant must pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from ampflow.artifacts.tflite_variants import VARIANTS
from ampflow.errors import ConfigError
from ampflow.serving.model_format import DEFAULT_SIGNATURE


@dataclass(frozen=True)
class ConvertConfig:
    """Everything a conversion depends on; written next to the .tflite files as config.json."""

    saved_model_dir: Path = field(metadata={
        "help": "SavedModel version dir (<base>/<model>/<version>) or the model dir above it "
                "(the highest version is taken)."})
    data_dir: Path = field(metadata={
        "help": "Prepared dataset dir: training split for calibration, test split for checks."})
    output_dir: Path = field(metadata={"help": "Directory that receives the TFLite models."})
    variants: tuple[str, ...] = field(default=VARIANTS, metadata={
        "choices": VARIANTS, "help": "Variants to produce."})
    signature_key: str = field(default=DEFAULT_SIGNATURE, metadata={
        "help": "SavedModel signature to convert (an image model's; a text model's variants are "
                "always its token_ids signature: TFLite runs no string op)."})
    representative_size: int = field(default=200, metadata={
        "help": "Training images (a text model: sentences, tokenized) used to calibrate "
                "full_int8."})
    seed: int = field(default=42, metadata={
        "help": "Seed that draws the representative images (or sentences)."})
    int8_io: bool = field(default=False, metadata={
        "help": "full_int8 takes int8 input and returns int8 probabilities (quantize with the "
                "input tensor's scale/zero_point; see full_int8.json)."})
    test_limit: int | None = field(default=None, metadata={
        "help": "Check on the first N test images (or sentences) only (default: the whole test "
                "split)."})
    batch_size: int = field(default=32, metadata={
        "help": "Batch size for the accuracy pass and the throughput measurement."})
    latency_runs: int = field(default=200, metadata={
        "help": "Timed single-image invocations per variant (median and p95 reported)."})
    warmup_runs: int = field(default=10, metadata={
        "help": "Untimed invocations before timing."})
    num_threads: int | None = field(default=None, metadata={
        "help": "Interpreter threads (default: the interpreter's own choice)."})
    edge_check: bool | None = field(default=None, metadata={
        "help": "Rerun every model in the standalone LiteRT interpreter (ai-edge-litert) and "
                "require the same outputs; auto = where the package is installed."})
    edge_tolerance: float = field(default=1e-5, metadata={
        "help": "Max |probability difference| allowed between tf.lite and LiteRT outputs of "
                "a float-activation variant (full_int8's LiteRT answers pass its own gate "
                "instead: int8 kernels may round apart)."})
    float32_min_agreement: float = field(default=0.999, metadata={
        "help": "Gate: float32 argmax agreement with the SavedModel (fraction)."})
    float16_min_agreement: float = field(default=0.995, metadata={
        "help": "Gate: float16 argmax agreement with the SavedModel (fraction)."})
    dynamic_range_min_agreement: float = field(default=0.98, metadata={
        "help": "Gate: dynamic_range argmax agreement with the SavedModel (fraction)."})
    full_int8_min_agreement: float = field(default=0.97, metadata={
        "help": "Gate: full_int8 argmax agreement with the SavedModel (fraction)."})
    float32_max_accuracy_drop: float = field(default=0.3, metadata={
        "help": "Gate: float32 top-1 accuracy drop vs the SavedModel (percentage points)."})
    float16_max_accuracy_drop: float = field(default=0.5, metadata={
        "help": "Gate: float16 top-1 accuracy drop vs the SavedModel (percentage points)."})
    dynamic_range_max_accuracy_drop: float = field(default=1.0, metadata={
        "help": "Gate: dynamic_range top-1 accuracy drop vs the SavedModel (points)."})
    full_int8_max_accuracy_drop: float = field(default=1.0, metadata={
        "help": "Gate: full_int8 top-1 accuracy drop vs the SavedModel (points)."})
    float32_max_prob_diff: float = field(default=1e-4, metadata={
        "help": "Gate: float32 max |probability difference| vs the SavedModel."})
    float16_max_prob_diff: float = field(default=0.01, metadata={
        "help": "Gate: float16 max |probability difference| vs the SavedModel."})

    def __post_init__(self) -> None:
        if not self.variants:
            raise ConfigError(f"variants must name at least one of {VARIANTS}. "
                              f"Received: variants={self.variants!r}")
        unknown = [v for v in self.variants if v not in VARIANTS]
        if unknown:
            raise ConfigError(f"variants must be among {VARIANTS}. Received: variants="
                              f"{tuple(self.variants)!r} (unknown: {unknown})")
        if len(set(self.variants)) != len(self.variants):
            raise ConfigError(f"variants must not repeat. Received: variants={self.variants!r}")
        positive = {"representative_size": self.representative_size,
                    "batch_size": self.batch_size, "latency_runs": self.latency_runs}
        for name in ("test_limit", "num_threads"):
            if getattr(self, name) is not None:
                positive[name] = getattr(self, name)
        for name, value in positive.items():
            if value <= 0:
                raise ConfigError(f"{name} must be > 0. Received: {name}={value}")
        if self.warmup_runs < 0:
            raise ConfigError(f"warmup_runs must be >= 0. Received: warmup_runs={self.warmup_runs}")
        for variant in VARIANTS:
            name = f"{variant}_min_agreement"
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"{name} must be in [0, 1]. Received: {name}="
                                  f"{getattr(self, name)}")
        nonnegative = [f"{v}_max_accuracy_drop" for v in VARIANTS]
        nonnegative += ["float32_max_prob_diff", "float16_max_prob_diff", "edge_tolerance"]
        for name in nonnegative:
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"{name} must be a finite number >= 0. Received: {name}={value}")

    def gates_for(self, variant: str) -> list[tuple[str, str, float]]:
        """(metric, op, threshold) triples that `variant` must pass."""
        gates = [("agreement", ">=", getattr(self, f"{variant}_min_agreement")),
                 ("accuracy_drop_points", "<=", getattr(self, f"{variant}_max_accuracy_drop"))]
        if variant in ("float32", "float16"):
            gates.append(("max_abs_prob_diff", "<=", getattr(self, f"{variant}_max_prob_diff")))
        return gates
