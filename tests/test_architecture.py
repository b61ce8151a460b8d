"""The architecture, checked statically (no imports run), so it cannot quietly erode.

- Every `ampflow...` import in our code resolves through pyproject's package mapping to a file,
  and every name imported from it is defined there (or is a submodule): an editor or type
  checker following the same mapping finds what Python finds.
- The floors point one way: `ampflow.cli` (cli/, the `ampflow` command) on top imports the
  step CLIs; the pipeline layer (`pipeline/`) wires the steps (`components/`); the steps share
  code only through the library beneath them (`ampflow.data`, `ampflow.modeling`,
  `ampflow.artifacts`), never by importing one another; the library imports serving's model
  format and the root, never a step; serving imports neither (a serving image runs without
  them); the root package (src/ampflow/, the library aside) imports nothing above it.
- Our modules have no import cycle (imports inside functions count: they hide a cycle, they do
  not remove it).

Each rule is a function of the modules it reads (name → file), so a test can plant a
violation (a temporary file standing in for, or beside, our modules) and see the rule catch it.
"""

from __future__ import annotations

import ast
import tomllib
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@cache
def _package_dirs() -> dict[str, Path]:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return {name: ROOT / folder for name, folder in setuptools["package-dir"].items()}


def _module_file(module: str) -> Path | None:
    """The file that `module` (an `ampflow...` dotted name) is, by the static mapping."""
    dirs = _package_dirs()
    parts = module.split(".")
    for cut in range(len(parts), 0, -1):
        base = ".".join(parts[:cut])
        if base in dirs:
            path = dirs[base].joinpath(*parts[cut:])
            if (path / "__init__.py").is_file():
                return path / "__init__.py"
            if path.with_suffix(".py").is_file():
                return path.with_suffix(".py")
            return None
    return None


@cache
def _modules() -> dict[str, Path]:
    """Every module of ours: dotted name → file."""
    out = {}
    for package, folder in _package_dirs().items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([package, *parts])] = path
    return out


@cache
def _defined_names(path: Path) -> frozenset[str]:
    """Top-level names a module defines (functions, classes, assignments, imports)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.If | ast.Try):  # `if TYPE_CHECKING:` / optional imports
            for sub in ast.walk(node):
                if isinstance(sub, ast.Import | ast.ImportFrom):
                    names.update((a.asname or a.name).split(".")[0] for a in sub.names)
    return frozenset(names)


@cache
def _imports(path: Path, module: str) -> tuple[tuple[str, str | None, int], ...]:
    """`(imported module, imported name or None, line)` for each ampflow import in `path`."""
    out = []
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, None, node.lineno) for a in node.names
                    if a.name.split(".")[0] == "ampflow"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if base.split(".")[0] == "ampflow":
                out += [(base, a.name, node.lineno) for a in node.names]
    return tuple(out)


def _edges(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module → the ampflow modules it imports (a `from pkg import submodule` names the sub)."""
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for target, name, _ in _imports(path, module):
            if name and f"{target}.{name}" in modules:
                graph[module].add(f"{target}.{name}")
            elif target in modules:
                graph[module].add(target)
    return graph


def test_every_ampflow_import_resolves_statically():
    unresolved = []
    for module, path in _modules().items():
        for target, name, line in _imports(path, module):
            where = f"{path.relative_to(ROOT)}:{line}"
            file = _module_file(target)
            if file is None:
                unresolved.append(f"{where}: no module {target}")
            elif name and name != "*" and name not in _defined_names(file) \
                    and _module_file(f"{target}.{name}") is None:
                unresolved.append(f"{where}: {target} defines no {name}")
    assert unresolved == []


def _imports_of(modules: dict[str, Path], importers: tuple[str, ...],
                imported: tuple[str, ...]) -> list[str]:
    """Each import (at the top or inside a function) of an `imported` module by an `importers`
    one, as `file:line imports module`."""
    return [
        f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{line} imports {target}"
        for module, path in modules.items()
        if module.startswith(importers)
        for target, _, line in _imports(path, module)
        if target.startswith(imported)
    ]


# The library floor: what two steps share, in the root package's folder but a floor of its own
# above serving (it speaks serving's model format) and beneath the steps.
LIBRARY = ("ampflow.data", "ampflow.modeling", "ampflow.artifacts")


def _in(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def _floor(module: str) -> str:
    """The floor `module` belongs to: `library` (LIBRARY), else its package-dir entry:
    `ampflow` (the root package, src/ampflow/), `ampflow.cli`, `ampflow.components`,
    `ampflow.pipeline` or `ampflow.serving`."""
    if _in(module, LIBRARY):
        return "library"
    parts = module.split(".")
    return next(".".join(parts[:cut]) for cut in range(len(parts), 0, -1)
                if ".".join(parts[:cut]) in _package_dirs())


def _step(module: str) -> str | None:
    """The step (`components/<step>/`) `module` is in, or None."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["ampflow", "components"] else None


def _imports_across_steps(modules: dict[str, Path]) -> list[str]:
    """Each import in one step of another step's module, as `file:line imports x`."""
    found = []
    for module, path in modules.items():
        step = _step(module)
        if step is None:
            continue
        for target, name, line in _imports(path, module):
            imported = f"{target}.{name}" if name and name != "*" else target
            other = _step(imported)
            if other is not None and other != step:
                where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
                found.append(f"{where}:{line} imports {imported}")
    return found


def _library_imports_above(modules: dict[str, Path]) -> list[str]:
    """Each import in the library of a step, the pipeline or the CLI."""
    return _imports_of({m: p for m, p in modules.items() if _in(m, LIBRARY)}, LIBRARY,
                       ("ampflow.components", "ampflow.pipeline", "ampflow.cli"))


def _root_package_imports_above(modules: dict[str, Path]) -> list[str]:
    """Each import in the root package of a module of another floor, as `file:line imports x`."""
    found = []
    for module, path in modules.items():
        if _floor(module) != "ampflow":
            continue
        for target, name, line in _imports(path, module):
            imported = f"{target}.{name}" if name and name != "*" else target
            if imported == "ampflow" or _floor(imported) != "ampflow":
                where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
                found.append(f"{where}:{line} imports {imported}")
    return found


def test_step_and_serving_layers_never_import_the_pipeline_layer():
    assert _imports_of(_modules(), ("ampflow.components", "ampflow.serving"),
                       ("ampflow.pipeline",)) == []


def _cycles(modules: dict[str, Path]) -> list[str]:
    """Each import cycle among `modules`, as `a → b → a`."""
    graph = _edges(modules)
    # A package's __init__ that re-exports its own submodules is not a cycle of design: drop
    # the edge from a submodule to its own package's __init__ only when that __init__ is the
    # one importing it (the re-export), which Python resolves by loading the package first.
    for module in graph:
        parent = module.rpartition(".")[0]
        if parent in graph and module in graph[parent]:
            graph[module].discard(parent)
    cycles = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" → ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return cycles


def test_no_import_cycles_between_our_modules():
    assert _cycles(_modules()) == []


def test_serving_never_imports_the_step_layer():
    # The server runs in a serving image without the steps' code; what both need (the model
    # format) lives in serving/ and the steps import it, never the other way.
    assert _imports_of(_modules(), ("ampflow.serving",),
                       ("ampflow.components", *LIBRARY)) == []


def test_no_step_imports_another_step():
    # TFX's components share code only through libraries beneath them: a step can be read,
    # changed and tested without the others.
    assert _imports_across_steps(_modules()) == []


def test_the_library_imports_no_step():
    assert _library_imports_above(_modules()) == []


def test_a_planted_import_of_another_step_fails_the_rule(tmp_path):
    source = ("from ampflow.components.train.step import run_train\n\n\n"
              "def later():\n    from ampflow.components.export_savedmodel import signatures\n")
    modules = _planted(tmp_path, "ampflow.components.deploy_serving.planted", source)
    planted = tmp_path / "ampflow.components.deploy_serving.planted.py"
    assert _imports_across_steps(modules) == [
        f"{planted}:1 imports ampflow.components.train.step.run_train",
        f"{planted}:5 imports ampflow.components.export_savedmodel.signatures"]
    library = _planted(tmp_path, "ampflow.data.planted", source)
    assert len(_library_imports_above(library)) == 2


def test_the_root_package_imports_nothing_above_it():
    # src/ampflow/ is the bottom floor (errors, files, the CLI's helpers): every other floor
    # imports it, so one import up from it is a cycle waiting for its first caller.
    assert _root_package_imports_above(_modules()) == []


def test_the_command_line_dispatcher_is_the_top_floor():
    # ampflow.cli imports every step's CLI; nothing of ours imports it back (the console
    # script and `python -m ampflow.cli` run it from outside).
    importers = [m for m, path in _modules().items() if not m.startswith("ampflow.cli")
                 for target, name, _ in _imports(path, m)
                 if target == "ampflow.cli" or f"{target}.{name}" == "ampflow.cli"]
    assert importers == []
    imported = {target for target, _, _ in _imports(_modules()["ampflow.cli"], "ampflow.cli")}
    assert {"ampflow.components.train", "ampflow.serving", "ampflow.pipeline"} <= imported


def _planted(tmp_path: Path, module: str, source: str, instead_of: str | None = None):
    """Our modules with `module` (a temporary file holding `source`) added, or standing in for
    `instead_of`'s file: the rules read files, so a planted one is read like ours."""
    path = tmp_path / f"{module}.py"
    path.write_text(source)
    modules = dict(_modules())
    if instead_of:
        del modules[instead_of]
    modules[module] = path
    return modules


def test_a_planted_serving_import_of_a_step_fails_the_rule(tmp_path):
    source = ('"""A serving module that reads the train step\'s config."""\n\n\n'
              "def handler():\n    from ampflow.components.train.config import TrainConfig\n"
              "\n    return TrainConfig\n")
    modules = _planted(tmp_path, "ampflow.serving.planted", source)
    assert _imports_of(modules, ("ampflow.serving",), ("ampflow.components",)) == [
        f"{tmp_path / 'ampflow.serving.planted.py'}:5 imports ampflow.components.train.config"]


def test_a_planted_root_import_of_an_upper_floor_fails_the_rule(tmp_path):
    # both spellings: `from ampflow import serving` and a late `import ampflow.pipeline...`
    source = ("from ampflow import errors, serving\n\n\n"
              "def later():\n    import ampflow.pipeline.settings\n")
    modules = _planted(tmp_path, "ampflow.planted", source)
    planted = tmp_path / "ampflow.planted.py"
    assert _root_package_imports_above(modules) == [
        f"{planted}:1 imports ampflow.serving", f"{planted}:5 imports ampflow.pipeline.settings"]


def test_a_planted_late_import_cycle_fails_the_rule(tmp_path):
    # The cycle the string-named registry hid, written as an import: the root package's
    # command runner asking the dispatcher (which imports it) for its commands, in a function.
    command = _modules()["ampflow.command"]
    source = command.read_text() + ("\n\ndef every_command():\n"
                                    "    from ampflow.cli import COMMANDS\n\n"
                                    "    return COMMANDS\n")
    modules = _planted(tmp_path, "ampflow.command", source, instead_of="ampflow.command")
    assert "ampflow.cli → ampflow.command → ampflow.cli" in _cycles(modules)
    assert _root_package_imports_above(modules)  # and it points up, as the rule says


# Serving's own floors, bottom up (issue 47): the base modules every folder may read (the model
# format, the configs and TF Serving's channel arguments, the status codes, compute precision),
# the models, the core over them, the transports, the protocol doors over core and transports,
# and the assembly (server, workers, the CLI, the clients) on top. A module imports only its own
# floor or those below it.
SERVING_FLOORS = (
    ("base", ("ampflow.serving.model_format", "ampflow.serving.config",
              "ampflow.serving.status", "ampflow.serving.compute_precision",
              "ampflow.serving.cpu_features", "ampflow.serving.channel_arguments")),
    ("models", ("ampflow.serving.models",)),
    ("core", ("ampflow.serving.core",)),
    ("transport", ("ampflow.serving.transport",)),
    ("protocols", ("ampflow.serving.protocols",)),
    ("top", ("ampflow.serving",)),
)


def _serving_floor(module: str, floors=SERVING_FLOORS) -> int:
    """The index in `floors` of a serving module's floor (the first prefix it matches)."""
    return next(i for i, (_, prefixes) in enumerate(floors)
                if any(module == p or module.startswith(f"{p}.") for p in prefixes))


def _serving_back_arrows(modules: dict[str, Path], floors=SERVING_FLOORS) -> list[str]:
    """Each import in serving of a module on a higher serving floor, as `file:line imports x`."""
    found = []
    for module, path in modules.items():
        if not module.startswith("ampflow.serving."):
            continue
        for target, name, line in _imports(path, module):
            imported = f"{target}.{name}" if name and f"{target}.{name}" in modules else target
            if not imported.startswith("ampflow.serving."):
                continue
            low, high = _serving_floor(module, floors), _serving_floor(imported, floors)
            if high > low:
                where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
                found.append(f"{where}:{line} imports {imported} "
                             f"({floors[low][0]} -> {floors[high][0]})")
    return list(dict.fromkeys(found))  # one line per import, however many names it takes


def test_serving_floors_point_one_way():
    assert _serving_back_arrows(_modules()) == []


def test_a_planted_serving_back_arrow_fails_the_rule(tmp_path):
    # the arrows issue 47 removed, planted again: a model module reaching up into the core
    # (late, inside a function), and a base module reading the transport
    source = "def later():\n    from ampflow.serving.core.inference import InferenceCore\n"
    modules = _planted(tmp_path, "ampflow.serving.models.planted", source)
    assert _serving_back_arrows(modules) == [
        f"{tmp_path / 'ampflow.serving.models.planted.py'}:2 imports "
        "ampflow.serving.core.inference (models -> core)"]
    modules = _planted(tmp_path, "ampflow.serving.planted_base",
                       "from ampflow.serving.transport import http\n")
    floors = (("base", (*SERVING_FLOORS[0][1], "ampflow.serving.planted_base")),
              *SERVING_FLOORS[1:])
    assert _serving_back_arrows(modules, floors) == [
        f"{tmp_path / 'ampflow.serving.planted_base.py'}:1 imports "
        "ampflow.serving.transport.http (base -> transport)"]


def _registry_reaches(paths: list[Path]) -> list[str]:
    """`file:line` of each `.registry` attribute read in `paths` (`core.registry.resolve`)."""
    return [f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{node.lineno}"
            for path in paths for node in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(node, ast.Attribute) and node.attr == "registry"]


def test_the_protocol_doors_ask_the_core_never_its_registry():
    # Readiness, metadata, status and reloads are the core's answers (InferenceCore.ready,
    # resolve, version_states, ...): a door reaching past it to the registry decides anew, per
    # protocol, what "ready" or "known" means.
    assert _registry_reaches(sorted((ROOT / "serving" / "protocols").rglob("*.py"))) == []


def test_a_planted_reach_through_the_core_to_its_registry_is_listed(tmp_path):
    door = tmp_path / "door.py"
    door.write_text("def ready(core):\n    return core.registry.any_available()\n")
    assert _registry_reaches([door]) == [f"{door}:2"]


def test_no_module_imports_another_modules_private_name():
    # A `_name` is its module's own; sharing it means it belongs in a module both import.
    private = [
        f"{path.relative_to(ROOT)}:{line} imports {name} from {target}"
        for module, path in _modules().items()
        if module.startswith("ampflow.serving")
        for target, name, line in _imports(path, module)
        if name and name.startswith("_") and not name.startswith("__") and target != module
    ]
    assert private == []


# The names that cross a wire (a signature key, its outputs) are model_format's constants; a
# string literal equal to one of them elsewhere in the steps or the library is a second
# declaration. What is left is another name spelled alike, each counted with what it names.
WIRE_NAMES = {"serving_default": "DEFAULT_SIGNATURE", "probabilities": "PROBABILITIES_OUTPUT",
              "class_ids": "CLASS_IDS_OUTPUT"}
SPELLED_ALIKE = {
    "src/ampflow/modeling/user_model.py": 1,  # PROBABILITIES_LAYER: the Keras output layer's name
    "src/ampflow/modeling/heads.py": 1,  # that layer's name in the built-in models
    "src/ampflow/artifacts/canary_examples.py": 2,  # canary_examples.npz's own keys
}


def _wire_literals(path: Path) -> list[tuple[int, str]]:
    """(line, literal) of every string constant equal to a wire name (docstrings never are)."""
    tree = ast.parse(path.read_text(), str(path))
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and node.value in WIRE_NAMES]


def test_components_take_the_wire_names_from_model_format():
    folders = [ROOT / "components",
               *(ROOT / "src" / "ampflow" / p.split(".")[1] for p in LIBRARY)]
    found = {str(path.relative_to(ROOT)): _wire_literals(path)
             for folder in folders for path in sorted(folder.rglob("*.py"))}
    found = {path: hits for path, hits in found.items() if hits}
    extra = [f"{path}:{line}: {value!r} (use model_format.{WIRE_NAMES[value]})"
             for path, hits in found.items() if len(hits) > SPELLED_ALIKE.get(path, 0)
             for line, value in hits]
    assert not extra, "\n".join(extra)
    assert {path: len(hits) for path, hits in found.items()} == SPELLED_ALIKE  # none went stale


# Every hand-written source file stays under this many lines (issue 41): past it a file holds
# more than one role, and splitting it by role is the fix (protoc's generated *_pb2 files are
# not ours to split).
MAX_SOURCE_LINES = 600


def _source_folders() -> list[Path]:
    """The package folders pyproject maps, the benchmarks and the client distribution's src."""
    return [*_package_dirs().values(), ROOT / "benchmarks", ROOT / "clients" / "python" / "src"]


def _long_files(folders: list[Path], limit: int = MAX_SOURCE_LINES) -> list[str]:
    """`path: N lines` for each .py under `folders` of `limit` lines or more, longest first."""
    lengths = {}
    for folder in folders:
        for path in folder.rglob("*.py"):
            if "_pb2" in path.name or "__pycache__" in path.parts:
                continue
            lengths[path] = len(path.read_text().splitlines())
    return [f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: {n} lines"
            for path, n in sorted(lengths.items(), key=lambda item: -item[1]) if n >= limit]


def test_every_source_file_is_under_600_lines():
    assert _long_files(_source_folders()) == []


def test_a_planted_long_file_is_listed_and_a_generated_one_is_not(tmp_path):
    (tmp_path / "long.py").write_text("x = 1\n" * MAX_SOURCE_LINES)
    (tmp_path / "short.py").write_text("x = 1\n" * (MAX_SOURCE_LINES - 1))
    (tmp_path / "big_pb2.py").write_text("x = 1\n" * 5000)
    assert _long_files([tmp_path]) == [f"{tmp_path / 'long.py'}: {MAX_SOURCE_LINES} lines"]


# A module docstring says what the module is for and why, in a few lines: measurements and
# the story of a change go stale in code, so they live in docs/ (explanation/, results.md).
# The benchmarks are not held to it: a benchmark's docstring is its report's method.
MAX_MODULE_DOCSTRING_LINES = 20


def _long_module_docstrings(folders: list[Path],
                            limit: int = MAX_MODULE_DOCSTRING_LINES) -> list[str]:
    """`path: N lines` for each module under `folders` whose docstring runs past `limit`."""
    found = []
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            if "_pb2" in path.name or "__pycache__" in path.parts:
                continue
            doc = ast.get_docstring(ast.parse(path.read_text(), str(path)), clean=False)
            if doc and len(doc.splitlines()) > limit:
                where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
                found.append(f"{where}: {len(doc.splitlines())} lines")
    return found


def test_every_module_docstring_is_at_most_20_lines():
    folders = [*_package_dirs().values(), ROOT / "clients" / "python" / "src"]
    assert _long_module_docstrings(folders) == []


def test_a_planted_long_module_docstring_is_listed(tmp_path):
    body = "\n".join(f"Line {i}." for i in range(2, MAX_MODULE_DOCSTRING_LINES + 1))
    (tmp_path / "long.py").write_text(f'"""Summary.\n{body}\nOne too many.\n"""\n')
    (tmp_path / "short.py").write_text(f'"""Summary.\n{body}\n"""\n\nx = """{body}"""\n')
    (tmp_path / "none.py").write_text("x = 1\n")
    assert _long_module_docstrings([tmp_path]) == [
        f"{tmp_path / 'long.py'}: {MAX_MODULE_DOCSTRING_LINES + 1} lines"]


# --- one modality seam ------------------------------------------------------------------------
# What differs between image and text lives behind one seam (ampflow.data.modalities, each step's
# modalities.py): a step asks for its modality once and never branches on image or text. A
# branch is a call of `is_text`, a `.is_text` attribute, or a comparison with MODALITY_IMAGE /
# MODALITY_TEXT, or with "image" / "text" where the other side reads a `modality`.
_MODALITY_NAMES = {"MODALITY_IMAGE", "MODALITY_TEXT"}
_MODALITY_WORDS = {"image", "text"}
# The seam's own modules, where a modality's name may decide (they map it to what differs).
_SEAM = ("ampflow.data.modality", "ampflow.data.modalities")
# The branches left outside the seam, by file, and why each stays.
_MODALITY_BRANCHES_ALLOWED = {
    # Each reader refuses the other modality's prepared dir with one line naming its sibling:
    # a guard of its own input, not a choice between the two.
    "src/ampflow/data/input_pipeline.py": 1,
    "src/ampflow/data/text_input.py": 1,
}


def _is_seam(module: str) -> bool:
    return module in _SEAM or (module.startswith("ampflow.components.")
                               and module.endswith(".modalities"))


def _modality_branches(modules: dict[str, Path]) -> list[str]:
    """Each image/text branch in the steps and the library outside the seam, `file:line`."""
    found = []
    for module, path in modules.items():
        if _is_seam(module) or not (_in(module, LIBRARY + ("ampflow.components",))):
            continue
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            if _is_modality_branch(node, source):
                where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
                found.append(f"{where}:{node.lineno}")
    return found


def _is_modality_branch(node: ast.AST, source: str) -> bool:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return node.func.id == "is_text"
    if isinstance(node, ast.Attribute):
        return node.attr == "is_text"
    if not isinstance(node, ast.Compare):
        return False
    sides = [node.left, *node.comparators]
    if any(getattr(side, "id", getattr(side, "attr", None)) in _MODALITY_NAMES
           for side in sides):
        return True
    return (any(isinstance(s, ast.Constant) and s.value in _MODALITY_WORDS for s in sides)
            and any("modality" in (ast.get_source_segment(source, s) or "") for s in sides))


def _by_file(branches: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for branch in branches:
        file = branch.rpartition(":")[0]
        counts[file] = counts.get(file, 0) + 1
    return counts


def test_image_and_text_branch_only_inside_the_modality_seam():
    assert _by_file(_modality_branches(_modules())) == _MODALITY_BRANCHES_ALLOWED


def test_a_planted_modality_branch_outside_the_seam_fails_the_rule(tmp_path):
    source = ("from ampflow.data.modality import MODALITY_TEXT, is_text\n\n\n"
              "def pick(info, trained):\n"
              "    if is_text(info) or trained.is_text:\n        return 1\n"
              "    if info.get('modality') == 'image':\n        return 2\n"
              "    return 3 if info['modality'] != MODALITY_TEXT else 4\n")
    ours = _modality_branches(_modules())
    modules = _planted(tmp_path, "ampflow.components.deploy_serving.planted", source)
    planted = tmp_path / "ampflow.components.deploy_serving.planted.py"
    assert sorted(set(_modality_branches(modules)) - set(ours)) == [
        f"{planted}:5", f"{planted}:7", f"{planted}:9"]
    assert len(_modality_branches(modules)) == len(ours) + 4  # line 5 holds two
    seam = _planted(tmp_path, "ampflow.components.deploy_serving.modalities", source)
    assert _modality_branches(seam) == ours  # the seam may choose
    unrelated = "def f(name, kind):\n    return name == 'text' or kind == 'image'\n"
    assert _modality_branches(_planted(tmp_path, "ampflow.data.planted", unrelated)) == ours
