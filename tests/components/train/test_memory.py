"""Peak memory of a region, the largest batch that fits, and the memory in the evaluate report.

PeakMemory is checked against buffers of known size (TF's allocator and the process's RSS); the
search against a fake trial whose out-of-memory threshold is known (pure logic) and against the
real train-step probe of a tiny model under a limit set between two measured peaks.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest

from ampflow.components.train.run.memory import (
    ALLOCATOR_SOURCES,
    CPU_AUTO_BATCH_SIZE,
    SOURCES,
    InjectedOutOfMemory,
    MemoryLimit,
    MemoryPeak,
    PeakMemory,
    auto_batch_size,
    find_max_batch_size,
    is_out_of_memory,
    train_step_probe,
    why_not_comparable,
)
from ampflow.errors import ConfigError

MIB = 2**20


# ---- PeakMemory ------------------------------------------------------------------------------

def _allocator_reports() -> bool:
    """Whether TF's allocator keeps statistics here (a GPU's always does; a CPU's only under
    oneDNN's or the BFC allocator: memory.NO_CPU_STATS_HINT)."""
    try:
        PeakMemory(source="allocator").start().stop()
    except ConfigError:
        return False
    return True


# The process's peak is the whole process's: in a pytest worker that has run other tests, the
# cyclic GC or a thread left by an earlier test can free hundreds of MiB inside a region and hide
# a buffer from it (seen in CI: a 200 MiB numpy buffer read as a region of 0 bytes in a worker
# holding 2.1 GB). So the buffers of known size are measured in a fresh child process, where
# nothing else allocates or frees.
_REGIONS_IN_A_FRESH_PROCESS = """
import json, logging, os, sys
import numpy as np
from ampflow.components.train.run.memory import PeakMemory
MIB = 2**20
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
regions = {}
if sys.argv[1] == "tf":
    import tensorflow as tf
    with PeakMemory() as big:
        buffer = tf.ones((200 * MIB // 4,))  # 200 MiB of float32
        buffer.numpy()
        del buffer
    with PeakMemory() as small:
        tf.ones((MIB // 4,)).numpy()  # 1 MiB
    regions.update(big=big, small=small)
    # nested regions, after the 200 MiB were freed: outer, then inner
    with PeakMemory() as outer:
        tf.ones((64 * MIB // 4,)).numpy()  # freed before the inner region resets the counters
        with PeakMemory() as inner:
            tf.ones((MIB // 4,)).numpy()
    regions.update(outer=outer, inner=inner)
else:
    with PeakMemory(source="process") as big:
        buffer = np.ones(200 * MIB // 8)  # 200 MiB, every page written
        del buffer
    with PeakMemory(source="process") as small:
        np.ones(MIB // 8)
    regions.update(big=big, small=small)
print(json.dumps({name: region.result.to_json() for name, region in regions.items()}), flush=True)
logging.shutdown()
os._exit(0)  # measured and said: TensorFlow's teardown would only cost seconds
"""


def _regions_in_a_fresh_process(kind: str) -> tuple[dict, str]:
    """{region name: its JSON block} and what the child logged."""
    child = subprocess.run([sys.executable, "-c", _REGIONS_IN_A_FRESH_PROCESS, kind],
                           capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-3000:]
    return json.loads(child.stdout.strip().splitlines()[-1]), child.stderr


@pytest.fixture(scope="module")
def tf_regions() -> tuple[dict, str]:
    """The TensorFlow buffers' regions, flat and nested, measured in one fresh child (one
    TensorFlow start-up, about 5 CPU-s, for both tests that read them)."""
    return _regions_in_a_fresh_process("tf")


@pytest.mark.slow  # its fixture is a fresh TensorFlow process
def test_peak_memory_tf_buffer_counts_in_its_peak_and_reset_forgets_it(tf_regions):
    """Where TF's allocator keeps statistics its peak is the primary source; where it does not
    (an AVX2-only CPU, oneDNN off by default), the process's peak sees the buffer instead, and
    the log says once why and how to turn the statistics on."""
    regions, log = tf_regions
    big, small = regions["big"], regions["small"]
    assert big["resettable"]
    assert big["region_bytes"] >= 200 * MIB
    if _allocator_reports():  # this process and the child run the same TF on the same CPU
        assert big["source"] in ALLOCATOR_SOURCES
        assert small["region_bytes"] < 20 * MIB
        assert big["process_peak_bytes"] and big["process_source"] in SOURCES
    else:
        assert (big["source"], big["device"]) == ("process_vmhwm_reset", "process")
        assert small["region_bytes"] < 50 * MIB  # the reset forgot the 200 MiB
        assert "TF_CPU_ALLOCATOR_USE_BFC=true" in log
    assert log.count("no allocator statistics") <= 1  # once per process, not per region (4)


def test_peak_memory_a_peak_read_below_its_baseline_is_no_negative_region(monkeypatch):
    """The kernel's RSS counters are approximate (per-CPU batches of pages): VmHWM read at the
    end of a region can come out below the VmRSS read at its start (seen: -136 KiB for a train
    step probe). A region's peak holds what was in use when it began, so it reads as that."""
    from ampflow.components.train.run import memory

    with PeakMemory(source="process") as region:
        monkeypatch.setattr(memory, "_process_peak",
                            lambda: region._baseline["process"] - 34 * 4096)
    assert region.result.region_bytes == 0
    assert region.result.peak_bytes == region.result.baseline_bytes


def test_peak_memory_numpy_buffer_counts_in_process_peak_and_reset_forgets_it():
    regions, _ = _regions_in_a_fresh_process("numpy")
    big, small = regions["big"], regions["small"]
    assert big["device"] == "process"
    assert big["region_bytes"] >= 190 * MIB
    if big["resettable"]:  # /proc/self/clear_refs accepted the reset (Linux, here)
        assert big["source"] == "process_vmhwm_reset"
        assert small["region_bytes"] < 50 * MIB
    else:
        assert big["source"] == "process_maxrss_lifetime"


@pytest.mark.slow  # its fixture is a fresh TensorFlow process
def test_peak_memory_outer_region_keeps_its_peak_across_an_inner_reset(tf_regions):
    outer, inner = tf_regions[0]["outer"], tf_regions[0]["inner"]
    assert inner["region_bytes"] < 16 * MIB
    assert outer["region_bytes"] >= 64 * MIB


def test_peak_memory_start_stop_and_to_json_round_trip_through_json():
    region = PeakMemory().start()
    result = region.stop()
    assert result is region.result
    block = json.loads(json.dumps(result.to_json()))
    assert block["peak_bytes"] == result.peak_bytes
    assert block["region_bytes"] == result.peak_bytes - result.baseline_bytes
    assert {"baseline_bytes", "device", "source", "resettable"} <= set(block)


def test_peak_memory_unknown_source_is_a_config_error():
    with pytest.raises(ConfigError, match="source must be one of"):
        PeakMemory(source="gpu")


# ---- find_max_batch_size: pure logic ---------------------------------------------------------

def _fake_trial(threshold: int, tried: list[int]):
    """Runs batches up to `threshold`; above it raises TF's out-of-memory error."""
    import tensorflow as tf

    def trial(batch: int) -> None:
        tried.append(batch)
        if batch > threshold:
            raise tf.errors.ResourceExhaustedError(None, None, f"OOM at batch {batch}")

    return trial


@pytest.mark.parametrize("threshold, start, limit, multiple_of, expected", [
    (100, 8, 4096, 1, 100),    # doubles 8..128, then bisects to exactly 100
    (37, 1, 1000, 1, 37),
    (1000, 32, 512, 8, 512),   # the limit itself fits
    (100, 8, 4096, 8, 96),     # on the grid of 8: 96 fits, 104 does not
    (5, 32, 1024, 1, 5),       # the start does not fit: bisects below it
    (300, 32, 300, 1, 300),    # a limit that is not a power-of-two multiple of the start
])
def test_find_max_batch_size_finds_exactly_the_boundary(threshold, start, limit, multiple_of,
                                                        expected):
    tried: list[int] = []
    search = find_max_batch_size(_fake_trial(threshold, tried), start=start, limit=limit,
                                 multiple_of=multiple_of)
    assert search.batch_size == expected
    assert [a.batch_size for a in search.attempts] == tried
    assert all(a.ok == (a.batch_size <= threshold) for a in search.attempts)
    assert all(a.seconds >= 0 for a in search.attempts)
    assert all(b % multiple_of == 0 and b <= limit for b in tried)
    if expected < limit:  # the next batch on the grid was tried and failed
        assert any(a.batch_size == expected + multiple_of and not a.ok for a in search.attempts)
    assert len(tried) <= 2 * (limit.bit_length() + 1)


def test_find_max_batch_size_none_when_even_the_smallest_runs_out():
    search = find_max_batch_size(_fake_trial(0, []), start=4, limit=64)
    assert search.batch_size is None
    assert "even batch 1" in search.stopped


def test_find_max_batch_size_other_errors_propagate():
    def broken(batch: int) -> None:
        raise ValueError("a bug in the model, not an out-of-memory")

    with pytest.raises(ValueError, match="a bug in the model"):
        find_max_batch_size(broken, start=4, limit=64)


def test_find_max_batch_size_stops_at_the_attempt_budget():
    search = find_max_batch_size(_fake_trial(10**6, []), start=1, limit=10**6, max_attempts=3)
    assert search.batch_size == 4 and len(search.attempts) == 3
    assert "attempt budget" in search.stopped


@pytest.mark.parametrize("kwargs, match", [
    ({"start": 0, "limit": 8}, "start must be"),
    ({"start": 12, "limit": 64, "multiple_of": 8}, "start must be"),
    ({"start": 16, "limit": 8}, "limit must be"),
    ({"start": 8, "limit": 64, "multiple_of": 0}, "multiple_of must be"),
])
def test_find_max_batch_size_rejects_bad_bounds(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        find_max_batch_size(lambda b: None, **kwargs)


def test_is_out_of_memory_knows_tf_and_injected_errors_only():
    import tensorflow as tf

    peak = MemoryPeak(2, 1, "CPU:0", "cpu_allocator_peak", True)
    assert is_out_of_memory(tf.errors.ResourceExhaustedError(None, None, "OOM"))
    assert is_out_of_memory(tf.errors.InternalError(None, None, "Dst tensor is not initialized."))
    assert is_out_of_memory(InjectedOutOfMemory("over", peak))
    assert not is_out_of_memory(tf.errors.InvalidArgumentError(None, None, "bad shape"))
    assert not is_out_of_memory(ValueError("out of memory"))  # not TF's: a bug's message


# ---- the injected limit: real measured peaks -------------------------------------------------

def test_memory_limit_fails_a_trial_by_its_measured_peak():
    """Against an allocator's peak; without one (an AVX2-only CPU) one line says why, before any
    trial runs: the process's peak cannot compare two trials' tensors."""
    import tensorflow as tf

    def allocate(batch: int) -> None:  # batch MiB through TF's allocator
        tf.ones((batch * MIB // 4,)).numpy()

    limited = MemoryLimit(24 * MIB, allocate)
    if not _allocator_reports():
        with pytest.raises(ConfigError, match="must have TF allocator statistics.*"
                                              "TF_CPU_ALLOCATOR_USE_BFC=true"):
            limited(8)
        return
    assert limited(8).region_bytes <= 24 * MIB  # what the trial needed, whatever else is held
    with pytest.raises(InjectedOutOfMemory, match="over the 24.0 MiB limit") as caught:
        limited(64)
    assert caught.value.peak.region_bytes > 24 * MIB  # the real measurement, kept on the error
    search = find_max_batch_size(limited, start=4, limit=128, multiple_of=4)
    assert search.batch_size is not None
    assert all(a.peak_bytes is not None for a in search.attempts)
    assert all((a.peak_bytes <= 24 * MIB) == a.ok for a in search.attempts)


def _tiny_model(input_shape, num_classes):
    import keras

    inputs = keras.Input(input_shape)
    x = keras.layers.Rescaling(1 / 255.0)(inputs)
    x = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(x)
    x = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes, activation="softmax",
                                                  dtype="float32")(x))


@pytest.mark.slow  # real train steps at each batch tried (14 s of CI's serial run)
def test_auto_batch_size_with_the_real_probe_and_an_injected_limit_finds_the_smaller_batch():
    """The limit lies between what batches 8 and 16 of a real train step need (their region
    peaks: what the process held before each does not count, as in MemoryLimit)."""
    import keras

    measured = {}

    def probe(batch):
        """The real probe, run once per batch: the search is handed the very peaks the limit
        was set from (a second run of batch 8 or 16 would cost a model build and two steps)."""
        if batch not in measured:
            measured[batch] = real_probe(batch)
        return measured[batch]

    real_probe = train_step_probe(_tiny_model, (32, 32, 3), 10, "float32")
    if not _allocator_reports():  # the process's peak: whichever batch runs first looks larger
        with pytest.raises(ConfigError, match="must have TF allocator statistics"):
            auto_batch_size(probe, limit=256, start=8, gpu=False, memory_limit_bytes=MIB)
        assert not measured  # refused before a trial ran
        return
    peak_8, peak_16 = probe(8).region_bytes, probe(16).region_bytes
    assert peak_8 < peak_16
    assert keras.mixed_precision.global_policy().name == "float32"  # restored
    limit = (peak_8 + peak_16) // 2
    choice = auto_batch_size(probe, limit=256, start=8, multiple_of=4, gpu=False,
                             memory_limit_bytes=limit)
    assert choice.search is not None
    assert choice.batch_size in (8, 12)  # 8 fits, 16 does not; 12 is decided by its peak
    assert choice.search.peak_bytes <= limit
    assert all((a.peak_bytes <= limit) == a.ok for a in choice.search.attempts)
    assert any(a.batch_size == choice.batch_size + 4 and not a.ok
               for a in choice.search.attempts)
    assert "injected limit" in choice.reason
    assert sorted(measured) == sorted({8, 16, *(a.batch_size for a in choice.search.attempts)})
    json.dumps(choice.to_json())


@pytest.mark.slow  # train steps under two policies
def test_train_step_probe_peak_is_lower_under_mixed_bfloat16_where_the_allocator_sees_it():
    """bfloat16 activations take half the bytes where bf16 is native (a GPU, AVX512_BF16/AMX):
    an allocator's peak shows it. Without native bf16, TF's CPU kernels hold float32 copies
    (measured on an AVX2-only CPU under the BFC and oneDNN allocators: mixed_bfloat16 peaks
    higher), so there is no saving to assert. The process's peak (no allocator statistics)
    cannot resolve a tiny model's activations and says so in one line rather than comparing
    noise. No region is ever negative."""
    import tensorflow as tf

    from ampflow.serving.cpu_features import BF16_CPU_FLAGS, read_cpu_flags

    peaks = {policy: train_step_probe(_tiny_model, (32, 32, 3), 10, policy)(16)
             for policy in ("float32", "mixed_bfloat16")}
    why = why_not_comparable(peaks["mixed_bfloat16"], peaks["float32"])
    assert all(peak.region_bytes >= 0 for peak in peaks.values())
    if _allocator_reports():
        assert why is None
        if tf.config.list_logical_devices("GPU") or read_cpu_flags() & BF16_CPU_FLAGS:
            assert peaks["mixed_bfloat16"].region_bytes < peaks["float32"].region_bytes
    else:
        assert {peak.source for peak in peaks.values()} == {"process_vmhwm_reset"}
        assert why.startswith("process_vmhwm_reset cannot compare two regions' tensors")
        assert "TF_CPU_ALLOCATOR_USE_BFC=true" in why and "\n" not in why


def test_why_not_comparable_needs_one_allocator_source():
    gpu = MemoryPeak(2, 1, "GPU:0", "gpu_allocator_peak", True)
    process = MemoryPeak(2, 1, "process", "process_vmhwm_reset", True)
    assert why_not_comparable(gpu, gpu) is None
    assert why_not_comparable(gpu, process) == ("the peaks were measured differently: "
                                                "gpu_allocator_peak vs process_vmhwm_reset")
    assert "cannot compare" in why_not_comparable(process, process)


def test_auto_batch_size_on_a_cpu_keeps_the_default_and_says_why():
    def never(batch: int) -> None:
        raise AssertionError("no search on a CPU")

    choice = auto_batch_size(never, limit=1000, gpu=False)
    assert choice.batch_size == CPU_AUTO_BATCH_SIZE and choice.search is None
    assert "no accelerator memory to fill" in choice.reason


def test_cpu_auto_batch_size_is_the_train_configs_default():
    from ampflow.components.train.config import TrainConfig

    default = {f.name: f.default for f in dataclasses.fields(TrainConfig)}["batch_size"]
    assert CPU_AUTO_BATCH_SIZE == default


def test_auto_batch_size_nothing_fits_is_a_config_error():
    with pytest.raises(ConfigError, match="found no batch that fits"):
        auto_batch_size(_fake_trial(0, []), limit=64, gpu=True)


# ---- the evaluate report ---------------------------------------------------------------------

def _scores(correct):
    from ampflow.components.evaluate_parity.parity import ModelScores

    labels = np.arange(len(correct)) % 3
    predicted = np.where(correct, labels, (labels + 1) % 3)
    return ModelScores(logits=np.eye(3, dtype=np.float32)[predicted], labels=labels)


def _report(amp_meta, base_meta):
    from ampflow.components.evaluate_parity import report
    from ampflow.components.evaluate_parity.training import training_metrics

    amp, base = _scores(np.array([1, 1, 0, 1], bool)), _scores(np.array([1, 0, 1, 1], bool))
    metrics = {"context": {"model_name": "m", "policy": "mixed_bfloat16",
                           "compute_dtype": "bfloat16", "split": "test"},
               "num_examples": 4, "amp_accuracy": amp.accuracy,
               "per_class_accuracy": {"amp": {"0": 1.0}},
               **training_metrics(amp, base, amp_meta, base_meta)}
    return metrics, report.render_markdown(metrics, {"passed": True, "checks": []})


def _meta(peak: int | None) -> dict:
    meta = {"epochs": [{"examples_per_sec": 100.0}, {"examples_per_sec": 110.0}]}
    if peak is not None:
        meta["memory"] = MemoryPeak(peak, 10 * MIB, "GPU:0", "gpu_allocator_peak",
                                    True).to_json()
    return meta


def test_report_shows_peak_memory_and_ratio_next_to_the_speedup():
    metrics, text = _report(_meta(9 * 2**30), _meta(16 * 2**30))
    assert metrics["train_peak_memory_ratio"] == pytest.approx(9 / 16)
    assert metrics["amp_train_peak_memory_bytes"] == 9 * 2**30
    assert "peak training memory: AMP 9,216 MiB (gpu_allocator_peak) vs float32 16,384 MiB" in text
    assert "0.56× float32 (-44%)" in text
    assert text.index("AMP training speedup") < text.index("peak training memory")
    assert "| train_peak_memory_ratio | 0.5625 |" in text


def test_report_leaves_memory_out_for_models_that_did_not_record_it():
    metrics, text = _report(_meta(None), _meta(None))
    assert not any("memory" in key for key in metrics)
    assert "memory" not in text
    assert "AMP training speedup" in text


def test_report_with_one_peak_only_shows_it_without_a_ratio():
    metrics, text = _report(_meta(9 * 2**30), {"epochs": [], "memory": {"peak_bytes": None}})
    assert "train_peak_memory_ratio" not in metrics
    assert "float32 not recorded" in text


def _overflowing_model(input_shape, num_classes):
    """A tiny model whose gradients overflow float16 at the first several loss scales: its
    backward multiplies by 1e4 (finite in float16), so a scaled gradient over 6.55 is inf: with
    the hidden gradients' largest |dL/dy| between 0.01 and 1, that takes 6 to 13 halvings."""
    import keras
    import tensorflow as tf

    class LoudGradient(keras.layers.Layer):
        def call(self, x):
            @tf.custom_gradient
            def identity(t):
                return tf.identity(t), lambda dy: dy * tf.constant(1e4, dy.dtype)

            return identity(x)

    inputs = keras.Input(shape=input_shape)
    x = keras.layers.Flatten()(keras.layers.Rescaling(1 / 255)(inputs))
    x = keras.layers.Dense(16)(LoudGradient()(keras.layers.Dense(16, activation="relu")(x)))
    return keras.Model(inputs, keras.layers.Dense(num_classes, activation="softmax",
                                                  dtype="float32")(x))


@pytest.mark.slow  # real train steps of a tiny model (6 s)
def test_train_step_probe_measures_an_applied_update_under_loss_scaling():
    """Loss scaling skips the first steps (no optimizer update: its temporaries would be
    missing from the peak), so the probe runs on until one update was applied (issue 37)."""
    probe = train_step_probe(_overflowing_model, (8, 8, 1), 10, "mixed_float16")
    probe(8)
    [run] = probe.runs
    assert run["batch"] == 8 and run["applied"] >= 1
    assert run["steps"] > 2  # the two steps of the old probe were both skipped
