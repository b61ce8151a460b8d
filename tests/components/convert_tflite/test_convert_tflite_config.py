"""ConvertConfig validation and the `ampflow convert` command."""

import dataclasses

import pytest

# Imported here, not first under a capsys test: cliutil.print_summary binds sys.stdout as a
# default argument at import time (see the report), which a finished capsys would have closed.
import ampflow.cliutil  # noqa: F401
from ampflow.cli import build_parser, main
from ampflow.components.convert_tflite import ConvertConfig
from ampflow.errors import ConfigError

BASE = {"saved_model_dir": "m", "data_dir": "d", "output_dir": "o"}


@pytest.mark.parametrize(("overrides", "message"), [
    ({"variants": ("float32", "int4")}, "variants must be among"),
    ({"variants": ()}, "variants must name at least one of"),
    ({"variants": ("float16", "float16")}, "variants must not repeat"),
    ({"representative_size": 0},
     "representative_size must be > 0. Received: representative_size=0"),
    ({"latency_runs": -1}, "latency_runs must be > 0. Received: latency_runs=-1"),
    ({"test_limit": 0}, "test_limit must be > 0. Received: test_limit=0"),
    ({"warmup_runs": -1}, "warmup_runs must be >= 0. Received: warmup_runs=-1"),
    ({"full_int8_min_agreement": 1.5},
     "full_int8_min_agreement must be in [0, 1]. Received: full_int8_min_agreement=1.5"),
    ({"float32_max_accuracy_drop": -0.1}, "float32_max_accuracy_drop must be a finite number"),
    ({"edge_tolerance": float("nan")}, "edge_tolerance must be a finite number >= 0"),
])
def test_convert_config_invalid_value_raises_config_error(overrides, message):
    with pytest.raises(ConfigError) as info:
        ConvertConfig(**BASE, **overrides)
    assert message in str(info.value)


def test_convert_config_gates_for_each_variant_read_their_own_thresholds():
    config = ConvertConfig(**BASE, full_int8_max_accuracy_drop=2.5, float16_max_prob_diff=0.02)
    assert ("accuracy_drop_points", "<=", 2.5) in config.gates_for("full_int8")
    assert ("max_abs_prob_diff", "<=", 0.02) in config.gates_for("float16")
    assert [g[0] for g in config.gates_for("dynamic_range")] == ["agreement",
                                                                 "accuracy_drop_points"]


def test_convert_help_lists_every_option_with_its_default(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["convert", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for field in dataclasses.fields(ConvertConfig):
        assert "--" + field.name.replace("_", "-") in text
    assert "(default: 0.999)" in text and "(default: float32 float16 dynamic_range" in text


@pytest.mark.slow
def test_convert_cli_runs_a_variant_and_writes_it(float32_savedmodel, prepared_digits, tmp_path):
    code = main(["convert", "--saved-model-dir", str(float32_savedmodel), "--data-dir",
                 str(prepared_digits), "--output-dir", str(tmp_path / "o"), "--variants",
                 "dynamic_range", "--latency-runs", "5", "--no-edge-check"])
    assert code == 0
    assert (tmp_path / "o" / "dynamic_range.tflite").is_file()


def test_convert_cli_bad_flag_value_prints_one_line_and_exits_2(capsys):
    code = main(["convert", "--saved-model-dir", "m", "--data-dir", "d", "--output-dir", "o",
                 "--representative-size", "0"])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err == ("ampflow convert: error: --representative-size must be > 0. "
                   "Received: --representative-size=0")


@pytest.mark.parametrize(("n_images", "warmed"), [
    (70, [6, 32]),  # the last, shorter batch, then the first batch's shape the pass starts with
    (64, [32]),  # whole batches only: one shape
    (20, [20]),  # a single batch
])
def test_throughput_warms_each_batch_shape_up_not_a_whole_extra_pass(n_images, warmed):
    import numpy as np

    from ampflow.components.convert_tflite.checks import _time

    images = np.arange(n_images)
    calls = []
    timing = _time(lambda: None, lambda some: calls.append(len(some)), images,
                   runs=3, warmup=1, batch_size=32)
    assert calls == [*warmed, n_images]  # the warm-up, then one timed pass over every image
    assert timing.latency_runs == 3 and timing.throughput_images_per_sec > 0
