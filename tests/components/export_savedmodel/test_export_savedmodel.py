"""The exported SavedModel: contract signatures, float32 graph, Keras parity, warm-up, metadata."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow


def _scan_half(saved_model_pb: Path) -> list[str]:
    """Independent of the step's own scan: every DT_HALF/DT_BFLOAT16 anywhere in the graphs."""
    from tensorflow.core.framework import types_pb2
    from tensorflow.core.protobuf import saved_model_pb2

    half = {types_pb2.DT_HALF, types_pb2.DT_BFLOAT16}
    proto = saved_model_pb2.SavedModel.FromString(saved_model_pb.read_bytes())
    hits = []
    for meta_graph in proto.meta_graphs:
        graph = meta_graph.graph_def
        node_lists = [("graph", graph.node)] + [
            (f.signature.name, f.node_def) for f in graph.library.function]
        for where, nodes in node_lists:
            for node in nodes:
                for key, attr in node.attr.items():
                    types = {attr.type, attr.tensor.dtype, *attr.list.type}
                    if types & half:
                        hits.append(f"{where}/{node.name}:{key}")
        for function in graph.library.function:
            args = [*function.signature.input_arg, *function.signature.output_arg]
            hits += [f"{function.signature.name}:{a.name}" for a in args if a.type in half]
    return hits


def _keras_models(model_dir):
    import keras

    from ampflow.artifacts.model_dir import load_trained_model
    from ampflow.modeling.models import build_model

    trained, meta = load_trained_model(model_dir)
    twin = build_model(meta["architecture"], tuple(meta["input_shape"]), meta["num_classes"],
                       policy="float32")
    twin.set_weights(trained.get_weights())
    assert keras.mixed_precision.global_policy().name == "float32"
    return trained, twin, meta


def _test_images(prepared_digits, n=128):
    from ampflow.data import load_arrays

    images, labels = load_arrays(prepared_digits, "test", limit=n)
    return images.astype(np.float32), labels


def test_run_export_mixed_float16_signatures_follow_contract(mixed_export):
    import tensorflow as tf

    from ampflow.components.export_savedmodel.signatures import describe_signatures

    loaded = tf.saved_model.load(str(mixed_export.version_dir))
    assert set(loaded.signatures) == {"serving_default", "classify", "image_bytes"}
    predict = loaded.signatures["serving_default"]
    (images_spec,) = predict.structured_input_signature[1].values()
    assert images_spec.dtype == tf.float32 and images_spec.shape.as_list() == [None, 8, 8, 1]
    assert {k: v.dtype for k, v in predict.structured_outputs.items()} == {
        "probabilities": tf.float32, "class_ids": tf.int64}
    classify = loaded.signatures["classify"]
    assert classify.structured_input_signature[1]["inputs"].dtype == tf.string
    assert {k: v.dtype for k, v in classify.structured_outputs.items()} == {
        "scores": tf.float32, "classes": tf.string}
    described = describe_signatures(mixed_export.version_dir)
    assert described["classify"]["method_name"] == "tensorflow/serving/classify"
    assert described["serving_default"]["method_name"] == "tensorflow/serving/predict"
    assert described["classify"]["outputs"]["classes"]["shape"] == [-1, 10]
    encoded = loaded.signatures["image_bytes"]
    assert encoded.structured_input_signature[1]["image_bytes"].dtype == tf.string
    assert described["image_bytes"] == {
        "method_name": "tensorflow/serving/predict",
        "inputs": {"image_bytes": {"dtype": "string", "shape": [-1]}},
        "outputs": described["serving_default"]["outputs"]}


def test_every_signature_calls_one_model_function_instead_of_holding_the_model(mixed_export):
    # The three signatures share the model's graph instead of each holding a copy (with the
    # signatures no longer also object attributes: ResNet-50's saved_model.pb 2.8 -> 1.3 MB):
    # the convolutions are only in the shared function, and each signature's function calls it.
    from ampflow.serving.model_format import read_saved_model

    library = read_saved_model(mixed_export.version_dir).meta_graphs[0].graph_def.library
    with_convs = {f.signature.name for f in library.function
                  if any(n.op == "Conv2D" for n in f.node_def)}
    assert with_convs and all("probabilities_of" in name for name in with_convs), with_convs
    for kind in ("predict", "predict_encoded", "classify"):
        functions = [f for f in library.function
                     if f.signature.name.startswith(f"__inference_{kind}_")]
        assert functions, kind
        for function in functions:
            called = {attr.func.name for n in function.node_def for attr in n.attr.values()
                      if attr.HasField("func")}
            assert called & with_convs, (function.signature.name, called)


def test_run_export_mixed_float16_graph_has_no_half_tensors(mixed_export, trained_model,
                                                            tmp_path):
    from ampflow.artifacts.model_dir import load_trained_model
    from ampflow.components.export_savedmodel.signatures import (
        half_precision_nodes,
        save_servable,
    )

    assert _scan_half(mixed_export.version_dir / "saved_model.pb") == []
    assert half_precision_nodes(mixed_export.version_dir) == []
    # Control: the same module around the mixed model itself does hold float16 compute,
    # so both scans can fail.
    trained, meta = load_trained_model(trained_model("mixed_float16"))
    save_servable(trained, tuple(meta["input_shape"]), meta["class_names"], tmp_path / "mixed")
    assert len(_scan_half(tmp_path / "mixed" / "saved_model.pb")) > 0
    assert any("Conv2D" in n for n in half_precision_nodes(tmp_path / "mixed"))


def test_run_export_predictions_match_keras(mixed_export, trained_model, prepared_digits):
    import tensorflow as tf

    from ampflow.serving.model_format import image_example

    trained, twin, meta = _keras_models(trained_model("mixed_float16"))
    images, labels = _test_images(prepared_digits)
    loaded = tf.saved_model.load(str(mixed_export.version_dir))
    out = loaded.signatures["serving_default"](images=tf.constant(images))
    probs = out["probabilities"].numpy()
    np.testing.assert_allclose(probs, twin(images).numpy(), rtol=1e-5, atol=1e-6)
    # vs the model as trained (float16 compute): close, and the same decisions
    mixed = np.asarray(trained(images), dtype=np.float32)
    np.testing.assert_allclose(probs, mixed, atol=1e-2)
    assert np.mean(out["class_ids"].numpy() == mixed.argmax(-1)) >= 0.99
    np.testing.assert_array_equal(out["class_ids"].numpy(), probs.argmax(-1))
    assert np.mean(out["class_ids"].numpy() == labels) > 0.8  # a trained model, not noise

    examples = tf.constant([image_example(i).SerializeToString() for i in images[:16]])
    classified = loaded.signatures["classify"](inputs=examples)
    np.testing.assert_allclose(classified["scores"].numpy(), probs[:16], rtol=1e-6, atol=1e-7)
    classes = classified["classes"].numpy().astype(str)
    assert classes.shape == (16, 10)
    assert (classes == np.array(meta["class_names"])).all()


def test_run_export_labels_asset_lists_class_names(mixed_export, trained_model):
    meta = json.loads((Path(trained_model("mixed_float16")) / "metadata.json").read_text())
    labels = (mixed_export.version_dir / "assets" / "labels.txt").read_text().splitlines()
    assert labels == meta["class_names"] and len(labels) == 10


def test_run_export_warmup_records_hold_real_test_images(mixed_export, prepared_digits):
    import tensorflow as tf

    from ampflow.serving.model_format import read_warmup_records

    path = mixed_export.version_dir / "assets.extra" / "tf_serving_warmup_requests"
    assert path.is_file()
    logs = read_warmup_records(mixed_export.version_dir)
    assert [e.WhichOneof("log_type") for e in logs] == ["predict_log"] * 11 + ["classify_log"]
    images, _ = _test_images(prepared_digits, n=10)
    for i, entry in enumerate(logs[:10]):
        request = entry.predict_log.request
        assert request.model_spec.signature_name == "serving_default"
        sent = tf.make_ndarray(request.inputs["images"])
        assert sent.dtype == np.float32 and sent.shape == (1, 8, 8, 1)
        np.testing.assert_array_equal(sent[0], images[i])
    encoded = logs[10].predict_log.request
    assert encoded.model_spec.signature_name == "image_bytes"
    (png,) = tf.make_ndarray(encoded.inputs["image_bytes"])
    np.testing.assert_array_equal(tf.io.decode_png(png).numpy(), images[0])
    examples = logs[-1].classify_log.request.input.example_list.examples
    np.testing.assert_array_equal(examples[0].features.feature["image"].float_list.value,
                                  images[0].ravel())


def test_run_export_metadata_records_source_and_parity(mixed_export, trained_model):
    meta = json.loads((mixed_export.version_dir / "ampflow_export.json").read_text())
    assert meta == mixed_export.metadata | {"created_at": meta["created_at"]}
    assert meta["version"] == 1 and meta["model_name"] == "ampflow"  # the one served-name default
    assert meta["source"]["architecture"] == "small_cnn"
    assert meta["source"]["trained_policy"] == "mixed_float16"
    assert meta["source"]["exported_policy"] == "float32"
    assert meta["source"]["model_dir"] == str(Path(trained_model("mixed_float16")).resolve())
    assert meta["input"] == {"name": "images", "shape": [-1, 8, 8, 1], "dtype": "float32",
                             "range": [0, 255],
                             "note": "raw pixels; rescaling is inside the model"}
    assert meta["parity"]["passed"] and meta["parity"]["num_images"] == 256
    assert meta["parity"]["max_abs_diff"] <= 1e-5
    assert meta["parity"]["image_bytes_max_abs_diff"] <= 1e-6
    assert meta["parity"]["image_bytes_class_ids_equal"] is True
    assert meta["encoded_input"]["signature"] == "image_bytes"
    assert meta["encoded_input"]["max_pixels"] == 4096 * 4096
    assert 0 < meta["parity"]["trained_max_abs_diff"] < 1e-2  # float16 vs float32 compute
    assert meta["gate"]["forced"] is False and meta["forced"] is False
    for name in ("ampflow_export.json", "config.json", "saved_model.pb"):
        assert (mixed_export.version_dir / name).stat().st_mode & 0o444 == 0o444, name
    config = json.loads((mixed_export.version_dir / "config.json").read_text())
    assert config["force"] is False and config["num_warmup_records"] == 10


def test_run_export_fingerprint_matches_rewritten_saved_model(mixed_export):
    import tensorflow as tf
    from tensorflow.core.protobuf import fingerprint_pb2
    from tensorflow.python.saved_model.pywrap_saved_model import fingerprinting

    fresh = fingerprint_pb2.FingerprintDef.FromString(
        fingerprinting.CreateFingerprintDef(str(mixed_export.version_dir)))
    stored = tf.saved_model.experimental.read_fingerprint(str(mixed_export.version_dir))
    assert stored.saved_model_checksum == fresh.saved_model_checksum
    assert stored.signature_def_hash == fresh.signature_def_hash


def test_saved_model_cli_show_all_reports_float32_io(mixed_export):
    cli = Path(sys.executable).parent / "saved_model_cli"
    out = subprocess.run([str(cli), "show", "--dir", str(mixed_export.version_dir), "--all"],
                         capture_output=True, text=True, timeout=120,
                         env={"TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout
    assert "signature_def['serving_default']" in text and "signature_def['classify']" in text
    assert "signature_def['image_bytes']" in text
    assert "Method name is: tensorflow/serving/classify" in text
    for name, dtype in (("images", "DT_FLOAT"), ("probabilities", "DT_FLOAT"),
                        ("class_ids", "DT_INT64"), ("scores", "DT_FLOAT"),
                        ("classes", "DT_STRING"), ("inputs", "DT_STRING")):
        block = text[text.index(f"['{name}'] tensor_info:"):][:120]
        assert f"dtype: {dtype}" in block, block
    assert "DT_HALF" not in text and "DT_BFLOAT16" not in text


def test_export_records_expected_answers_for_deployment_canaries(mixed_export, trained_model,
                                                                 prepared_digits):
    from ampflow.artifacts.canary_examples import (
        CANARY_FILE,
        load_canary_examples,
    )

    examples = load_canary_examples(mixed_export.version_dir)
    images, _ = _test_images(prepared_digits, n=32)
    np.testing.assert_array_equal(examples.images, images)  # real test images, as requested
    _, twin, _ = _keras_models(trained_model("mixed_float16"))
    expected = twin.predict(images, verbose=0)
    np.testing.assert_allclose(examples.probabilities, expected, atol=1e-5)
    np.testing.assert_array_equal(examples.class_ids, expected.argmax(axis=1))
    meta = json.loads((mixed_export.version_dir / "ampflow_export.json").read_text())
    assert meta["canary"] == {"file": CANARY_FILE, "examples": 32}
