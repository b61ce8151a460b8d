"""The suite's own rules, checked statically so they cannot quietly regress.

- A test that trains a model (through a training fixture), builds ResNet-50/MobileNetV2 or runs
  the serving soak/fuzz is marked `slow`, so `make test-fast` (`-m "not slow"`) stays fast.
- No test carries the same marker twice.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# Words in a fixture's or test's source that mean "trains or builds a large model".
# The soak and the fuzz run a server under load for tens of seconds: slow too.
HEAVY = re.compile(r"\b(resnet50|mobilenet_v2|trained_model|run_demo|run_local|serving_soak"
                   r"|serving_fuzz)\b")


def _functions(path: Path):
    text = path.read_text()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef):
            decorators = [ast.unparse(d) for d in node.decorator_list]
            source = ast.get_source_segment(text, node) + " ".join(decorators)
            yield node, decorators, source, text


def _heavy_fixtures() -> set[str]:
    """Fixtures whose source trains, or which depend on a fixture that does."""
    fixtures = {}
    for path in TESTS.rglob("*.py"):
        for node, decorators, source, _ in _functions(path):
            if any("fixture" in d for d in decorators):
                fixtures[node.name] = ([a.arg for a in node.args.args], source)
    heavy: set[str] = set()
    grew = True
    while grew:
        grew = False
        for name, (args, source) in fixtures.items():
            if name not in heavy and (HEAVY.search(source) or heavy & set(args)):
                heavy.add(name)
                grew = True
    return heavy


def _tests():
    for path in sorted(TESTS.rglob("test_*.py")):
        for node, decorators, source, text in _functions(path):
            if node.name.startswith("test_"):
                module_marks = " ".join(re.findall(r"^pytestmark\s*=.*$", text, re.M))
                yield path, node, decorators, source, module_marks


def test_tests_that_train_or_build_large_models_are_marked_slow():
    heavy = _heavy_fixtures()
    unmarked = [
        f"{path.relative_to(TESTS)}::{node.name}"
        for path, node, decorators, source, module_marks in _tests()
        if (HEAVY.search(source) or heavy & {a.arg for a in node.args.args})
        and not any(d == "pytest.mark.slow" for d in decorators)
        and "slow" not in module_marks
    ]
    assert unmarked == []


def test_no_test_carries_a_marker_twice():
    duplicated = []
    for path, node, decorators, _, _ in _tests():
        marks = [d for d in decorators if d.startswith("pytest.mark.")
                 and not d.startswith("pytest.mark.parametrize")]
        if len(marks) != len(set(marks)):
            duplicated.append(f"{path.relative_to(TESTS)}::{node.name}")
    assert duplicated == []
