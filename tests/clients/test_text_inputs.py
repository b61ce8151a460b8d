"""What the clients do with texts before any server: `--text`/`--text-file` read as a user
expects, the text signature picked from metadata, texts as TF Serving's JSON strings over REST.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from ampflow_client._common import read_texts, text_label, text_signature
from ampflow_client._proto.tensorflow.core.protobuf import meta_graph_pb2
from ampflow_client.errors import ConfigError
from ampflow_client.rest import _json_value


def test_text_file_lines_are_texts_blank_lines_skipped_and_undecodable_lines_kept_as_bytes(
        tmp_path):
    path = tmp_path / "texts.txt"
    path.write_bytes(b"a great film\r\n\n  \n\xff\xfe odd\nl\xc3\xa9g\xc3\xa8re\n")
    assert read_texts(["first"], str(path)) == ["first", "a great film", b"\xff\xfe odd",
                                                "l\u00e9g\u00e8re"]


@pytest.mark.parametrize("texts, text_file, message", [
    ([], None, "give at least one text"),
    ([], "/nonexistent/texts.txt", "text_file must be a readable file"),
])
def test_no_text_or_an_unreadable_file_is_a_config_error(texts, text_file, message):
    with pytest.raises(ConfigError, match=message):
        read_texts(texts, text_file)


def test_an_empty_text_file_is_a_config_error(tmp_path):
    path = tmp_path / "empty.txt"
    path.write_text("\n\n")
    with pytest.raises(ConfigError, match="no lines in"):
        read_texts([], str(path))


def _signature(method: str, inputs: dict[str, int]) -> meta_graph_pb2.SignatureDef:
    sig = meta_graph_pb2.SignatureDef(method_name=method)
    for name, dtype in inputs.items():
        sig.inputs[name].dtype = dtype
    return sig


def test_the_text_signature_is_the_one_string_input_named_text():
    predict, classify = "tensorflow/serving/predict", "tensorflow/serving/classify"
    string, int32, floats = 7, 3, 1  # DT_STRING, DT_INT32, DT_FLOAT
    text_model = {"serving_default": _signature(predict, {"text": string}),
                  "classify": _signature(classify, {"inputs": string}),
                  "token_ids": _signature(predict, {"input_ids": int32})}
    assert text_signature(text_model) == "serving_default"
    image_model = {"serving_default": _signature(predict, {"images": floats}),
                   "image_bytes": _signature(predict, {"images": string}),
                   "classify": _signature(classify, {"inputs": string})}
    assert text_signature(image_model) is None
    other = {"serving_default": _signature(predict, {"images": floats}),
             "words": _signature(predict, {"text": string})}
    assert text_signature(other) == "words"


def test_rest_sends_texts_as_json_strings_and_other_bytes_as_b64():
    batch = np.empty(2, dtype=object)
    batch[:] = ["a great film", b"\xff\xfe"]
    assert json.dumps(_json_value(batch)) == '["a great film", {"b64": "//4="}]'


def test_a_text_is_named_by_its_first_characters():
    assert text_label("a  great\nfilm") == "'a great film'"
    assert text_label("x" * 100, width=10) == "'xxxxxxx...'"
    assert text_label(b"\xff ok") == "'\\\\xff ok'"
