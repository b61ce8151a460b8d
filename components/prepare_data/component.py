"""KFP component: prepare-data. A thin wrapper: artifact paths in, `run_prepare_data` out."""

from kfp.dsl import Dataset, Output


def prepare_data(dataset: str, data: Output[Dataset], tfds_data_dir: str = ""):
    """Prepare a TFDS dataset (or the offline default) into the `data` artifact dir."""
    from ampflow.components.prepare_data import PrepareDataConfig, run_prepare_data

    result = run_prepare_data(PrepareDataConfig(output_dir=data.path, dataset=dataset,
                                                tfds_data_dir=tfds_data_dir or None))
    info = result.info
    data.metadata.update({"name": info["name"], "version": info["version"],
                          "splits": info["splits"], "image_shape": info["image_shape"],
                          "num_classes": info["num_classes"]})
