"""KFP component: prepare-data. A thin wrapper: artifact paths in, `run_prepare_data` out."""

from kfp.dsl import Dataset, Output

from ampflow.components.prepare_data.config import PrepareDataConfig
from ampflow.kfp_args import document_args

# A data source is read by the step's own process (KFP has no None: empty is unset).
_LOCAL_PATH = ("Empty: not used. A path the step's own machine reads: a local path under the "
               "kfp local runner; on a cluster, a path inside the step's container (a mounted "
               "volume), not a bucket URI")


def prepare_data(dataset: str, data: Output[Dataset], tfds_data_dir: str = "",
                 test_fraction: float = 0.1,
                 image_size: str = "", image_folder: str = "", text_folder: str = "",
                 text_file: str = "", text_column: str = "text", label_column: str = "label",
                 text_feature: str = "", max_text_bytes: int = 100_000):
    """Prepare a TFDS dataset, an offline one, or a folder of images or texts into `data`.

    The defaults are literals (KFP runs this function's source in the container) equal to
    PrepareDataConfig's, which a test checks; the Args KFP shows come from its fields' help.
    """
    from ampflow.components.prepare_data import PrepareDataConfig, run_prepare_data
    from ampflow.components.prepare_data.modalities import preparing_of

    result = run_prepare_data(PrepareDataConfig(
        output_dir=data.path, dataset=dataset, tfds_data_dir=tfds_data_dir or None,
        test_fraction=test_fraction,
        image_size=image_size or None, image_folder=image_folder or None,
        text_folder=text_folder or None, text_file=text_file or None, text_column=text_column,
        label_column=label_column, text_feature=text_feature or None,
        max_text_bytes=max_text_bytes))
    info = result.info
    shape = preparing_of(info["modality"]).shape(info)
    data.metadata.update({"name": info["name"], "version": info["version"],
                          "modality": info["modality"], "splits": info["splits"], **shape,
                          "num_classes": info["num_classes"],
                          "skipped_files": info["skipped_files"]["count"]})


document_args(prepare_data, PrepareDataConfig, notes={
    "image_size": 'Also "HxW"', "image_folder": _LOCAL_PATH, "text_folder": _LOCAL_PATH,
    "text_file": _LOCAL_PATH})
