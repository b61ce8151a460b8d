"""The README and the docs site stay true to the code.

- `mkdocs build --strict` passes: no broken link or anchor, no nav entry to a missing page, and
  the generated pages (the CLI reference from the argparse parsers, the pipeline parameters from
  `pipeline/parameters.py`) hold every command and parameter the code has now.
- Every `ampflow <command> --flag` in a shell block of the README or a docs page names a command
  and flags that the real parser accepts, so a renamed flag cannot linger in the docs.
- Every shell block of the README and the docs says how it is kept true, and is: it runs here
  (`<!-- runs-in-tests -->`: as written, in a scratch dir that holds only the checkout's
  `.venv` and `docs/` as links, offline; a block of `ampflow` commands only runs them through
  the CLI's `main` in this process, which skips a TensorFlow start-up per command), or a named
  test runs the same commands (`<!-- run-by: tests/… -->`: the expensive ones, a pipeline run
  or a server), or its first line says what it needs that a test machine lacks
  (`# needs: a cluster`, visible to the reader), or it is a synopsis with placeholders
  (`# synopsis: …`). A documented command that fails therefore fails the suite (issue 38).
- The serving how-to's `--model-config-file` example serves a model (the README's earlier one,
  `k8s/base/models.config`, pointed at the TF Serving pod's /models and failed locally).
- The demo output shown in the README and the tutorial names the pipeline's real tasks (a renamed
  step shows there as a stale line).
- The README stays a first screen: short, its links resolve, its `make` targets exist.
The step-by-step block itself is run by tests/test_readme_step_by_step.py.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ports import free_port

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
RUNNABLE_BLOCK = re.compile(r"<!-- runs-in-tests -->\s*```bash\n(.*?)```", re.DOTALL)
SHELL_BLOCK = re.compile(r"^[ \t]*```(?:bash|sh|shell)\n(.*?)^[ \t]*```", re.DOTALL | re.MULTILINE)
MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _documents() -> list[Path]:
    return [README, *sorted(p for p in DOCS.rglob("*.md")
                            if "examples" not in p.relative_to(DOCS).parts)]


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse has no public accessor for its subparsers
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("ampflow's parser has no subcommands")


def ampflow_command_lines(text: str) -> list[str]:
    """Each `ampflow …` command in the shell blocks of `text`, continuation lines joined."""
    commands = []
    for block in SHELL_BLOCK.findall(text):
        joined = re.sub(r"\\\n", " ", block)
        for line in joined.splitlines():
            for part in re.split(r"&&|\|\||;|\||&(?!\S)", line.split(" #", 1)[0]):
                words = part.strip().split()
                while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # VAR=value ampflow …
                    words = words[1:]
                if words and words[0] == "ampflow":
                    commands.append(" ".join(words))
    return commands


def unknown_flags(command: str, parser: argparse.ArgumentParser) -> list[str]:
    """The command or flags in `command` (`ampflow [global flags] <command> …`) the parser lacks."""
    commands = _subcommands(parser)
    words = shlex.split(command.replace("[", " ").replace("]", " "), posix=True)[1:]
    global_flags = set(parser._option_string_actions)
    while words and words[0].startswith("-"):  # ampflow --quiet train …
        flag = words.pop(0).split("=", 1)[0]
        if flag not in global_flags:
            return [flag]
        if parser._option_string_actions[flag].nargs != 0 and words and "=" not in flag:
            words.pop(0)
    if not words or words[0] in ("<command>", "…"):
        return []
    if words[0] not in commands:
        return [words[0]]
    accepted = set(commands[words[0]]._option_string_actions)
    flags = [flag.split("=", 1)[0] for word in words[1:] for flag in word.split("|")
             if flag.startswith("--")]
    return [flag for flag in flags if flag not in accepted]


def test_command_line_check_catches_a_misspelt_flag_and_command():
    from ampflow.cli import build_parser

    parser = build_parser()
    text = ("```bash\nampflow train --data-dir D \\\n  --epoch 3\n"
            "ampflow --quiet trian --x 1 && ampflow serve --port 8500 &\n```\n")
    lines = ampflow_command_lines(text)
    assert lines == ["ampflow train --data-dir D --epoch 3", "ampflow --quiet trian --x 1",
                     "ampflow serve --port 8500"]
    assert [unknown_flags(line, parser) for line in lines] == [["--epoch"], ["trian"], []]


def test_every_documented_ampflow_command_uses_real_flags():
    from ampflow.cli import build_parser

    parser = build_parser()
    wrong = {}
    for path in _documents():
        for command in ampflow_command_lines(path.read_text()):
            if bad := unknown_flags(command, parser):
                wrong.setdefault(str(path.relative_to(ROOT)), []).append((command, bad))
    assert not wrong, wrong


def test_docs_site_builds_strict_with_every_command_and_parameter(tmp_path):
    from ampflow.cli import build_parser
    from ampflow.pipeline.parameters import PIPELINE_PARAMETERS

    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "--site-dir", str(site)], cwd=ROOT, capture_output=True, text=True,
                          env={"PATH": str(Path(sys.executable).parent), "NO_MKDOCS_2_WARNING": "1",
                               "HOME": str(tmp_path)}, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "WARNING" not in output, output[-4000:]
    cli_page = (site / "reference" / "cli" / "index.html").read_text()
    for name in _subcommands(build_parser()):
        assert f"usage: ampflow {name} " in cli_page, name
    parameters_page = (site / "reference" / "pipeline-parameters" / "index.html").read_text()
    for name in PIPELINE_PARAMETERS:
        assert f"<code>{name}</code>" in parameters_page, name
    assert "generated:" not in cli_page + parameters_page  # every marker was replaced


def _reference_hook():
    """docs/hooks/generated_reference.py, imported by path (docs/ is no package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("generated_reference",
                                                  DOCS / "hooks" / "generated_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_reference_pages_hold_what_the_code_generates():
    """cli.md and pipeline-parameters.md are read as Markdown too: their text must be current."""
    hook = _reference_hook()
    assert hook.stale_pages() == [], f"run {hook.REGENERATE}"
    cli_page = (DOCS / "reference" / "cli.md").read_text()
    from ampflow.cli import build_parser

    for name in _subcommands(build_parser()):
        assert f"usage: ampflow {name} " in cli_page, name
    from ampflow.pipeline.parameters import PIPELINE_PARAMETERS

    parameters_page = (DOCS / "reference" / "pipeline-parameters.md").read_text()
    for name in PIPELINE_PARAMETERS:
        assert f"| `{name}` |" in parameters_page, name


def test_reference_check_names_a_stale_page_and_the_command(tmp_path, monkeypatch, capsys):
    """A flag renamed without regenerating: `--check` says which page and how to fix it."""
    hook = _reference_hook()
    for page, _generator in hook.BLOCKS.values():
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / page).write_text((DOCS / page).read_text())
    assert hook.stale_pages(tmp_path) == []
    cli = tmp_path / "reference" / "cli.md"
    rewrapped = cli.read_text().replace("usage: ampflow train ", "usage: ampflow train\n    ", 1)
    cli.write_text(rewrapped)  # another Python's argparse wrapping: the same words, not stale
    assert hook.stale_pages(tmp_path) == []
    cli.write_text(cli.read_text().replace("--epochs", "--epoch", 1))
    assert hook.stale_pages(tmp_path) == ["reference/cli.md"]
    monkeypatch.setattr(hook, "DOCS", tmp_path)
    assert hook.main(["--check"]) == 1
    assert "docs/reference/cli.md differs from the code: run python docs/hooks/" in (
        capsys.readouterr().err)
    assert hook.main([]) == 0 and hook.stale_pages(tmp_path) == []


def test_reference_text_is_the_same_whatever_the_machine_sets(monkeypatch):
    """$AMPFLOW_IMAGE shows in `compile --image`'s help, $COLUMNS wraps it: neither may leak."""
    hook = _reference_hook()
    plain = hook.cli_reference()
    monkeypatch.setenv("AMPFLOW_IMAGE", "registry.example/ampflow:9")
    monkeypatch.setenv("COLUMNS", "40")
    assert hook.cli_reference() == plain
    assert os.environ["AMPFLOW_IMAGE"] == "registry.example/ampflow:9"


# What a shell block needs that a test machine lacks: its first line, `# needs: a, b`.
NEEDS = ("a cluster", "Docker", "a GPU", "the network", "a running server", "your own data")
NEEDS_LINE = re.compile(r"^# needs: (.+)$")
SYNOPSIS_LINE = re.compile(r"^# synopsis: \S")
# A named test runs the block's commands: the marker before the block. The tutorial's block
# and the serving config example have their own markers, read by their own tests.
RUN_BY = re.compile(r"^<!-- run-by: (\S+) -->$")
OWN_MARKERS = {"<!-- step-by-step:begin -->": "tests/test_readme_step_by_step.py",
               "<!-- serve-config-example: tests/test_docs_site.py serves a model with it -->":
                   "tests/test_docs_site.py"}


def shell_blocks() -> list[tuple[str, str, str]]:
    """(name, the last line before the block, the block) of every shell block."""
    found = []
    for path in _documents():
        text = path.read_text()
        for i, match in enumerate(SHELL_BLOCK.finditer(text)):
            before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
            found.append((f"{path.relative_to(ROOT)}#{i}", before, match.group(1)))
    return found


def how_checked(before: str, block: str) -> tuple[str, str]:
    """("runs", "") | ("run-by", test path) | ("needs", reasons) | ("synopsis", "") | ("", "")."""
    first = block.strip().splitlines()[0] if block.strip() else ""
    if before == "<!-- runs-in-tests -->":
        return "runs", ""
    if by := RUN_BY.match(before):
        return "run-by", by.group(1)
    if before in OWN_MARKERS:
        return "run-by", OWN_MARKERS[before]
    if needs := NEEDS_LINE.match(first):
        return "needs", needs.group(1)
    if SYNOPSIS_LINE.match(first):
        return "synopsis", ""
    return "", ""


def _named_in(test_source: str, command: str) -> bool:
    """`ampflow run-local …` is named in a test as `run-local`, `run_local` or `"run-local"`."""
    sub = command.split()[1]
    return sub in test_source or sub.replace("-", "_") in test_source


def test_every_shell_block_runs_here_or_is_run_by_a_named_test_or_says_what_it_needs():
    makefile_targets = set(re.findall(r"^([\w.-]+):", (ROOT / "Makefile").read_text(),
                                      flags=re.MULTILINE))
    wrong = {}
    for name, before, block in shell_blocks():
        kind, detail = how_checked(before, block)
        if kind == "":
            wrong[name] = "no marker: <!-- runs-in-tests -->, <!-- run-by: TEST -->, # needs: …"
        elif kind == "needs":
            unknown = [r for r in re.split(r",| and ", re.sub(r"\([^)]*\)", "", detail))
                       if r.strip() and r.strip() not in NEEDS]
            if unknown:
                wrong[name] = f"needs what? {unknown} (known: {NEEDS})"
        elif kind == "run-by":
            test = ROOT / detail
            if not test.is_file():
                wrong[name] = f"run by {detail}, which does not exist"
                continue
            source = test.read_text()
            missed = [c for c in ampflow_command_lines(f"```bash\n{block}```\n")
                      if not _named_in(source, c)]
            missed += [t for t in re.findall(r"^\s*make ([\w-]+)", block, flags=re.MULTILINE)
                       if t not in makefile_targets]
            if missed:
                wrong[name] = f"{detail} runs none of {missed}"
    assert not wrong, wrong


def test_the_block_check_tells_each_kind_apart():
    assert how_checked("<!-- runs-in-tests -->", "ampflow --help\n") == ("runs", "")
    assert how_checked("<!-- run-by: tests/x.py -->", "ampflow demo\n") == ("run-by",
                                                                          "tests/x.py")
    assert how_checked("", "# needs: a cluster\nkubectl get pods\n") == ("needs", "a cluster")
    assert how_checked("", "# synopsis: [--x]\nampflow train [--x]\n") == ("synopsis", "")
    assert how_checked("Some prose.", "ampflow train --epochs 3\n") == ("", "")


def _runnable_blocks() -> list[tuple[str, str]]:
    return [(name, block) for name, before, block in shell_blocks()
            if how_checked(before, block)[0] == "runs"]


def _only_ampflow(block: str) -> list[list[str]] | None:
    """Each `ampflow` command of a block made of nothing else (comments aside), else None."""
    joined = re.sub(r"\\\n", " ", block)
    commands = []
    for line in joined.splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if not line.startswith("ampflow "):
            return None
        words = shlex.split(line)
        if any(w in ("|", "&", "&&", ";", "||") for w in words):
            return None
        commands.append(words[1:])
    return commands


def test_the_docs_have_runnable_blocks():
    names = [name for name, _ in _runnable_blocks()]
    for page in ("how-to/gpu-node-pools.md", "how-to/own-model.md", "tutorial/install.md",
                 "how-to/kserve.md"):
        assert any(name.startswith(f"docs/{page}") for name in names), (page, names)


def _scratch_checkout(tmp_path: Path) -> Path:
    """A clean dir with what a reader of the docs has: the checkout's `.venv/` and `docs/`."""
    for name in (".venv", "docs"):
        (tmp_path / name).symlink_to(ROOT / name, target_is_directory=True)
    return tmp_path


def _one_short_epoch(argv: list[str]) -> list[str]:
    """`train … --epochs 6` as `train … --epochs 1 --steps-per-epoch 2`: the same command and
    flags, checked end to end (the model saved, reloaded, fine-tuned), at a test's cost."""
    if argv[:1] != ["train"] or "--epochs" not in argv:
        return argv
    at = argv.index("--epochs")
    return [*argv[:at], "--epochs", "1", "--steps-per-epoch", "2", *argv[at + 2:]]


def _trains(block: str) -> bool:
    return bool(re.search(r"ampflow (train|run-local|demo)\b", block))


@pytest.mark.parametrize("block", [pytest.param(b, marks=[pytest.mark.slow] if _trains(b) else [])
                                   for _, b in _runnable_blocks()],
                         ids=[name for name, _ in _runnable_blocks()])
def test_marked_docs_block_runs_as_written(block, tmp_path, monkeypatch, capsys):
    scratch = _scratch_checkout(tmp_path)
    commands = _only_ampflow(block)
    if commands is not None:  # in this process: no TensorFlow start-up per command
        from ampflow.cli import main

        monkeypatch.chdir(scratch)
        monkeypatch.setenv("HOME", str(scratch))
        monkeypatch.delenv("AMPFLOW_IMAGE", raising=False)
        for argv in commands:
            argv = _one_short_epoch([os.path.expanduser(a) for a in argv])
            code = main(argv)
            assert code == 0, (argv, capsys.readouterr().err[-3000:])
        return
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "TF_CPP_MIN_LOG_LEVEL": "2", "HOME": str(scratch)}
    env.pop("AMPFLOW_IMAGE", None)
    done = subprocess.run(["bash", "-c", "set -euo pipefail\n" + block], cwd=scratch, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])


def _free_port() -> int:
    """A loopback port for a server, below the ephemeral range (tests/ports.py says why)."""
    return free_port()


def _wait_until_listening(server: subprocess.Popen, log_path: Path, deadline_s: float) -> None:
    """Until the server prints that it listens (it loads its models first), fails on exit.

    Waiting on that line costs nothing; asking `ampflow model-status` in a loop instead
    started a Python process per try while the server was still importing TensorFlow.
    """
    deadline = time.monotonic() + deadline_s
    while "ampflow serve: listening on" not in log_path.read_text():
        assert server.poll() is None, log_path.read_text()[-3000:]
        assert time.monotonic() < deadline, log_path.read_text()[-3000:]
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.serving
@pytest.mark.timeout(300)
def test_serve_model_config_example_serves_the_demo_model(tmp_path):
    page = (DOCS / "how-to" / "serve-and-query.md").read_text()
    block = re.search(r"<!-- serve-config-example[^>]*-->\s*```bash\n(.*?)```", page,
                      flags=re.DOTALL)
    assert block, "serve-and-query.md lost its serve-config-example marker"
    port, metrics_port = _free_port(), _free_port()
    script = block.group(1)
    assert "ampflow serve --model-config-file" in script and "--metrics-port 9100" in script
    script = (script.replace("ampflow serve ", f"exec ampflow serve --port {port} ")
              .replace("--metrics-port 9100", f"--metrics-port {metrics_port}"))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    # the model the example names: a tiny real SavedModel where `make demo` deploys its own
    # (written in this process: the same code as `python -m ampflow.serving.testing`, without
    # a second TensorFlow start)
    from ampflow.serving import testing

    assert testing.main(["--base-path", str(tmp_path / "runs/demo/serving/ampflow")]) == 0
    log_path = tmp_path / "serve.log"
    log = log_path.open("w")
    server = subprocess.Popen(["bash", "-c", script], cwd=tmp_path, env=env, stdout=log,
                              stderr=subprocess.STDOUT)
    try:
        _wait_until_listening(server, log_path, deadline_s=120)
        status = subprocess.run(["ampflow", "model-status", "--port", str(port),
                                 "--model-name", "ampflow", "--wait-s", "5"], cwd=tmp_path,
                                env=env, capture_output=True, text=True, timeout=60)
        assert status.returncode == 0, (status.stdout, status.stderr,
                                        log_path.read_text()[-3000:])
        assert "AVAILABLE" in status.stdout
    finally:
        server.terminate()
        server.wait(timeout=60)
        log.close()


DEMO_LINE = re.compile(r"^  ([\w-]+) +(?:started|done in)", re.MULTILINE)
DEMO_OWN_LINES = {"serve", "gRPC"}  # the demo's serving lines, not pipeline tasks


@pytest.mark.parametrize("document", [README, DOCS / "tutorial" / "demo.md"],
                         ids=lambda p: p.name)
def test_demo_output_shown_names_the_pipelines_tasks(document, tmp_path):
    import yaml

    from ampflow.pipeline.pipeline import compile_pipeline

    ir = next(yaml.safe_load_all(Path(compile_pipeline(tmp_path / "p.yaml")).read_text()))
    dags = [ir["root"]["dag"]] + [c["dag"] for c in ir["components"].values() if "dag" in c]
    # the names KFP's UI shows (a task's display name, else its key), as the demo prints them
    tasks = {task.get("taskInfo", {}).get("name", key)
             for dag in dags for key, task in dag["tasks"].items()}
    shown = set(DEMO_LINE.findall(document.read_text())) - DEMO_OWN_LINES
    assert shown, f"{document.name} shows no demo output"
    assert shown <= tasks, (shown - tasks, sorted(tasks))


def test_readme_is_a_first_screen_with_links_that_resolve():
    text = README.read_text()
    assert len(text.splitlines()) <= 150
    for target in MARKDOWN_LINK.findall(text):
        if target.startswith(("http://", "https://")):
            continue
        path = (ROOT / target.split("#", 1)[0]).resolve()
        assert path.exists(), target
        if "#" in target and path.suffix == ".md":
            anchor = target.split("#", 1)[1]
            headings = re.findall(r"^#+ (.+)$", path.read_text(), flags=re.MULTILINE)
            slugs = {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-")
                     for h in headings}
            assert anchor in slugs, target


@pytest.mark.parametrize("document", [README, DOCS / "tutorial" / "install.md"],
                         ids=lambda p: p.name)
def test_documented_make_targets_exist(document):
    targets = set(re.findall(r"^([\w.-]+):", (ROOT / "Makefile").read_text(), flags=re.MULTILINE))
    documented = re.findall(r"^\s*make ([\w-]+)", "\n".join(SHELL_BLOCK.findall(
        document.read_text())), flags=re.MULTILINE)
    assert documented
    assert set(documented) <= targets, set(documented) - targets
