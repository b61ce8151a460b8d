"""TF Serving's `--monitoring_config_file` (issue 49): its Prometheus config read, not refused.

A `MonitoringConfig` with `prometheus_config` enabled asks for the metrics on the REST port,
which is `--metrics-port` equal to `--rest-api-port` here; disabled, no metrics; a path the REST
app does not serve, or a file that does not parse, is one line and exit 2.
"""

from __future__ import annotations

import pytest

from ampflow.cli import build_parser
from ampflow.serving.cli import main as serving_main
from ampflow.serving.cli import serve_config_from_args

UPSTREAM = 'prometheus_config: {\n  enable: true,\n  path: "/monitoring/prometheus/metrics"\n}\n'


def _config(*argv: str):
    return serve_config_from_args(build_parser().parse_args(
        ["serve", "--model-base-path", "b", *argv]))


def test_an_enabled_prometheus_config_is_the_metrics_on_the_rest_port(tmp_path):
    path = tmp_path / "monitoring_config.txt"
    path.write_text(UPSTREAM)  # testdata/monitoring_config.txt of TF Serving's tests
    tf_form = _config("--rest_api_port=8501", f"--monitoring_config_file={path}")
    assert tf_form == _config("--rest-api-port", "8501", "--metrics-port", "8501")
    assert tf_form.metrics_port == 8501


def test_a_disabled_prometheus_config_serves_no_metrics(tmp_path):
    path = tmp_path / "monitoring_config.txt"
    path.write_text("prometheus_config { enable: false }")
    assert _config("--rest_api_port=8501", f"--monitoring_config_file={path}").metrics_port == 0


@pytest.mark.parametrize("text, message", [
    ('prometheus_config { enable: true path: "/stats" }',
     "the metrics are served at /monitoring/prometheus/metrics and /metrics of the REST port. "
     "Received: path '/stats'"),
    ("improperly formatted file", "must be a MonitoringConfig text proto"),
])
def test_an_unusable_monitoring_config_is_one_line(text, message, tmp_path, capsys):
    path = tmp_path / "monitoring_config.txt"
    path.write_text(text)
    with pytest.raises(SystemExit) as exited:
        serving_main(["serve", "--model-base-path", "b", "--rest_api_port=8501",
                      f"--monitoring_config_file={path}"])
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def test_the_real_binarys_monitoring_file_reads_back_to_the_same_metrics_port(tmp_path):
    from ampflow.serving import tf_serving_binary as tfs

    config = _config("--host", "0.0.0.0", "--allow-reload-config", "--rest-api-port", "8601",
                     "--metrics-port", "8601")
    argv = tfs.build_argv(config, tmp_path / "work")
    assert any(a.startswith("--monitoring_config_file=") for a in argv)
    read = serve_config_from_args(build_parser().parse_args(
        ["serve", "--host", "0.0.0.0", "--allow-reload-config", *argv[1:]]))
    assert (read.metrics_port, read.rest_api_port) == (8601, 8601)
