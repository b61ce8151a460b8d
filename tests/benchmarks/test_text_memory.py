"""The BERT memory benchmark's arithmetic: the fit, the batch that fits, accumulation, params."""


import pytest
from benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("text_memory")


def test_the_fit_leaves_out_the_update_bound_floor(bench):
    # flat at 500 while the optimizer's update sets the peak, then 300 + 40 per example
    points = [(1, 500.0), (2, 500.0), (4, 500.0), (8, 620.0), (16, 940.0), (32, 1580.0)]
    fit = bench.split_fit(points)
    assert fit["per_example"] == pytest.approx(40.0)
    assert fit["fixed"] == pytest.approx(300.0)
    assert fit["first_on_line"] == 3 and fit["floor"] == 500.0


def test_a_straight_line_uses_every_point(bench):
    fit = bench.split_fit([(1, 110.0), (2, 120.0), (3, 130.0)])
    assert fit["first_on_line"] == 0 and fit["floor"] is None
    assert fit["per_example"] == pytest.approx(10.0)
    assert max(abs(r) for r in fit["residuals"]) == pytest.approx(0.0, abs=1e-9)


def test_the_batch_that_fits_stays_under_the_limit(bench):
    fixed, per_example, limit = 1.7e9, 0.43e9, 16 * 2**30
    fits = bench.fits_under(limit, fixed, per_example)
    assert fixed + per_example * fits <= limit < fixed + per_example * (fits + 1)
    assert bench.fits_under(1e9, 2e9, 1e8) == 0  # the weights alone do not fit


@pytest.mark.parametrize(("fits", "micro", "steps"),
                         [(64, 64, 1), (100, 64, 1), (37, 32, 2), (20, 16, 4), (1, 1, 64),
                          (0, 0, None)])
def test_accumulation_takes_the_largest_micro_batch_that_divides_the_effective_one(
        bench, fits, micro, steps):
    assert bench.accumulation(64, fits) == {"micro_batch": micro, "accumulation_steps": steps}


def test_the_counted_parameters_are_the_built_models(bench):
    from ampflow.modeling.text_models import bert_builder

    model = bert_builder("bert_tiny")(16, 500, bench.NUM_CLASSES)
    assert bench.parameter_count("bert_tiny", 16, 500) == model.count_params()
