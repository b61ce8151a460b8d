"""benchmarks/step_profile.py: the op groups, the ceiling's shapes and arithmetic, the report.

The numbers it measures are the machine's; what is tested is what it does with them on every
machine: which group an op belongs to, how many FLOPs a model's own ops hold, the ratio as a
fraction of the ceiling and who holds the gap, and that an op a dtype cannot run (a host
without bf16 kernels) is recorded, not fatal.
"""

import json
import sys

import pytest
from benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def report_mod():
    return load_benchmark("step_profile_report")


@pytest.fixture(scope="module")
def ceiling_mod():
    return load_benchmark("op_ceiling")


@pytest.fixture(scope="module")
def profile_mod():
    return load_benchmark("step_profile")


@pytest.mark.parametrize(("name", "group"), [
    ("gradient_tape/resnet50_1/conv2_block1_1_conv_1/convolution/Conv2DBackpropFilter:"
     "_MklNativeConv2DBackpropFilterWithBias", "convolutions/matmuls"),
    ("bert_tiny_1/encoder_0_attention_1/query_1/MatMul:_MklBatchMatMulV2",
     "convolutions/matmuls"),
    ("gradient_tape/x/conv1_bn_1/FusedBatchNormGradV3:_MklNativeFusedBatchNormGradV3",
     "BatchNorm/LayerNorm"),
    ("gradient_tape/bert_tiny_1/encoder_0_output_norm_1/moments/Mul:Mul", "BatchNorm/LayerNorm"),
    ("gradient_tape/bert_tiny_1/encoder_0_output_norm_1/moments/GatherV2:GatherV2",
     "BatchNorm/LayerNorm"),
    ("gradient_tape/bert_tiny_1/encoder_0_attention_1/softmax_float32_1/mul:Mul", "softmax"),
    ("bert_tiny_1/probabilities_1/Softmax:_MklSoftmax", "softmax"),
    ("bert_tiny_1/encoder_0_output_norm_1/Cast:Cast", "casts"),
    ("bert_tiny_1/encoder_1_attention_1/transpose_3:_MklTranspose", "layout reorders"),
    ("adam_1/UnsortedSegmentSum:UnsortedSegmentSum", "embedding"),
    ("bert_tiny_1/token_and_position_embedding_1/token_embedding_1/GatherV2:GatherV2",
     "embedding"),
    ("adam_1/Sub_3:Sub", "optimizer"),
    ("adam/AssignAddVariableOp_1:AssignAddVariableOp", "optimizer"),
    ("sgd/ResourceApplyKerasMomentum:ResourceApplyKerasMomentum", "optimizer"),
    ("gradient_tape/resnet50_1/conv1_relu_1/ReluGrad:ReluGrad", "element-wise"),
    ("gradient_tape/resnet50_1/pool1_pool_1/MaxPoolGrad:_MklNativeMaxPoolGrad", "other"),
])
def test_each_op_falls_in_its_group(report_mod, name, group):
    assert report_mod.op_group(name) == group


def test_groups_sum_the_ops_and_name_every_group(report_mod):
    groups = report_mod.group_ops({"a/Conv2D:_MklNativeFusedConv2D": 3.0, "b/Cast:Cast": 1.0,
                                   "c/MatMul:MatMul": 2.0})
    assert list(groups) == list(report_mod.GROUPS)
    assert groups["convolutions/matmuls"] == 5.0 and groups["casts"] == 1.0
    assert groups["optimizer"] == 0.0


def test_an_image_models_convs_are_counted_by_shape(ceiling_mod):
    import keras

    inputs = keras.Input((9, 9, 3))
    x = keras.layers.Conv2D(4, 3, strides=2, padding="same")(inputs)  # 9 -> 5 (SAME, /2)
    x = keras.layers.Conv2D(4, 3, padding="same")(x)
    x = keras.layers.Conv2D(4, 3, padding="same")(x)  # the same shape again: count 2
    outputs = keras.layers.Dense(2)(keras.layers.Flatten()(x))
    ops = ceiling_mod.image_op_shapes(keras.Model(inputs, outputs), batch=8)
    by_label = {op.label: op for op in ops}
    strided = by_label["conv 3x3/2 8x9x9x3->4"]
    assert strided.count == 1
    assert strided.gflop == pytest.approx(3 * 2 * 8 * 5 * 5 * 4 * 9 * 3 / 1e9)
    assert by_label["conv 3x3/1 8x5x5x4->4"].count == 2
    assert by_label["matmul 8x100 @ 100x2"].gflop == pytest.approx(3 * 2 * 8 * 100 * 2 / 1e9)


def test_an_encoders_matmuls_hold_its_training_flops(ceiling_mod):
    layers, hidden, heads, seq, batch = 4, 512, 8, 128, 32
    ops = ceiling_mod.encoder_op_shapes(layers, hidden, heads, 4 * hidden, seq, batch)
    total = sum(op.count * op.gflop for op in ops)
    per_layer_forward = 2 * seq * (4 * hidden * hidden + 2 * hidden * 4 * hidden) \
        + 2 * 2 * seq * seq * hidden
    expected = 3 * (layers * per_layer_forward * batch + 2 * batch * hidden * hidden) / 1e9
    assert total == pytest.approx(expected)
    softmax = [op for op in ops if op.kind == "softmax"]
    assert softmax[0].count == layers and softmax[0].gflop == 0


def test_an_op_a_dtype_cannot_run_is_recorded_not_fatal(ceiling_mod):
    good = ceiling_mod.OpShape("matmul", "matmul 8x8 @ 8x8", 2, 3 * 2 * 8**3 / 1e9, (8, 8, 8))
    bad = ceiling_mod.OpShape("conv", "impossible", 1, 1.0,
                              ((1, 4, 4, 3), (3, 3, 5, 2), (1, 1), "SAME"))  # 3 != 5 channels
    rows = ceiling_mod.measure([good, bad], rounds=1, min_seconds=0.0)
    assert rows[0]["float32"]["ms"] > 0 and rows[0]["bf16_speedup"] > 0
    assert "error" in rows[1]["float32"] and rows[1]["bf16_speedup"] is None
    summary = ceiling_mod.ceiling(rows)
    assert summary["ops_measured"] == 1 and summary["ops_failed"] == 1
    assert summary["ratio"] == pytest.approx(rows[0]["bf16_speedup"])  # one op, one round
    assert summary["rounds_ratio"] == [summary["ratio"]]


def _report(bf16_hardware=True):
    f32 = {"convolutions/matmuls": 600.0, "BatchNorm/LayerNorm": 100.0, "casts": 0.0,
           "element-wise": 100.0}
    b16 = {"convolutions/matmuls": 200.0, "BatchNorm/LayerNorm": 100.0, "casts": 50.0,
           "element-wise": 50.0}
    groups = {}
    for name, values in (("float32", f32), ("mixed_bfloat16", b16)):
        groups[name] = {"groups_ms": {g: values.get(g, 0.0) for g in GROUPS}}
    return {
        "cpu": {"bf16_hardware": bf16_hardware, "onednn_isa": "AVX2"},
        "ceiling": {"ratio": 4.0, "rounds_ratio": [4.0, 2.5],
                    "ms_per_step": {"float32": 400.0, "bfloat16": 100.0}},
        "step": {"float32": {"step_ms": 800.0},
                 "mixed_bfloat16": {"step_ms": 400.0, "ratio_vs_float32": 2.0,
                                    "rounds_ratio_vs_float32": [2.0, 2.0]}},
        "profiles": groups,
    }


GROUPS = ("convolutions/matmuls", "BatchNorm/LayerNorm", "softmax", "casts", "layout reorders",
          "element-wise", "embedding", "optimizer", "other")


def test_the_ratio_is_a_fraction_of_the_ceiling_and_the_gap_is_shared_out(report_mod):
    assert report_mod.GROUPS == GROUPS
    report = _report()
    summary = report_mod.summarize(report)
    assert summary["fraction_of_ceiling"] == pytest.approx(0.5)
    # round by round: each round's step ratio over the same round's ceiling
    assert summary["rounds_fraction_of_ceiling"] == pytest.approx([0.5, 0.8])
    gap = summary["gap_ms"]
    # each group: its bf16 time - its float32 time / 4
    assert gap["convolutions/matmuls"] == pytest.approx(200 - 150)
    assert gap["BatchNorm/LayerNorm"] == pytest.approx(100 - 25)
    assert gap["casts"] == pytest.approx(50)
    # the gaps add up to the bf16 op time minus the float32 op time at the ceiling
    assert sum(gap.values()) == pytest.approx(400 - 800 / 4)
    assert sum(summary["gap_share"].values()) == pytest.approx(1.0)
    assert report["step"]["mixed_bfloat16"]["ceiling_ops_fraction_of_step"] == 0.25
    assert "note" not in summary


def test_a_host_without_bf16_says_why(report_mod):
    summary = report_mod.summarize(_report(bf16_hardware=False))
    assert "no AVX512_BF16/AMX" in summary["note"] and "AVX2" in summary["note"]


def test_onednn_verbose_counts_only_the_timed_steps(profile_mod):
    stdout = "\n".join([
        "onednn_verbose,v1,primitive,exec,cpu,convolution,brg,forward,src:bf16,,mb32,50.0",
        profile_mod.MARK,
        "onednn_verbose,v1,primitive,exec,cpu,convolution,brg:avx512_core_amx,forward,x,,mb32,4.0",
        "onednn_verbose,v1,primitive,exec,cpu,reorder,jit:uni,undef,src:f32,,2x3,1.0",
        "onednn_verbose,v1,primitive,create:cache_miss,cpu,reorder,jit:uni,undef,x,,2x3,9.0",
        "some other line",
        "onednn_verbose,v1,primitive,exec,cpu,reorder,jit:uni,undef,src:f32,,2x3,3.0",
    ])
    assert profile_mod.parse_onednn_verbose(stdout, steps=2) == {"convolution": 2.0,
                                                                "reorder": 2.0}


def test_train_throughput_profile_runs_step_profile(monkeypatch):
    bench = load_benchmark("train_throughput")
    seen = {}
    step_profile = load_benchmark("step_profile")
    monkeypatch.setattr(step_profile, "main", lambda argv: seen.setdefault("argv", argv) and 0)
    # main is replaced: nothing is built, so any model name is only passed on
    monkeypatch.setattr(sys, "argv", ["train_throughput.py", "--profile", "--model", "small_cnn",
                                      "--image-size", "96", "--tag", "x"])
    assert bench.main() == 0
    argv = seen["argv"]
    assert argv[argv.index("--model") + 1] == "small_cnn"
    assert argv[argv.index("--image-size") + 1] == "96"
    assert "--policies" not in argv  # step_profile's default: float16 only where native


def test_onednn_isa_is_read_from_a_fresh_processs_verbose_header(profile_mod, monkeypatch):
    """oneDNN prints its ISA once, at its first primitive, when ONEDNN_VERBOSE is set before
    TensorFlow loads: so a throwaway process (the smoke run below records what this returns)."""
    import subprocess

    bench_host, seen = profile_mod.bench_host, {}

    def fake_run(argv, **kwargs):
        seen.update(argv=argv, env=kwargs["env"])
        return subprocess.CompletedProcess(argv, 0, stdout=(
            "onednn_verbose,v1,info,oneDNN v3.2.0\n"
            "onednn_verbose,v1,info,cpu,isa:Intel AVX-512 with AVX512BW, AVX512VL, and "
            "AVX512DQ extensions\nonednn_verbose,v1,primitive,exec,cpu,convolution,x\n"), stderr="")

    monkeypatch.setattr(bench_host.subprocess, "run", fake_run)
    assert bench_host.onednn_isa() == ("Intel AVX-512 with AVX512BW, AVX512VL, and AVX512DQ "
                                       "extensions")
    assert seen["argv"][0] == sys.executable and "tf.nn.conv2d" in seen["argv"][-1]
    assert seen["env"]["ONEDNN_VERBOSE"] == "1"

    def timed_out(argv, **kwargs):
        raise subprocess.TimeoutExpired(argv, kwargs["timeout"])

    monkeypatch.setattr(bench_host.subprocess, "run", timed_out)
    assert bench_host.onednn_isa() is None


@pytest.mark.slow  # TF start-up, a small CNN traced twice, the profiler
def test_a_smoke_run_writes_its_tables(profile_mod, prepared_digits, tmp_path, monkeypatch):
    # the ISA probe is a fresh TensorFlow process (5-9 CPU-s) whose answer is this host's fact,
    # not the tables': its reading is the test above's; here, that the report records it
    monkeypatch.setattr(profile_mod.bench_host, "onednn_isa", lambda: "the probe's ISA")
    assert profile_mod.main(["--model", "small_cnn", "--image-size", "16", "--batch-size", "8",
                             "--smoke", "--no-onednn-verbose", "--data-dir",
                             str(prepared_digits), "--out", str(tmp_path)]) == 0
    (written,) = tmp_path.glob("train_step_profile_small_cnn_16_*.json")
    report = json.loads(written.read_text())
    assert set(report["step"]) >= {"float32", "mixed_bfloat16"}
    assert report["ceiling"]["ops_measured"] == 5  # 3 convs, 2 dense
    assert report["git"]["commit"] and report["load_average"]["start"]
    assert report["cpu"]["onednn_isa"] == "the probe's ISA"
    for policy in ("float32", "mixed_bfloat16"):
        assert report["profiles"][policy]["groups_ms"]["convolutions/matmuls"] > 0
    text = written.with_suffix(".md").read_text()
    assert "fraction of ceiling" in text and "mixed_float16" in text
