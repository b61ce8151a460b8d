"""An export whose disk fills up half-way (issue 24, item 2): `ampflow export` run with
RLIMIT_FSIZE in its own process (tests/full_disk.py; SIGXFSZ ignored: a write past the limit
fails with EFBIG as a full disk fails with ENOSPC; a tiny filesystem would need root or FUSE).
It must fail with one line and publish no version dir a server would load: the SavedModel is
written into a hidden staging dir and renamed into place only when complete
(versions.staged_version_dir)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from full_disk import file_size_limited

from ampflow.artifacts.versions import list_versions
from ampflow.serving.model_format import version_dirs

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

FILE_SIZE_LIMIT = 16 * 1024  # bytes: the trained model's variables are larger



def test_export_on_a_full_disk_fails_clearly_and_publishes_no_version(
        trained_model, prepared_digits, mixed_eval_dir, tmp_path):
    base = tmp_path / "serving"
    (base / "ampflow" / "1").mkdir(parents=True)  # the version being served stays as it is
    (base / "ampflow" / "1" / "saved_model.pb").write_bytes(b"\x08\x01")
    done = subprocess.run(
        file_size_limited([sys.executable, "-m", "ampflow.cli", "export",
                           "--model-dir", str(trained_model("mixed_float16")),
                           "--data-dir", str(prepared_digits), "--eval-dir", str(mixed_eval_dir),
                           "--export-base", str(base)], FILE_SIZE_LIMIT),
        capture_output=True, text=True, timeout=500,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    (error,) = [line for line in done.stderr.splitlines() if "error:" in line]
    assert "tf.saved_model.save failed" in error and "File too large" in error
    assert sorted(version_dirs(base / "ampflow")) == [1] == list_versions(base / "ampflow")
    assert [p.name for p in (base / "ampflow").iterdir()] == ["1"]  # no staging dir left
