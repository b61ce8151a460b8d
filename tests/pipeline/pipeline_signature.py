"""The pipeline function's signature defaults as written in its source (not as Python evaluates
them), for the tests that check no default is restated there as a literal."""

import ast
from pathlib import Path


def pipeline_signature_defaults() -> dict[str, ast.expr]:
    """Each defaulted parameter of `ampflow_pipeline` -> the expression written as its default."""
    import ampflow.pipeline.pipeline as module

    tree = ast.parse(Path(module.__file__).read_text())
    (pipeline_fn,) = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
                      and n.name == "ampflow_pipeline"]
    args = pipeline_fn.args
    return dict(zip([a.arg for a in args.args][-len(args.defaults):], args.defaults,
                    strict=True))
