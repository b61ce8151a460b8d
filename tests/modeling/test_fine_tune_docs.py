"""The Python examples of docs/how-to/fine-tune-pretrained.md run as written on a checkpoint.

Each block that names `bert_uncased_L-2_H-128_A-2` runs in a directory holding a checkpoint of
that name written by the tests (Hugging Face's layout, 128 positions as the example asks), so a
renamed function or argument in the library fails here, not in a reader's hands.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hf_bert_files import write_hf_bert

PAGE = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "fine-tune-pretrained.md"
CHECKPOINT = "bert_uncased_L-2_H-128_A-2"
BLOCKS = [block for block in re.findall(r"^```python\n(.*?)^```", PAGE.read_text(),
                                        re.DOTALL | re.MULTILINE) if CHECKPOINT in block]


def test_the_page_has_the_bert_examples():
    assert len(BLOCKS) == 2


@pytest.mark.parametrize("block", BLOCKS, ids=["encoder and tokenizer", "classifier"])
def test_the_example_runs_as_written(block, tmp_path, monkeypatch, capsys):
    write_hf_bert(tmp_path / CHECKPOINT, positions=128)
    monkeypatch.chdir(tmp_path)
    exec(compile(block, str(PAGE), "exec"), {})  # noqa: S102 (the docs' own example)
    if "print(" in block:
        assert capsys.readouterr().out.split() == ["Hugging", "Face", "2", "True"]
