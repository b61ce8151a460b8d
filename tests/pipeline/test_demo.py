"""`ampflow demo` end to end: pipeline, a separate `ampflow serve` process, gRPC, cleanup."""

import pytest

from ampflow.pipeline.demo import DemoConfig, run_demo

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.serving]


def test_demo_twice_in_one_workdir_serves_the_newest_version_and_stops_its_server(
        tmp_path, capsys):
    config = DemoConfig(workdir=tmp_path, epochs=2, tflite_variants="float32", num_queries=2)
    first = run_demo(config)
    second = run_demo(config)

    assert first["version"] == 1 and second["version"] == 2  # each run is a new served version
    assert second["served_accuracy"] > 0.5 and second["served_examples"] == 359
    assert sorted(p.name for p in (tmp_path / "serving" / "ampflow").iterdir()) == ["1", "2"]
    out = capsys.readouterr().out
    assert "--precision auto would pick" in out
    assert out.count("server stopped (exit code 0)") == 2
    assert "serving.grpc_accuracy" in out
