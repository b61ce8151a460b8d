"""TF Serving's version layout: numbered dirs, next free number, nothing half-written visible."""

from __future__ import annotations

import json

import pytest

from ampflow.artifacts.versions import list_versions, next_version, staged_version_dir
from ampflow.errors import ExportError


def _fake_version(base, name, complete=True):
    path = base / name
    path.mkdir(parents=True)
    if complete:
        (path / "saved_model.pb").write_bytes(b"\x08\x01")
    return path


def test_list_versions_missing_base_is_empty(tmp_path):
    assert list_versions(tmp_path / "absent") == []
    assert next_version(tmp_path / "absent") == 1


def test_list_versions_mixed_dirs_only_complete_numeric(tmp_path):
    for name in ("1", "2", "10"):
        _fake_version(tmp_path, name)
    _fake_version(tmp_path, "11", complete=False)           # numeric, but no saved_model.pb
    _fake_version(tmp_path, ".12.incomplete-abc")             # a crashed export's leftover
    _fake_version(tmp_path, "latest")
    (tmp_path / "13").write_text("a file, not a dir")
    assert list_versions(tmp_path) == [1, 2, 10]              # numeric order, not "1,10,2"
    assert next_version(tmp_path) == 12                       # 11 is taken, 12 is free


def test_staged_version_dir_success_publishes_whole_dir(tmp_path):
    with staged_version_dir(tmp_path, 1) as staging:
        assert staging.name.startswith(".1.incomplete-")
        (staging / "saved_model.pb").write_bytes(b"x")
        assert list_versions(tmp_path) == []                  # invisible until the block ends
    with staged_version_dir(tmp_path, next_version(tmp_path)) as staging:
        (staging / "saved_model.pb").write_bytes(b"y")
    assert list_versions(tmp_path) == [1, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1", "2"]
    assert (tmp_path / "1").stat().st_mode & 0o777 == 0o755  # readable by a server's user


def test_staged_version_dir_crash_midway_leaves_no_version(tmp_path):
    with pytest.raises(RuntimeError, match="simulated crash"):
        with staged_version_dir(tmp_path, 1) as staging:
            (staging / "saved_model.pb").write_bytes(b"partial")
            (staging / "variables").mkdir()
            raise RuntimeError("simulated crash")
    assert list_versions(tmp_path) == []
    assert list(tmp_path.iterdir()) == []                     # staging removed too
    assert next_version(tmp_path) == 1


def test_staged_version_dir_existing_version_refused(tmp_path):
    _fake_version(tmp_path, "3")
    with pytest.raises(ExportError, match=r"version must be a new version number.*version=3"):
        with staged_version_dir(tmp_path, 3):
            pass
    assert (tmp_path / "3" / "saved_model.pb").read_bytes() == b"\x08\x01"  # untouched


def test_staged_version_dir_version_taken_meanwhile_refused(tmp_path):
    with pytest.raises(ExportError, match="already exists"):
        with staged_version_dir(tmp_path, 1) as staging:
            (staging / "saved_model.pb").write_bytes(b"mine")
            _fake_version(tmp_path, "1")                      # a concurrent export won the race
    assert (tmp_path / "1" / "saved_model.pb").read_bytes() == b"\x08\x01"
    assert [p.name for p in tmp_path.iterdir()] == ["1"]


@pytest.mark.slow
def test_run_export_twice_with_crash_leftover_gives_versions_1_and_2(
        mixed_export, trained_model, prepared_digits, mixed_eval_dir):
    from ampflow.components.export_savedmodel import ExportConfig, run_export

    base = mixed_export.model_base
    leftover = _fake_version(base, ".2.incomplete-killed")   # a SIGKILLed export's staging dir
    (leftover / "variables").mkdir()
    assert list_versions(base) == [1] and next_version(base) == 2
    second = run_export(ExportConfig(model_dir=trained_model("mixed_float16"),
                                     data_dir=prepared_digits, export_base=base.parent,
                                     eval_dir=mixed_eval_dir, num_warmup_records=1,
                                     num_parity_images=32))
    assert (second.version, second.version_dir) == (2, base / "2")
    assert list_versions(base) == [1, 2]
    assert json.loads((base / "2" / "ampflow_export.json").read_text())["version"] == 2
    assert leftover.is_dir()                                  # not ours to delete
    assert sorted(p.name for p in base.iterdir() if not p.name.startswith(".")) == ["1", "2"]
