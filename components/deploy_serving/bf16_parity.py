"""Whether a version may be served with `--compute-precision bfloat16`: its parity with float32.

Checked like a TFLite variant: the SavedModel answers the test split of `data_dir` in float32
and in bfloat16 through `ampflow serve`'s own servable (the numbers are the server's), and the
bfloat16 answers must pass a gate against the float32 ones (agreement, accuracy drop, max
|probability difference|). It runs only on a CPU with bf16 units and refuses a run whose graph
holds no bfloat16 node (it would compare float32 with float32). The gate's reasons and the
canary's part: docs/explanation/design-notes.md, "bf16_parity.py".
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import numpy as np

from ampflow.artifacts.canary_examples import CanaryExamples
from ampflow.errors import ConfigError
from ampflow.serving import compute_precision as precision
from ampflow.serving import cpu_features
from ampflow.serving.model_format import CLASS_IDS_OUTPUT, DEFAULT_SIGNATURE, PROBABILITIES_OUTPUT

log = logging.getLogger(__name__)
BATCH = 64


@dataclasses.dataclass(frozen=True)
class Gate:
    """The bfloat16 gate's thresholds (DeployConfig's `bfloat16_*` fields)."""

    min_agreement: float
    max_accuracy_drop: float
    max_prob_diff: float

    def triples(self) -> list[tuple[str, str, float]]:
        """(metric, op, threshold), as the convert step's `gates_for` lists a variant's."""
        return [("agreement", ">=", self.min_agreement),
                ("accuracy_drop_points", "<=", self.max_accuracy_drop),
                ("max_abs_prob_diff", "<=", self.max_prob_diff)]


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The gate's evidence, and the bfloat16 answers the canary will expect."""

    evidence: dict[str, Any]
    expected: CanaryExamples | None


def check(saved_model_dir: Path, data_dir: Path, gate: Gate, *, limit: int | None = None,
          recorded: CanaryExamples | None = None,
          cpu_flags: frozenset[str] | None = None) -> Verdict:
    """Run the gate (module doc); ConfigError, in one line, when it fails or cannot run here."""
    from ampflow.data.split_request import split_request
    from ampflow.serving.models.servable import SavedModelServable

    flags = cpu_features.read_cpu_flags() if cpu_flags is None else cpu_flags
    reason = precision.unsupported_reason("bfloat16", flags)
    if reason:
        raise ConfigError(f"the bfloat16 parity check runs the model here, and cannot: {reason}")
    split = split_request(data_dir, "test", limit)
    float32 = SavedModelServable("float32", 1, Path(saved_model_dir))
    bfloat16 = SavedModelServable("bfloat16", 1, Path(saved_model_dir), "bfloat16")
    reference = _answer(float32, split.input_name, split.examples)
    first = split.examples[:BATCH]
    rewrite = precision.bf16_graph_evidence(
        lambda: bfloat16.run(DEFAULT_SIGNATURE, {split.input_name: first}))
    answers = _answer(bfloat16, split.input_name, split.examples)
    evidence = _evidence(reference, answers, split.labels, gate, rewrite, flags)
    _refuse_unless_passed(evidence, rewrite)
    expected = None
    if recorded is not None:
        out = bfloat16.run(DEFAULT_SIGNATURE, {recorded.input_key: recorded.images})
        expected = dataclasses.replace(
            recorded, probabilities=np.asarray(out[PROBABILITIES_OUTPUT], dtype=np.float32),
            class_ids=np.asarray(out[CLASS_IDS_OUTPUT], dtype=np.int64))
    log.info("bfloat16 parity on %d test examples: agreement %.4f, accuracy %.4f -> %.4f, "
             "max |p diff| %.4g; %d bfloat16 nodes (%s)", evidence["num_examples"],
             evidence["agreement"], evidence["float32_accuracy"],
             evidence["bfloat16_accuracy"], evidence["max_abs_prob_diff"],
             rewrite["bfloat16_nodes"], ", ".join(rewrite["bfloat16_ops"]))
    return Verdict(evidence, expected)


def _answer(servable, input_name: str, examples: np.ndarray) -> np.ndarray:
    out = [servable.run(DEFAULT_SIGNATURE, {input_name: examples[start:start + BATCH]})
           [PROBABILITIES_OUTPUT] for start in range(0, len(examples), BATCH)]
    return np.concatenate(out).astype(np.float64)


def _evidence(reference: np.ndarray, answers: np.ndarray, labels: np.ndarray, gate: Gate,
              rewrite: dict, flags: frozenset[str]) -> dict[str, Any]:
    """The metrics the convert step reports for a variant, and the gate's checks on them."""
    ref_ids, ids = reference.argmax(axis=1), answers.argmax(axis=1)
    diff = np.abs(answers - reference)
    metrics = {
        "num_examples": int(len(labels)),
        "float32_accuracy": float(np.mean(ref_ids == labels)),
        "bfloat16_accuracy": float(np.mean(ids == labels)),
        "agreement": float(np.mean(ids == ref_ids)),
        "max_abs_prob_diff": float(diff.max()),
        "mean_abs_prob_diff": float(diff.mean()),
    }
    metrics["accuracy_drop_points"] = (metrics["float32_accuracy"]
                                       - metrics["bfloat16_accuracy"]) * 100.0
    checks = []
    for name, op, threshold in gate.triples():
        value = metrics[name]
        ok = value >= threshold if op == ">=" else value <= threshold
        checks.append({"name": name, "value": value, "op": op, "threshold": threshold,
                       "passed": bool(ok)})
    return {"compute_precision": "bfloat16", "passed": all(c["passed"] for c in checks),
            "cpu_bf16_flags": cpu_features.bf16_flags(flags), "rewrite": rewrite, **metrics,
            "checks": checks}


def _refuse_unless_passed(evidence: dict[str, Any], rewrite: dict) -> None:
    if not rewrite["bfloat16_nodes"]:
        raise ConfigError(
            "compute_precision='bfloat16' would change nothing for this model: TF's oneDNN "
            f"bfloat16 rewrite left no op of its graph in bfloat16 ({rewrite['graphs']} graphs "
            "executed); serve it in float32")
    failed = [f"{c['name']} = {c['value']:.6g} (must be {c['op']} {c['threshold']:g})"
              for c in evidence["checks"] if not c["passed"]]
    if failed:
        raise ConfigError(
            f"compute_precision='bfloat16' failed its parity gate against float32 on "
            f"{evidence['num_examples']} test examples ({'; '.join(failed)}); the version is "
            "not published: serve it in float32, or loosen --bfloat16-* knowingly")
