import os
import stat

import pytest

from ampflow.errors import ConfigError
from ampflow.files import staging_dir, write_json_atomic


def test_staging_dir_refuses_to_replace_a_directory_that_is_not_an_earlier_output(tmp_path):
    (tmp_path / "precious.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="not safe to replace"):
        with staging_dir(tmp_path, replaces="verdict.json") as tmp:
            (tmp / "verdict.json").write_text("{}")
    assert (tmp_path / "precious.txt").read_text() == "keep me"


def test_staging_dir_replaces_an_earlier_output_of_the_same_step(tmp_path):
    out = tmp_path / "eval"
    for value in ("first", "second"):
        with staging_dir(out, replaces="verdict.json") as tmp:
            (tmp / "verdict.json").write_text(value)
    assert (out / "verdict.json").read_text() == "second"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval"]  # no temp dirs left
    assert stat.S_IMODE(out.stat().st_mode) == 0o755


def test_staging_dir_failure_leaves_the_old_output_and_no_temp_dir(tmp_path):
    out = tmp_path / "eval"
    with staging_dir(out, replaces="verdict.json") as tmp:
        (tmp / "verdict.json").write_text("good")
    with pytest.raises(RuntimeError):
        with staging_dir(out, replaces="verdict.json") as tmp:
            (tmp / "verdict.json").write_text("half")
            raise RuntimeError("crash mid-write")
    assert (out / "verdict.json").read_text() == "good"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval"]


def test_staging_dir_never_replaces_without_a_marker(tmp_path):
    version = tmp_path / "1"
    with staging_dir(version) as tmp:
        (tmp / "saved_model.pb").write_text("v1")
    with pytest.raises(ConfigError, match="not safe to replace"):
        with staging_dir(version) as tmp:
            (tmp / "saved_model.pb").write_text("other")
    assert (version / "saved_model.pb").read_text() == "v1"


def test_write_json_atomic_is_readable_by_other_users(tmp_path):
    path = write_json_atomic(tmp_path / "m.json", {"a": 1})
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert path.read_text().strip() == '{\n  "a": 1\n}'


def test_read_artifact_json_names_the_missing_file_and_the_step_to_run(tmp_path):
    from ampflow.errors import DatasetError
    from ampflow.files import read_artifact_json

    kwargs = {"artifact": "a prepared dataset", "hint": "run `ampflow prepare-data` first",
              "error": DatasetError}
    with pytest.raises(DatasetError, match=r"is not a prepared dataset: expected info.json in "
                                           r"it \(run `ampflow prepare-data` first\)\.$"):
        read_artifact_json(tmp_path, "info.json", **kwargs)
    (tmp_path / "info.json").write_text('{"name": ')
    with pytest.raises(DatasetError, match=r"info.json is corrupt") as info:
        read_artifact_json(tmp_path, "info.json", **kwargs)
    assert isinstance(info.value.__cause__, ValueError)
    (tmp_path / "info.json").write_text('{"name": "digits"}')
    assert read_artifact_json(tmp_path, "info.json", **kwargs) == {"name": "digits"}
