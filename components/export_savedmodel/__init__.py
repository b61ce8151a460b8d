"""Step 4: a versioned, float32 SavedModel for TF Serving, with warm-up and a parity check."""

from ampflow.components.export_savedmodel.step import (
    EXPORT_METADATA_FILE,
    ExportConfig,
    ExportResult,
    run_export,
)
from ampflow.components.export_savedmodel.versions import (
    find_exported_version,
    list_versions,
    next_version,
)

__all__ = [
    "EXPORT_METADATA_FILE",
    "ExportConfig",
    "ExportResult",
    "find_exported_version",
    "list_versions",
    "next_version",
    "run_export",
]
