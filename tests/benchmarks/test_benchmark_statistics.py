"""The statistics the performance benchmarks report: the loop-vs-fit interval, the JPEG folder."""

import math

import pytest
from benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def scaling():
    return load_benchmark("train_scaling")


def test_the_interval_is_around_the_geometric_mean_of_the_pairs(scaling):
    result = scaling._ratio_interval([0.5, 2.0, 1.0, 1.0])
    assert result["ratio"] == pytest.approx(1.0)
    low, high = result["ci95"]
    assert low < 1.0 < high
    assert low * high == pytest.approx(1.0)  # symmetric on the log scale


def test_identical_pairs_give_a_zero_width_interval(scaling):
    result = scaling._ratio_interval([1.1, 1.1, 1.1])
    assert result["ratio"] == pytest.approx(1.1)
    assert result["ci95"] == pytest.approx([1.1, 1.1])


def test_more_pairs_narrow_the_interval(scaling):
    few = scaling._ratio_interval([0.9, 1.1] * 2)["ci95"]
    many = scaling._ratio_interval([0.9, 1.1] * 20)["ci95"]
    assert many[1] - many[0] < few[1] - few[0]
    assert math.isclose(scaling._ratio_interval([1.3])["ratio"], 1.3)


def test_the_jpeg_folder_is_seeded_sized_and_classed(tmp_path):
    from PIL import Image

    bench = load_benchmark("input_pipeline")
    bench.make_image_folder(tmp_path / "a", 6, 3, seed=0)
    bench.make_image_folder(tmp_path / "b", 6, 3, seed=0)
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.jpg"))
    assert len(files) == 6 and {f.parent.name for f in files} == {"class_0", "class_1", "class_2"}
    for name in files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
        with Image.open(tmp_path / "a" / name) as image:
            assert image.format == "JPEG"
            assert all(300 <= side <= 500 for side in image.size)
