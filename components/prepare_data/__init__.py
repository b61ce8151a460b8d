"""Step 1: data preparation with tensorflow-datasets (any catalog name, or the offline default)."""

from ampflow.components.prepare_data.input_pipeline import (
    load_arrays,
    load_split,
    make_input_pipeline,
)
from ampflow.components.prepare_data.step import (
    OFFLINE_DATASETS,
    OFFLINE_DEFAULT,
    PrepareDataConfig,
    PreparedData,
    load_dataset_info,
    run_prepare_data,
)

__all__ = [
    "OFFLINE_DATASETS",
    "OFFLINE_DEFAULT",
    "PrepareDataConfig",
    "PreparedData",
    "load_arrays",
    "load_dataset_info",
    "load_split",
    "make_input_pipeline",
    "run_prepare_data",
]
