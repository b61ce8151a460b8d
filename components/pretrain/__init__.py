"""pretrain: masked-language-model pretraining of a BERT encoder on a prepared text dataset.

Its output is a checkpoint in the Hugging Face layout, which `ampflow train --model DIR` then
fine-tunes (issue 48, point 5). The step is plain Python (`run_pretrain`), the CLI a thin shell.
"""

from ampflow.components.pretrain.config import PretrainResult, PretrainStepConfig
from ampflow.components.pretrain.step import run_pretrain

__all__ = ["PretrainResult", "PretrainStepConfig", "run_pretrain"]
