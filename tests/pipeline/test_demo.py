"""`ampflow demo` end to end: pipeline, a separate `ampflow serve` process, gRPC, cleanup."""

import dataclasses

import pytest

from ampflow.pipeline.demo import DemoConfig, run_demo

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.serving]


def test_demo_twice_in_one_workdir_serves_the_newest_version_and_stops_its_server(
        tmp_path, capsys):
    # 2 epochs check the flow; AMP-vs-float32 accuracy still moves by points there, so the
    # training-parity thresholds are opened (their statistics: test_training_parity.py)
    config = DemoConfig(workdir=tmp_path, epochs=2, tflite_variants="float32", num_queries=2,
                        max_baseline_accuracy_drop=100.0, baseline_alpha=1e-300)
    first = run_demo(config)
    # the second run checks versioning only: without the baseline branch it trains once
    second = run_demo(dataclasses.replace(config, with_float32_baseline=False))

    assert first["version"] == 1 and second["version"] == 2  # each run is a new served version
    assert second["served_accuracy"] > 0.5 and second["served_examples"] == 359
    assert sorted(p.name for p in (tmp_path / "serving" / "ampflow").iterdir()) == ["1", "2"]
    out = capsys.readouterr().out
    assert "--precision auto would pick" in out
    assert out.count("server stopped (exit code 0)") == 2
    assert "serving.grpc_accuracy" in out
    # the AMP-vs-float32 trained accuracy and the AMP training speedup: in the first run's key
    # metrics and in its results table
    assert out.count("parity.amp_vs_float32_trained") == 2
    assert out.count("parity.amp_training_speedup") == 2
