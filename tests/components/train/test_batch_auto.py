"""`train --batch-size auto` and the peak training memory in metadata.json (memory.py wired)."""

import dataclasses

import pytest

from ampflow.components.train import TrainConfig, run_train
from ampflow.components.train.run.memory import PeakMemory
from ampflow.errors import ConfigError


def _allocator_reports() -> bool:
    """Whether TF's allocator keeps statistics here (memory.NO_CPU_STATS_HINT says where)."""
    try:
        PeakMemory(source="allocator").start().stop()
    except ConfigError:
        return False
    return True


@pytest.mark.slow
def test_batch_size_auto_under_injected_limit_picks_the_largest_batch_whose_peak_fits(
        tmp_path, prepared_digits):
    from ampflow.components.train.run.memory import train_step_probe
    from ampflow.data import load_dataset_info
    from ampflow.modeling.models import build_model

    config = TrainConfig(data_dir=prepared_digits, output_dir=tmp_path / "m",
                         precision="float32", batch_size="auto", epochs=1, steps_per_epoch=2)
    if not _allocator_reports():  # an AVX2-only CPU: the process's peak cannot rank batches
        with pytest.raises(ConfigError, match="must have TF allocator statistics.*"
                                              "TF_CPU_ALLOCATOR_USE_BFC=true"):
            run_train(dataclasses.replace(config, auto_batch_memory_limit_mb=64))
        return
    info = load_dataset_info(prepared_digits)
    probe = train_step_probe(lambda shape, n: build_model("small_cnn", shape, n),
                             tuple(info["image_shape"]), info["num_classes"], "float32")
    # The search starts at 32 and doubles: a limit between 32's and 128's peaks refuses 64 or
    # 128 and leaves a bisection of a few trials (one near 1024 took a dozen).
    small, large = probe(32).region_bytes, probe(128).region_bytes  # whatever else is held
    assert large > small  # activations grow with the batch: what the search relies on
    limit_mb = max(1, int((small + large) / 2 / 2**20))  # some batch fits, 128 does not
    result = run_train(dataclasses.replace(config, auto_batch_memory_limit_mb=limit_mb))
    meta = result.metadata
    chosen = meta["batch_size_auto"]["batch_size"]
    attempts = meta["batch_size_auto"]["search"]["attempts"]
    assert meta["config"]["batch_size"] == chosen == meta["distribution"]["global_batch_size"]
    fitted = [a for a in attempts if a["ok"]]
    refused = [a for a in attempts if not a["ok"]]
    assert refused, attempts  # the limit stopped the search, not the split size
    assert chosen == max(a["batch_size"] for a in fitted)
    assert all(a["peak_bytes"] <= limit_mb * 2**20 for a in fitted)
    assert all(a["batch_size"] > chosen for a in refused)
    assert meta["memory"]["peak_bytes"] > 0 and meta["memory"]["source"]


def test_batch_size_auto_on_a_cpu_keeps_32_and_says_why(tmp_path, prepared_digits):
    result = run_train(TrainConfig(data_dir=prepared_digits, output_dir=tmp_path / "m",
                                   precision="float32", batch_size="auto", epochs=1,
                                   steps_per_epoch=1))
    auto = result.metadata["batch_size_auto"]
    assert auto["batch_size"] == 32 and "no accelerator memory" in auto["reason"]
    assert auto["search"] is None


@pytest.mark.parametrize("overrides, message", [
    ({"batch_size": "big"}, "batch_size must be a positive integer or 'auto'"),
    ({"batch_size": "0"}, "batch_size must be > 0"),
    ({"batch_size": "auto", "workers": 2}, "pass a number with --workers > 1"),
    ({"batch_size": "auto", "auto_batch_memory_limit_mb": 0}, "must be > 0"),
])
def test_batch_size_bad_values_are_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig(data_dir="d", output_dir="o", **overrides)


def test_batch_size_from_the_cli_is_an_int_or_auto():
    assert TrainConfig(data_dir="d", output_dir="o", batch_size="64").batch_size == 64
    assert TrainConfig(data_dir="d", output_dir="o", batch_size="AUTO").batch_size == "auto"
