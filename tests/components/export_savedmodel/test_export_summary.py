"""`ampflow export`'s closing summary, for each modality's parity block.

The summary runs after the version is published: a key only one modality's parity block has
made `ampflow export` on a text model publish, then end in `KeyError: 'num_images'` and a
traceback (issue 46). The walk in tests/test_cli_step_by_step.py runs the real command
(slow); this checks the summary on both real parity blocks in the fast tier.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest

from ampflow.components.export_savedmodel.cli import _summary
from ampflow.components.export_savedmodel.parity import ParityReport
from ampflow.components.export_savedmodel.text_parity import TextParityReport


def _result(modality: str, report_cls, count_field: str, count: int):
    """A result as run_export returns it, its parity block the report class's own."""
    values = {f.name: 0 for f in dataclasses.fields(report_cls)}
    parity = report_cls(**{**values, count_field: count, "max_abs_diff": 1.5e-7})
    meta = {"modality": modality, "parity": parity.as_metadata(),
            "source": {"trained_policy": "mixed_float16"}, "warmup": {"records": 4},
            "gate": {"warning": ""}}
    return SimpleNamespace(metadata=meta, model_name="ampflow", version=1,
                           version_dir=Path("exports/ampflow/1"),
                           model_base=Path("exports/ampflow"), forced=False)


@pytest.mark.parametrize("modality, report_cls, field, words", [
    ("text", TextParityReport, "num_texts", "on 90 texts"),
    ("image", ParityReport, "num_images", "on 90 images"),
])
def test_export_summary_counts_the_parity_examples_in_the_datas_unit(modality, report_cls,
                                                                     field, words):
    summary = _summary(_result(modality, report_cls, field, 90))
    assert summary["export_parity"] == f"max |SavedModel - Keras| = 1.5e-07 {words}"
    assert summary["model"] == "ampflow version 1" and summary["gate"] == "passed"
