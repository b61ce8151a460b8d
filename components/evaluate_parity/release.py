"""The release checks: above chance, good enough, and no worse than the model now serving.

The parity checks compare the AMP model with float32 versions of itself, and a model that
learned nothing agrees perfectly with another that learned nothing; so, as TFX's Evaluator
does, a model is blessed only above chance (one-sided binomial test), past optional absolute
thresholds, and not significantly worse than the model now serving (paired McNemar test). The
statistics: docs/explanation/design-notes.md, "release.py", and docs/explanation/parity.md.
"""

from __future__ import annotations

import math
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ampflow.artifacts.verdict import Check
from ampflow.components.evaluate_parity.parity import ModelScores
from ampflow.data.split_request import SplitRequest
from ampflow.errors import ConfigError

# The accuracy the power note is computed against: halfway from chance to perfect.
POWER_TARGET = "halfway between chance and perfect accuracy"
_THRESHOLD = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*(>=|<=)\s*([^\s,]+)\s*")


# --- the binomial test ---------------------------------------------------------------------

def class_names(info: dict[str, Any]) -> list[str]:
    """The dataset's class names in id order; the ids as names where dataset_info has none."""
    names = info.get("class_names") or []
    if len(names) != int(info["num_classes"]):
        names = [str(i) for i in range(int(info["num_classes"]))]
    return [str(name) for name in names]


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p), summed exactly in log space (any n, no scipy)."""
    if not 0 <= k <= n:
        raise ValueError(f"k must be in [0, n]. Received: k={k}, n={n}")
    if k == 0 or p >= 1.0:
        return 1.0
    if p <= 0.0:
        return 0.0
    terms = _log_pmf(n, p)[k:]
    top = float(np.max(terms))
    return min(1.0, math.exp(top) * math.fsum(np.exp(terms - top)))


def _log_pmf(n: int, p: float) -> np.ndarray:
    """The log of P(X = i), i = 0..n, for X ~ Binomial(n, p), 0 < p < 1."""
    i = np.arange(n + 1, dtype=np.float64)
    # log C(n, i) = sum over j = 1..i of log((n - j + 1) / j)
    log_comb = np.concatenate([[0.0], np.cumsum(np.log((n - i[1:] + 1) / i[1:]))])
    return log_comb + i * math.log(p) + (n - i) * math.log1p(-p)


def _upper_tails(n: int, p: float) -> np.ndarray:
    """P(X >= k) for k = 0..n (one pass: the cumulative sum from the top)."""
    pmf = np.exp(_log_pmf(n, p))
    return np.minimum(np.cumsum(pmf[::-1])[::-1], 1.0)


def chance_test_power(n: int, chance: float, alpha: float) -> float:
    """Probability that the test at `alpha` finds a model of accuracy (1 + chance) / 2."""
    if n <= 0 or chance >= 1.0:
        return 0.0
    significant = np.nonzero(_upper_tails(n, chance) <= alpha)[0]
    if significant.size == 0:  # even n of n correct would not be significant
        return 0.0
    return float(_upper_tails(n, (1.0 + chance) / 2.0)[significant[0]])


def examples_needed(chance: float, alpha: float, power: float, start: int = 1,
                    limit: int = 100_000) -> int | None:
    """The smallest split size >= start at which the test reaches `power` (None: over limit).

    Scanned exactly (the power of a discrete test is a sawtooth in n, not monotone), upward
    from half the normal approximation's estimate (or `start`, if larger).
    """
    if chance >= 1.0:
        return None
    target = (1.0 + chance) / 2.0
    z = _normal_quantile(1 - alpha) * math.sqrt(chance * (1 - chance)) + _normal_quantile(
        power) * math.sqrt(target * (1 - target))
    estimate = max(start, int((z / (target - chance)) ** 2 / 2))
    n = max(start, min(estimate, limit))
    while n <= limit:
        if chance_test_power(n, chance, alpha) >= power:
            return n
        n += 1
    return None


def _normal_quantile(q: float) -> float:
    """Inverse of the standard normal CDF (bisection on erfc: exact enough for an estimate)."""
    low, high = -10.0, 10.0
    for _ in range(80):
        mid = (low + high) / 2
        if 0.5 * math.erfc(-mid / math.sqrt(2)) < q:
            low = mid
        else:
            high = mid
    return (low + high) / 2


@dataclass(frozen=True)
class ChanceTest:
    """The model's accuracy against the majority-class rate of the same split."""

    num_examples: int
    correct: int
    chance: float  # the majority-class rate of the split
    majority_class: str
    p_value: float  # one-sided: P(X >= correct) for X ~ Binomial(n, chance)
    alpha: float
    power: float  # of the test at alpha against accuracy (1 + chance) / 2
    min_power: float
    split: str
    item: str = "examples"  # the data's word: images, texts

    @property
    def accuracy(self) -> float:
        """The model's accuracy on the split."""
        return self.correct / self.num_examples

    @property
    def too_small(self) -> bool:
        """Whether the split is too small for the test's stated power."""
        return self.power < self.min_power

    def sentence(self) -> str:
        """The verdict in words: `accuracy A is [not] above chance C (...)`."""
        above = self.p_value <= self.alpha
        return (f"accuracy {self.accuracy:.3f} is {'' if above else 'not '}above chance "
                f"{self.chance:.3f} (the majority-class rate of the {self.num_examples} "
                f"{self.split} examples, class {self.majority_class!r}): one-sided binomial "
                f"p = {self.p_value:.3g} {'<=' if above else '>'} alpha {self.alpha:g}")

    def too_small_note(self) -> str:
        """One line: the split is too small to decide, and what to do about it."""
        needed = examples_needed(self.chance, self.alpha, self.min_power,
                                 start=self.num_examples + 1)
        need = f"at least {needed}" if needed else "far more"
        return (f"the {self.split} split of {self.num_examples} {self.item} is too small to "
                f"decide whether the model beats chance: the binomial test at alpha "
                f"{self.alpha:g} finds a model {POWER_TARGET} ({(1 + self.chance) / 2:.3f}) "
                f"with probability {self.power:.2f}, and needs {need} {self.item} for "
                f"{self.min_power:g}; {hold_out_more(self.item)}")

    def metrics(self) -> dict[str, Any]:
        """The flat entries of metrics.json."""
        return {"chance_accuracy": self.chance, "chance_binomial_p_value": self.p_value,
                "chance_test_power": self.power}

    def check(self) -> Check:
        """The gate's check: the p-value must be at most alpha."""
        return Check("chance_binomial_p_value", self.p_value, "<=", self.alpha,
                     "one-sided binomial test of the accuracy against the majority-class rate",
                     reason=self.sentence())


def hold_out_more(item: str) -> str:
    """What to do about a split too small, in the data's words (`texts`, `images`)."""
    folder = ", or a test/ folder of images" if item == "images" else ""
    return (f"hold out more {item} (--test-fraction of prepare-data and run-local, the "
            f"pipeline's test_fraction{folder})")


def chance_test(scores: ModelScores, class_names: list[str], alpha: float, min_power: float,
                split: str, item: str = "examples") -> ChanceTest:
    """The binomial test of `scores`' accuracy against its split's majority-class rate."""
    n = int(scores.labels.shape[0])
    counts = np.bincount(scores.labels, minlength=len(class_names))
    majority = int(np.argmax(counts))
    chance = float(counts[majority]) / n
    correct = int(np.sum(scores.predictions == scores.labels))
    return ChanceTest(num_examples=n, correct=correct, chance=chance,
                      majority_class=class_names[majority],
                      p_value=binomial_tail(correct, n, chance), alpha=alpha,
                      power=chance_test_power(n, chance, alpha), min_power=min_power,
                      split=split, item=item)


# --- absolute thresholds -------------------------------------------------------------------

def parse_metric_thresholds(text: str | None) -> tuple[tuple[str, str, float], ...]:
    """`NAME>=VALUE,NAME<=VALUE` -> ((name, op, value), ...); ConfigError in one line."""
    out = []
    for item in (text or "").split(","):
        if not item.strip():
            continue
        match = _THRESHOLD.fullmatch(item)
        try:
            value = float(match.group(3)) if match else math.nan
        except ValueError:
            value = math.nan
        if not match or not math.isfinite(value):
            raise ConfigError("metric_thresholds must be NAME>=VALUE or NAME<=VALUE, comma-"
                              "separated, on metrics.json's numbers (e.g. amp_accuracy>=0.9). "
                              f"Received: {item.strip()!r}")
        out.append((match.group(1), match.group(2), value))
    return tuple(out)


def threshold_checks(metrics: dict[str, Any], min_accuracy: float,
                     thresholds: str | None) -> list[Check]:
    """`min_accuracy` (0: off) and the metric thresholds, as gate checks."""
    from ampflow.cliutil import did_you_mean

    checks = []
    if min_accuracy > 0:
        accuracy = metrics["amp_accuracy"]
        checks.append(Check("min_accuracy", accuracy, ">=", min_accuracy,
                            "accuracy of the AMP model on the split",
                            reason=f"accuracy {accuracy:.3f} is "
                                   f"{'at least' if accuracy >= min_accuracy else 'below'} "
                                   f"min_accuracy {min_accuracy:g}"))
    numbers = {k: v for k, v in metrics.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    for name, op, value in parse_metric_thresholds(thresholds):
        if name not in numbers:
            raise ConfigError(f"metric_thresholds must name numbers of metrics.json; this "
                              f"evaluation measures no {name!r}. Received: "
                              f"{name}{op}{value:g}{did_you_mean(name, numbers)}")
        checks.append(Check(f"threshold:{name}", float(numbers[name]), op, value,
                            f"metric_thresholds: {name} {op} {value:g}"))
    return checks


# --- the model now serving -----------------------------------------------------------------

@dataclass(frozen=True)
class ServedVersion:
    """The version a server of the base path serves: the highest complete one."""

    base_path: str
    version: int
    path: Path  # where it is read: the version dir, or a local copy of an object-store one
    source: str = ""  # the version as the store names it (a path, or a gs://... URI)

    @property
    def copied(self) -> bool:
        """Whether `path` is a temporary local copy (of an object-store version)."""
        return self.source != os.fspath(self.path)


def find_served_version(base_path: str | os.PathLike | None) -> ServedVersion | None:
    """The highest complete version under `base_path` (TF Serving's default policy), if any.

    A version is complete when it holds `saved_model.pb` or one `.tflite` file; staging dirs
    (hidden) and half-copied numbers are not versions. No dir, or none: the first release. An
    object-store base path (gs://...) is read with tf.io.gfile, as TF Serving reads it, and
    its version copied to a temp dir (the loaders read files); `score_served` removes it.
    """
    from ampflow.serving.model_format import SAVED_MODEL_PB, version_dirs
    from ampflow.serving.models.tflite import tflite_file

    if not base_path:
        return None
    if "://" in os.fspath(base_path):
        return _find_served_in_store(os.fspath(base_path).rstrip("/"))
    complete = {v: p for v, p in version_dirs(base_path).items()
                if (p / SAVED_MODEL_PB).is_file() or tflite_file(p) is not None}
    if not complete:
        return None
    version = max(complete)
    path = complete[version]
    return ServedVersion(os.fspath(base_path), version, path, os.fspath(path))


def _find_served_in_store(base: str) -> ServedVersion | None:
    """`find_served_version` of an object-store URI, the version copied to a temp dir."""
    import tempfile

    import tensorflow as tf

    from ampflow.serving.model_format import SAVED_MODEL_PB, parse_version_name

    gfile = tf.io.gfile
    try:
        if not gfile.isdir(base):
            return None
        numbers = (parse_version_name(name.rstrip("/")) for name in gfile.listdir(base))
        for version in sorted((v for v in numbers if v is not None), reverse=True):
            remote = f"{base}/{version}"
            names = [name.rstrip("/") for name in gfile.listdir(remote)]
            if SAVED_MODEL_PB in names or any(n.endswith(".tflite") and not n.startswith(".")
                                              for n in names):
                local = Path(tempfile.mkdtemp(prefix="ampflow-served-")) / str(version)
                _copy_from_store(gfile, remote, local)
                return ServedVersion(base, version, local, remote)
    except tf.errors.OpError as e:
        raise ConfigError(f"the model serving at {base} cannot be read: {e.message}") from e
    return None


def _copy_from_store(gfile, remote: str, local: Path) -> None:
    for folder, _, files in gfile.walk(remote):
        target = local / folder[len(remote):].lstrip("/")
        target.mkdir(parents=True, exist_ok=True)
        for name in files:
            gfile.copy(f"{folder.rstrip('/')}/{name}", str(target / name), overwrite=True)


def score_served(served: ServedVersion, request: SplitRequest, class_names: list[str],
                 batch_size: int) -> ModelScores:
    """The served version's answers on the split, through `serving_default` as a server runs it.

    ConfigError, before any example is scored, when the two models cannot be compared on the
    same examples (another input, other classes). The scores' `logits` are the served
    probabilities: only their argmax (the served `class_ids`) is used.
    """
    from ampflow.serving.model_format import DEFAULT_SIGNATURE, PROBABILITIES_OUTPUT
    from ampflow.serving.models.servable import load_servable

    examples = request.examples
    try:
        servable = load_servable(served.base_path.rstrip("/").rsplit("/", 1)[-1],
                                 served.version, served.path)
        _require_comparable(served, servable, request, class_names)
        probabilities = []
        for start in range(0, len(examples), batch_size):
            out = servable.run(DEFAULT_SIGNATURE,
                               {request.input_name: examples[start:start + batch_size]})
            probabilities.append(np.asarray(out[PROBABILITIES_OUTPUT], dtype=np.float32))
    finally:
        if served.copied:  # an object-store version's temp copy
            shutil.rmtree(served.path.parent, ignore_errors=True)
    return ModelScores(logits=np.concatenate(probabilities), labels=request.labels)


def _require_comparable(served: ServedVersion, servable, request: SplitRequest,
                        class_names: list[str]) -> None:
    """ConfigError in one line unless the served model takes what the split is, with its classes."""
    from ampflow.serving.model_format import DEFAULT_SIGNATURE, PROBABILITIES_OUTPUT

    where = f"the model serving at {served.source} (version {served.version})"
    signature = servable.signature_defs.get(DEFAULT_SIGNATURE)
    if signature is None:
        raise ConfigError(f"{where} has no {DEFAULT_SIGNATURE!r} signature, so it cannot be "
                          "scored on this split")
    outputs = signature.outputs.get(PROBABILITIES_OUTPUT)
    classes = outputs.tensor_shape.dim[-1].size if outputs is not None else -1
    labels = _served_labels(served.path)
    problems = []
    takes = [(name, spec.dtype, [d.size for d in spec.tensor_shape.dim][1:])  # no batch dim
             for name, spec in sorted(signature.inputs.items())]
    if takes != request.declared():
        problems.append(f"it takes {_describe(takes)}, this split holds "
                        f"{_describe(request.declared())}")
    if classes != len(class_names):
        problems.append(f"it answers {classes} classes, this split has {len(class_names)}")
    elif labels is not None and labels != class_names:
        problems.append(f"its classes are {labels}, this split's {class_names}")
    if problems:
        raise ConfigError(
            f"{where} cannot be compared with this model on the same examples: "
            + "; ".join(problems) + ". Serve the new model under another model name, or "
            "evaluate without a serving baseline (serving_target none)")


def _describe(inputs: list[tuple[str, int, list[int]]]) -> str:
    """Inputs in words, for the one line that says the served model takes something else.

    `images [8, 8, 1]` and `text` for ampflow's two contracts (docs/ARTIFACTS.md); others as
    declared (a TFLite text variant takes token ids: `'input_ids' int32 [16]`).
    """
    from tensorflow.core.framework import types_pb2

    from ampflow.artifacts.signature_names import TEXT_INPUT
    from ampflow.serving.model_format import IMAGES_INPUT

    contracts = {(IMAGES_INPUT, types_pb2.DT_FLOAT): "images",
                 (TEXT_INPUT, types_pb2.DT_STRING): "text"}
    words = []
    for name, dtype, shape in inputs:
        kind = contracts.get((name, dtype))
        if kind is None:
            kind = f"{name!r} {types_pb2.DataType.Name(dtype)[3:].lower()}"
        words.append(f"{kind} {shape}" if shape else kind)
    return ", ".join(words) or "no input"


def _served_labels(version_dir: Path) -> list[str] | None:
    for path in (version_dir / "assets" / "labels.txt", version_dir / "labels.txt"):
        if path.is_file():
            return [line.strip() for line in path.read_text().splitlines() if line.strip()]
    return None
