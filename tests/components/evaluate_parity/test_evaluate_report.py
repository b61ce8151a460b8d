"""The evaluation's plots say what they show: honest axes, legends off the data, every matrix drawn.

Checked on the figures themselves (matplotlib objects, Agg backend), not on pixels.
"""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import pytest

from ampflow.components.evaluate_parity import report
from ampflow.components.evaluate_parity.config import EvaluateConfig

NAMES = [str(i) for i in range(10)]


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    report._pyplot().close("all")


def _history():
    rows, scale, skipped = [], 2.0 ** 15, 0
    for step in range(0, 400, 10):
        if step in (50, 120, 300):
            scale, skipped = scale / 2, skipped + 1
        elif step % 100 == 0:
            scale *= 2
        rows.append({"step": step, "loss_scale": scale, "skipped_steps": skipped, "loss": 1.0})
    return rows


def _extents(fig):
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    return renderer


def test_loss_scale_legend_lies_outside_the_plotting_area():
    fig = report.loss_scale_figure(_history(), "mixed_float16")
    renderer = _extents(fig)
    legends = fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    assert len(legends) == 1  # one legend names both lines
    texts = [t.get_text() for t in legends[0].get_texts()]
    assert texts == ["loss scale", "skipped steps (cumulative)"]
    legend_box = legends[0].get_window_extent(renderer)
    for ax in fig.axes:  # the loss-scale axes and its twin share one plotting area
        assert not legend_box.overlaps(ax.get_window_extent(renderer)), ax.get_ylabel()


def test_per_class_accuracy_axis_starts_at_zero_and_differences_get_their_own_scale():
    amp = np.linspace(0.9, 0.99, 10)
    twin = amp.copy()
    twin[3] += 0.03
    fig = report.per_class_figure(NAMES, {"amp": amp, "fp32_twin": twin})
    accuracy_ax, diff_ax = fig.axes
    assert accuracy_ax.get_ylim() == (0.0, 1.0)
    heights = [round(p.get_height(), 6) for p in diff_ax.patches]
    assert heights == [0.0] * 3 + [-3.0] + [0.0] * 6  # AMP minus twin, in points
    assert diff_ax.get_ylim()[0] <= -3.0 <= diff_ax.get_ylim()[1]
    renderer = _extents(fig)
    (legend,) = fig.legends
    for ax in fig.axes:
        assert not legend.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))


def test_confusion_matrix_image_shows_the_amp_matrix_and_outlines_twin_differences(tmp_path):
    matrix = np.diag(np.arange(30, 40))
    matrix[3, 5] = 2
    twin = matrix.copy()
    twin[3, 5], twin[3, 3] = 1, twin[3, 3] + 1
    fig = report.confusion_figure(NAMES, matrix, twin)
    (ax, _colorbar) = fig.axes
    np.testing.assert_array_equal(ax.images[0].get_array(), matrix)
    outlined = sorted((int(p.get_x() + 0.5), int(p.get_y() + 0.5)) for p in ax.patches)
    assert outlined == [(3, 3), (5, 3)]  # (column, row) of the two cells that differ
    assert "2 cells differ" in ax.get_title()
    path = report.plot_confusion_matrix(tmp_path / report.CONFUSION_PNG, NAMES, matrix, twin)
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_report_markdown_links_every_plot():
    metrics = {"context": {"model_name": "m", "policy": "mixed_float16",
                           "compute_dtype": "float16", "split": "test"},
               "num_examples": 3, "per_class_accuracy": {"amp": {"0": 1.0}}}
    text = report.render_markdown(metrics, {"passed": True, "checks": []})
    for png in (report.PER_CLASS_PNG, report.CONFUSION_PNG, report.LOGIT_DIFF_PNG,
                report.LOSS_SCALE_PNG):
        assert f"({png})" in text


def test_evaluate_component_defaults_are_the_config_defaults():
    from ampflow.components.evaluate_parity.component import evaluate_parity

    component = inspect.signature(evaluate_parity).parameters
    config = {f.name: f.default for f in dataclasses.fields(EvaluateConfig)}
    for name in ("max_accuracy_drop", "min_agreement", "max_baseline_accuracy_drop",
                 "baseline_alpha"):
        assert component[name].default == config[name], name
