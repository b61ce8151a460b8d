"""TF Serving's `--monitoring_config_file`: Prometheus metrics on the REST port, as it reads it.

The file is a `MonitoringConfig` text proto (tensorflow_serving/config/monitoring_config.proto:
`prometheus_config { enable: true path: "/monitoring/prometheus/metrics" }`); with `enable`,
TF Serving serves the metrics on its REST port at `path`. `ampflow serve` does the same thing
with `--metrics-port` equal to `--rest-api-port`, at `/monitoring/prometheus/metrics` (TF
Serving's default path) and `/metrics`; another path is refused in one line. The proto is not
in the `tensorflow-serving-api` package, so its two messages are declared here from the
upstream .proto (field names and numbers) and the file parsed by protobuf's own text parser.
"""

from __future__ import annotations

import functools
from pathlib import Path

from ampflow.errors import ConfigError

METRICS_PATHS = ("/monitoring/prometheus/metrics", "/metrics")  # what the REST app serves


@functools.cache
def _monitoring_config_class():
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    file = descriptor_pb2.FileDescriptorProto(
        name="ampflow/monitoring_config.proto", package="tensorflow.serving", syntax="proto3")
    prometheus = file.message_type.add(name="PrometheusConfig")
    prometheus.field.add(name="enable", number=1, type=8, label=1)  # bool
    prometheus.field.add(name="path", number=2, type=9, label=1)  # string
    config = file.message_type.add(name="MonitoringConfig")
    config.field.add(name="prometheus_config", number=1, type=11, label=1,
                     type_name=".tensorflow.serving.PrometheusConfig")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName("tensorflow.serving.MonitoringConfig"))


def metrics_on_rest_port(path: str | Path) -> bool:
    """Whether the file asks for Prometheus metrics (on the REST port); ConfigError if unusable."""
    from google.protobuf import text_format

    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError(f"--monitoring_config_file must be a readable file. Received: {path} "
                          f"({e.strerror})") from e
    config = _monitoring_config_class()()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as e:
        raise ConfigError(f"--monitoring_config_file must be a MonitoringConfig text proto. "
                          f"Received: {path} ({e})") from e
    prometheus = config.prometheus_config
    if prometheus.enable and prometheus.path and prometheus.path not in METRICS_PATHS:
        raise ConfigError(f"--monitoring_config_file: the metrics are served at "
                          f"{' and '.join(METRICS_PATHS)} of the REST port. Received: path "
                          f"{prometheus.path!r} in {path}")
    return bool(prometheus.enable)
