"""Step 5: SavedModel → TFLite (float32, float16, dynamic_range, full_int8), checked and gated."""

from ampflow.components.convert_tflite.step import (
    ConvertConfig,
    ConvertResult,
    VariantResult,
    resolve_saved_model_dir,
    run_convert,
)
from ampflow.components.convert_tflite.variants import (
    SavedModelConverter,
    convert_variant,
    draw_representative,
)

__all__ = [
    "ConvertConfig",
    "ConvertResult",
    "SavedModelConverter",
    "VariantResult",
    "convert_variant",
    "draw_representative",
    "resolve_saved_model_dir",
    "run_convert",
]
