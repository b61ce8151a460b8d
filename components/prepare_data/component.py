"""KFP component: prepare-data. A thin wrapper: artifact paths in, `run_prepare_data` out."""

from kfp.dsl import Dataset, Output


def prepare_data(dataset: str, data: Output[Dataset], tfds_data_dir: str = "",
                 image_size: str = "", image_folder: str = ""):
    """Prepare a TFDS dataset, the offline default, or a folder of images into `data`.

    image_size: "H W", "HxW" or one number for a square: the size the pipeline trains and
        serves at (needed for images of varying size; "" keeps the dataset's own size).
    image_folder: a folder of class sub-folders, read instead of `dataset`. It is a path on the
        machine that runs this step: a local path under the kfp local runner; on a cluster, a
        path inside the step's container (a mounted volume), not a bucket URI.
    """
    from ampflow.components.prepare_data import PrepareDataConfig, run_prepare_data

    result = run_prepare_data(PrepareDataConfig(
        output_dir=data.path, dataset=dataset, tfds_data_dir=tfds_data_dir or None,
        image_size=image_size or None, image_folder=image_folder or None))
    info = result.info
    data.metadata.update({"name": info["name"], "version": info["version"],
                          "splits": info["splits"], "image_shape": info["image_shape"],
                          "num_classes": info["num_classes"],
                          "skipped_files": info["skipped_files"]["count"]})
