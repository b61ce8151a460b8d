"""report.md names the throughput in the data's unit: a text model's is not in images.

The real conversion's report (a text model's, converted with its defaults) is read by the
slow walk in tests/test_cli_step_by_step.py; this renders the table from report.json's shape.
"""

from __future__ import annotations

import pytest

from ampflow.components.convert_tflite.report import render_markdown


def _report(modality: str | None) -> dict:
    timing = {"latency_ms_median": 0.2, "latency_ms_p95": 0.3, "throughput_images_per_sec": 900.0}
    report = {"passed": True, "variants": {},
              "saved_model": {"saved_model_dir": "exports/ampflow/1", "size_bytes": 4096,
                              "accuracy": 0.9, "timing": timing},
              "config": {"batch_size": 32}, "edge_check": {"enabled": True},
              "environment": {"tensorflow": "2.21.0", "machine": "x86_64", "cpu_count": 2,
                              "num_threads": None, "delegate": "XNNPACK"}}
    return report if modality is None else {**report, "modality": modality}


@pytest.mark.parametrize("modality, rate, not_rate", [
    ("text", "texts/s (batch 32)", "img/s"),
    ("image", "img/s (batch 32)", "texts/s"),
    (None, "img/s (batch 32)", "texts/s"),  # a report.json written before it had a modality
])
def test_report_md_gives_throughput_in_the_datas_unit(modality, rate, not_rate):
    markdown = render_markdown(_report(modality))
    assert f"| {rate} |" in markdown and not_rate not in markdown
    assert "| 900 |" in markdown and "one image" not in markdown
