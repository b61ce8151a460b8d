"""Step 4: a versioned, float32 SavedModel for TF Serving, with warm-up and a parity check."""

from ampflow.components.export_savedmodel.step import (
    EXPORT_METADATA_FILE,
    ExportConfig,
    ExportResult,
    run_export,
)

__all__ = [
    "EXPORT_METADATA_FILE",
    "ExportConfig",
    "ExportResult",
    "run_export",
]
