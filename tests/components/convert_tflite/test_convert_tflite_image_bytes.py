"""TFLite and the three-signature export: `serving_default` converts alone; `image_bytes` does
not convert at all (docs/ARTIFACTS.md says why), and the step says so in one clear error."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def test_convert_float32_carries_only_serving_default(float32_savedmodel):
    from ai_edge_litert.interpreter import Interpreter

    from ampflow.components.convert_tflite.variants import convert_variant

    interpreter = Interpreter(model_content=convert_variant(float32_savedmodel, "float32"))
    assert list(interpreter.get_signature_list()) == ["serving_default"]


def test_convert_image_bytes_signature_refused_naming_decode_and_resize_ops(float32_savedmodel):
    """Builtins lack string decoding (DecodeImage: a Flex op) and the antialiased resize
    (ScaleAndTranslate: in neither the builtins nor the Flex allowlist)."""
    from ampflow.components.convert_tflite.variants import convert_variant
    from ampflow.errors import ConversionError

    with pytest.raises(ConversionError) as excinfo:
        convert_variant(float32_savedmodel, "float32", signature_key="image_bytes")
    message = str(excinfo.value)
    assert "DecodeImage" in message and "ScaleAndTranslate" in message, message
