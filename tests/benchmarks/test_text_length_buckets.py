"""benchmarks/text_length_buckets.py's report: the ratio and spread it prints are its runs'."""

from benchmark_scripts import load_benchmark

bench = load_benchmark("text_length_buckets")


def _run(model, padding, texts_per_s, accuracy=0.7, seconds=10.0):
    return {"model": model, "padding": padding, "texts_per_s_last_epoch": texts_per_s,
            "val_accuracy": accuracy, "train_seconds": seconds, "epochs": 1}


def _report(**parts):
    return {"dataset": "d", "max_sequence_length": 128, "batch_size": 32,
            "precision": "float32", "load_before": [1.0, 1.0, 1.0],
            "host": {"capabilities": {"model_name": "cpu"}, "cpu_count": 2,
                     "cpu_flags": ["avx2"], "tensorflow": "2.x"},
            "training": [], "accuracy": [], "xla_compile": None, "serving": [], **parts}


def test_a_report_cut_short_still_renders():
    text = "\n".join(bench.markdown(_report()))
    assert "## Training" in text and "XLA: 0 shapes" in text
    one_run = bench.markdown(_report(accuracy=[_run("bert_tiny", "buckets", 0, 0.7)]))
    assert "| bert_tiny | 1 | 70.0 % ± 0.0 (n=1) | – | 10 / – |" in one_run


def test_the_training_ratio_is_the_medians_and_accuracy_the_seeds_mean_and_sd():
    lines = bench.markdown(_report(
        training=[_run("bert_tiny", "buckets", 300.0), _run("bert_tiny", "max_length", 100.0),
                  _run("bert_tiny", "buckets", 200.0), _run("bert_tiny", "max_length", 80.0),
                  _run("bert_tiny", "buckets", 250.0), _run("bert_tiny", "max_length", 90.0)],
        accuracy=[_run("bert_tiny", "buckets", 0, 0.74), _run("bert_tiny", "max_length", 0, 0.75),
                  _run("bert_tiny", "buckets", 0, 0.76), _run("bert_tiny", "max_length", 0, 0.75)]))
    assert "| bert_tiny | 250.0 | 90.0 | 2.78× |" in lines
    row = next(line for line in lines if line.startswith("| bert_tiny | 1 |"))
    assert "75.0 % ± 1.4 (n=2)" in row and "75.0 % ± 0.0 (n=2)" in row


def test_the_caps_ratio_is_buckets_at_the_cap_over_the_small_cap_medians():
    def cap_run(padding, cap, texts_per_s):
        return {**_run("bert_small", padding, texts_per_s), "cap": cap}

    lines = bench.markdown(_report(caps=[
        cap_run("buckets", 128, 500.0), cap_run("max_length", 32, 600.0),
        cap_run("buckets", 128, 540.0), cap_run("max_length", 32, 640.0),
        cap_run("buckets", 128, 520.0), cap_run("max_length", 32, 650.0)]))
    assert "| bert_small | 128 | 520.0 | 32 | 640.0 | 0.81× |" in lines
    assert not any("cap's cost" in line for line in bench.markdown(_report()))


def test_the_grpc_row_is_its_calls_percentiles_ratio_and_answer_agreement():
    import numpy as np

    grpc = load_benchmark("text_buckets_grpc")
    seconds = {"buckets": [0.010] * 49 + [0.050], "max_length": [0.040] * 50}
    p = np.array([[0.6, 0.4], [0.3, 0.7]])
    answers = {"buckets": [p, p], "max_length": [p, p[::-1]]}  # 2 of 4 classes differ
    row = grpc.row_of("bert_tiny", "32", 32, seconds, answers)
    assert row["buckets"] == {"p50_ms": 10.0, "p99_ms": 50.0, "texts_per_s": 2963.0}
    assert row["max_length"]["texts_per_s"] == 800.0 and row["speedup"] == 3.7
    assert row["same_classes"] == 0.5 and row["answers_compared"] == 4
    assert row["max_abs_diff"] == 0.3 and row["calls_per_arm"] == 50
    lines = bench.markdown(_report(grpc=[row]))
    assert ("| bert_tiny | 32 snippets | 10.0 / 50.0 | 2963.0 | 40.0 / 40.0 | 800.0 | 3.7× | "
            "50.0 % of 4 | 3.0e-01 | 50 |") in lines
    assert not any("over gRPC" in line for line in bench.markdown(_report()))


def test_grpc_requests_are_real_snippets_and_the_mixed_one_leads_with_a_long_text():
    grpc = load_benchmark("text_buckets_grpc")
    texts = [f"snippet {i}" for i in range(70)]
    assert grpc.requests_of(texts, "1", 3) == [[b"snippet 0"], [b"snippet 1"], [b"snippet 2"]]
    short = grpc.requests_of(texts, "32", 5)
    assert [len(r) for r in short] == [32, 32] and short[1][0] == b"snippet 32"
    mixed = grpc.requests_of(texts, "1_long_31", 5)
    assert mixed[0][0] == b" ".join(t.encode() for t in texts[:8]) and mixed[0][1:] == short[0][1:]
