"""Checkpoints that survive a full disk and a kill at the wrong moment.

TF's `CheckpointManager.save` writes `<prefix>-<step>.data-*` and `.index` (SaveV2 writes them
under a temp name and renames them when merged) and then rewrites the `checkpoint` state file.
So a save that fails part-way (a full disk, a file-size limit) leaves the previous checkpoint
and the state file as they were: `save` turns that failure into one clear line that names the
checkpoint a rerun resumes from.

A checkpoint can still be unreadable: a kill or a disk fault after its files were renamed, a
copy to or from a volume cut short, a bit flipped on a disk. TF would raise on it at restore,
or worse, restore the variables it can read and let the training go on from a mix. `restore`
reads every tensor of a checkpoint first (each is checked against its CRC32C in the index), and
a damaged one (a torn or missing file, a bad checksum) makes it fall back to the previous one,
saying so in the log; an error reaching the file (permission denied, an unavailable volume)
is raised as it is, since an older checkpoint would only hide it. If checkpoints
exist and none can be read it refuses: starting from scratch over a run's checkpoints must be
the user's choice (remove the directory), never a silent one.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from ampflow.errors import AmpflowError

log = logging.getLogger(__name__)


class CheckpointError(AmpflowError):
    """A checkpoint could not be written, or none of those on disk can be read."""


def save(manager, step: int) -> str:
    """`manager.save(checkpoint_number=step)`; a failed write is one CheckpointError line."""
    import tensorflow as tf

    previous = manager.latest_checkpoint
    try:
        return manager.save(checkpoint_number=step)
    except (OSError, tf.errors.OpError) as e:
        raise CheckpointError(
            f"could not write the checkpoint of step {step} to {manager.directory} "
            f"({_reason(e)}); the previous checkpoint is untouched "
            f"({previous or 'none yet'}): free space and rerun to resume from it") from e


def restore(checkpoint, directory: str) -> str | None:
    """Restore the newest readable checkpoint in `directory`; its path, or None if it has none.

    Newer unreadable checkpoints are skipped with a warning each; CheckpointError when there
    are checkpoints and none of them can be read.
    """
    candidates = checkpoint_paths(directory)
    for number, path in enumerate(candidates):
        problem = unreadable_reason(path)
        if problem is None:
            checkpoint.restore(path).assert_existing_objects_matched()
            if number:
                log.warning("resumed from %s, the newest readable checkpoint: the %d newer "
                            "one(s) could not be read (see above)", path, number)
            return path
        following = candidates[number + 1] if number + 1 < len(candidates) else None
        log.warning("checkpoint %s is unreadable (%s); %s", path, problem,
                    f"falling back to {following}" if following else "no older one is left")
    if candidates:
        raise CheckpointError(
            f"none of the {len(candidates)} checkpoint(s) in {directory} can be read "
            f"(newest: {candidates[0]}); refusing to start over from scratch: remove "
            f"{directory} to train afresh")
    return None


def checkpoint_paths(directory: str) -> list[str]:
    """Checkpoint prefixes in `directory`, newest (highest number) first.

    Found from the `.index` files rather than TF's `checkpoint` state file alone, which lists
    only the newest `max_to_keep` and may itself be the damaged file.
    """
    import tensorflow as tf

    numbered = []
    for index in tf.io.gfile.glob(f"{directory.rstrip('/')}/*.index"):
        prefix = index[: -len(".index")]
        found = re.search(r"-(\d+)$", prefix)
        if found and "_temp" not in Path(prefix).name:
            numbered.append((int(found.group(1)), prefix))
    return [prefix for _, prefix in sorted(numbered, reverse=True)]


def unreadable_reason(path: str) -> str | None:
    """Why the checkpoint at `path` cannot be restored, or None: every tensor is read."""
    import tensorflow as tf

    try:
        reader = tf.train.load_checkpoint(path)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)
    except (IndexError, tf.errors.OpError) as e:  # IndexError: a truncated data file
        if _is_damage(e):
            return _reason(e) or type(e).__name__
        raise _access_error(path, e) from e
    except Exception as e:  # noqa: BLE001 - OSError (permission, NFS) and the like: not damage
        raise _access_error(path, e) from e
    return None


# What TF's checkpoint reader says about a damaged file. It wraps most errors as UNKNOWN (checked
# on TF 2.21: a torn index is "not an sstable (bad magic number)", a zeroed one "file is too
# short to be an sstable", a flipped byte "Checksum does not match", a missing data file "No
# such file or directory"), so for UNKNOWN the message tells damage from an access error.
_DAMAGE_CODES = ("DATA_LOSS", "OUT_OF_RANGE", "NOT_FOUND")
_DAMAGE_WORDS = ("sstable", "checksum does not match", "no such file or directory", "corrupt",
                 "truncated", "data loss", "read less bytes")


def _is_damage(error: Exception) -> bool:
    """True for a file that cannot be read as a checkpoint; False for a failure to reach it."""
    import tensorflow as tf

    if isinstance(error, IndexError):
        return True
    if error.error_code in [getattr(tf.errors, code) for code in _DAMAGE_CODES]:
        return True
    text = str(error.message or "").lower()
    return error.error_code == tf.errors.UNKNOWN and any(w in text for w in _DAMAGE_WORDS)


def _access_error(path: str, error: Exception) -> CheckpointError:
    """A permission or storage error: no sign the file is damaged, so no older one is tried."""
    return CheckpointError(
        f"could not read the checkpoint {path} ({_reason(error)}): an access or storage error, "
        "not a damaged file, so no older checkpoint was tried; fix the access and rerun")


def _reason(error: Exception) -> str:
    """The first line of a TF or OS error, without TF's long op context."""
    text = str(getattr(error, "message", None) or getattr(error, "strerror", None) or error)
    return text.strip().splitlines()[0][:300] if text.strip() else type(error).__name__


def skip_consumed_batches(iterator, steps: int) -> None:
    """Advance a resumed run's input past the `steps` batches the restored steps consumed.

    The input pipeline is seeded and starts from its beginning in every process, so without
    this a resumed run would train its remaining steps on the batches the killed run had
    already used and end on other weights than a run never killed. Each step (an applied step
    under gradient accumulation) takes one batch; reading them costs input time once per
    resume, no compute.
    """
    import time

    if not steps:
        return
    began = time.perf_counter()
    for _ in range(steps):
        next(iterator)
    log.info("resumed input: skipped the %d batches the restored steps had used (%.1f s)",
             steps, time.perf_counter() - began)


class BatchFeed:
    """A training iterator and the step its next batch belongs to, shared by a run's phases.

    A transfer run's phases (phases.py) are loops one after the other on one iterator, so the
    second reads on where the first stopped, as one loop would; a resumed phase skips to its
    restored step from wherever the iterator is.
    """

    def __init__(self, iterator):
        self.iterator = iterator
        self.position = 0

    def skip_to(self, step: int) -> None:
        """Advance past the batches of the steps before `step` not read yet."""
        skip_consumed_batches(self.iterator, max(step - self.position, 0))
        self.position = max(step, self.position)
