"""The suite's own rules, checked statically so they cannot quietly regress.

- A test that trains a model (through a training fixture), builds ResNet-50/MobileNetV2 or runs
  the serving soak/fuzz is marked `slow`, so `make test-fast` (`-m "not slow"`) stays fast.
- The same rule for what costs a test tens of seconds whatever it checks: a test (or a fixture
  it uses) that builds a fresh venv and pip-installs into it (`venv.EnvBuilder`), or starts a
  serving process (`ampflow serve` / `ampflow.serving.cli serve` in a subprocess, or
  `ServeProcess`: a Python that imports TensorFlow, loads a SavedModel and serves) is `slow`.
  The fast tier keeps real parts all the same: `ampflow` CLI subprocesses (test_cli.py), the
  real kfp compiler, gRPC and REST over loopback to an in-process server, real TF, SavedModels
  and TFLite interpreters.
- No test carries the same marker twice.
- `tests/file_durations.json` (the order the files run in, longest first) names no file that is
  gone.
- No test starts a child with `preexec_fn`: it makes Python fork() with gRPC's fork handlers in
  a process that runs gRPC, and gRPC can abort the child (tests/full_disk.py says how).
- No test imports `conftest`: a run over several dirs imports one of the conftest.py files as
  `conftest` and the others' tests get it (`pytest tests/serving tests/components/deploy_serving`
  was an ImportError). Helpers live in modules named for what they hold (deploy_helpers.py,
  serving_helpers.py, ...), and no two of those share a name, for the same reason.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# Words in a fixture's or test's source that mean "trains or builds a large model".
# The soak and the fuzz run a server under load for tens of seconds: slow too.
# (`run_local` after a dot is the module in an import path, e.g. `pipeline.run_local import
# LocalRunConfig`, not a run.)
HEAVY = re.compile(r"\b(resnet50|mobilenet_v2|trained_model|run_demo|(?<!\.)run_local"
                   r"|serving_soak|serving_fuzz)\b"
                   # a fresh venv with pip installs; a serving process (imports TF, serves)
                   r"|\bvenv\.EnvBuilder\b|\bServeProcess\(|\bexec ampflow serve\b"
                   r"|\"ampflow(\.serving)?\.cli\",\s*\"serve\"")


@functools.cache
def _parsed(path: Path) -> tuple[str, ast.Module]:
    """(text, syntax tree) of `path`, parsed once for every rule here (~0.6 CPU-s a pass)."""
    text = path.read_text()
    return text, ast.parse(text, str(path))


@functools.cache
def _functions(path: Path) -> list:
    """(node, decorators, source, file text) of every function in `path`."""
    text, tree = _parsed(path)
    lines = text.splitlines(keepends=True)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            decorators = [ast.unparse(d) for d in node.decorator_list]
            # (ast.get_source_segment splits the whole file again for every node)
            body = "".join(lines[node.lineno - 1:node.end_lineno])
            found.append((node, decorators, body + " ".join(decorators), text))
    return found


def _visible(path: Path, name: str, fixtures: dict) -> tuple[Path, str] | None:
    """The fixture `name` as a test in `path` sees it: its own file's, else the nearest
    conftest.py's (several files define a fixture of the same name, e.g. `server`)."""
    for where in (path, *(d / "conftest.py" for d in path.parents if d.is_relative_to(TESTS))):
        if (where, name) in fixtures:
            return where, name
    return None


def _heavy_fixtures() -> tuple[set[tuple[Path, str]], dict]:
    """Fixtures whose source trains (or serves, or builds a venv), or which depend on one."""
    fixtures = {}
    for path in TESTS.rglob("*.py"):
        for node, decorators, source, _ in _functions(path):
            if any("fixture" in d for d in decorators):
                fixtures[path, node.name] = ([a.arg for a in node.args.args], source)
    heavy: set[tuple[Path, str]] = set()
    grew = True
    while grew:
        grew = False
        for key, (args, source) in fixtures.items():
            if key not in heavy and (HEAVY.search(source) or heavy & {
                    _visible(key[0], a, fixtures) for a in args}):
                heavy.add(key)
                grew = True
    return heavy, fixtures


def _tests():
    for path in sorted(TESTS.rglob("test_*.py")):
        for node, decorators, source, text in _functions(path):
            if node.name.startswith("test_"):
                module_marks = " ".join(re.findall(r"^pytestmark\s*=.*$", text, re.M))
                yield path, node, decorators, source, module_marks


def test_tests_that_train_or_build_large_models_are_marked_slow():
    heavy, fixtures = _heavy_fixtures()
    unmarked = [
        f"{path.relative_to(TESTS)}::{node.name}"
        for path, node, decorators, source, module_marks in _tests()
        if (HEAVY.search(source)
            or heavy & {_visible(path, a.arg, fixtures) for a in node.args.args})
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


def test_the_file_durations_name_only_test_files_that_exist():
    # tests/file_durations.json orders the files longest first (tests/suite_order.py); a
    # renamed or split file would keep its old name there and its new one would run as if short
    from suite_order import read_durations

    stale = [name for name in read_durations() if not (TESTS.parent / name).is_file()]
    assert stale == []


def test_no_test_starts_a_child_with_preexec_fn():
    users = [f"{path.relative_to(TESTS)}:{number}"
             for path in sorted(TESTS.rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if re.search(r"\bpreexec_fn\s*=", line)]
    assert users == []


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, top-level module) of every import in `path`, inside functions too."""
    found = []
    for node in ast.walk(_parsed(path)[1]):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


def test_no_test_imports_conftest():
    importers = [f"{path.relative_to(TESTS)}:{line}"
                 for path in sorted(TESTS.rglob("*.py"))
                 for line, module in _imported_modules(path) if module == "conftest"]
    assert importers == []


def test_no_two_test_helper_modules_share_a_name():
    # each test dir is put on sys.path: two helpers named alike would shadow one another
    helpers: dict[str, list[str]] = {}
    for path in sorted(TESTS.rglob("*.py")):
        if path.name != "conftest.py" and path.name != "__init__.py" \
                and not path.name.startswith("test_"):
            helpers.setdefault(path.name, []).append(str(path.relative_to(TESTS)))
    assert {name: paths for name, paths in helpers.items() if len(paths) > 1} == {}
