"""A seeded, stratified held-out test split for a dataset that ships only a training split.

TFDS split slicing (`train[90%:]`) takes a contiguous range, so its class balance is whatever
the file order gives. Here every class gives up the same fraction of its examples instead:

- the examples are numbered in TFDS's read order of the training split spec
  (`as_dataset(split=spec, shuffle_files=False)`, which TFDS keeps deterministic);
- for each class (in label order) a `numpy.random.default_rng(seed)` permutation of that
  class's example numbers is drawn, and its first `round(n * fraction)` numbers are held out
  (at least one for a class with two or more examples, none for a class with one);
- the held-out numbers are recorded in `dataset_info.json` (`holdout.test_indices`), so a
  reader applies the split without recomputing it, and a rerun reproduces it exactly.
"""

from __future__ import annotations

import numpy as np


def stratified_holdout(labels: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """Return the sorted example numbers to hold out: `fraction` of each class, seeded."""
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    held: list[np.ndarray] = []
    for cls in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == cls))
        n = len(idx)
        n_test = int(round(n * fraction))
        if n >= 2:
            n_test = min(max(n_test, 1), n - 1)  # every class in both splits when it can be
        else:
            n_test = 0
        held.append(idx[:n_test])
    return np.sort(np.concatenate(held)) if held else np.zeros(0, np.int64)


def holdout_mask(num_examples: int, test_indices) -> np.ndarray:
    """A boolean vector over the example numbers: True where the example is held out."""
    mask = np.zeros(int(num_examples), dtype=bool)
    mask[np.asarray(test_indices, dtype=np.int64)] = True
    return mask
