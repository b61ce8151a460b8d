"""The promises the CLI makes, kept by every command (issue 38 part 4).

- One exit-code rule (src/ampflow/errors.py): 2 for a usage or configuration error, found before the
  work starts (an unknown flag, a path that names no usable input); 1 for a run that failed.
  Before: a missing data dir, an empty or one-class image folder and a missing eval dir
  exited 1.
- An unknown flag is answered by the command it was given to, with the closest flag, in the
  one-line format of every other error (before: argparse's bare "ampflow: error:
  unrecognized arguments").
- Messages name flags, not settings (`--image-folder`, not `image_folder`).
- A closed pipe (`ampflow ... | head -1`, `ampflow-client metadata | head -1`) ends quietly.
- `check-model` reports XLA as train will decide it; absl's checkpoint timing lines are
  silenced like TensorFlow's other start-up noise.

Everything here runs in this process or a short subprocess, without training.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from ampflow.cli import CLOSED_PIPE_EXIT_CODE, build_parser, main

NO_SUCH_FLAG = "--no-such-flag-anywhere"


def _commands() -> list[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(sub.choices)


def _usage_error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    assert len(err.strip().splitlines()) == 1 and "usage:" not in err, err
    return err.strip()


@pytest.mark.parametrize("command", _commands())
def test_every_command_answers_an_unknown_flag_itself_exit_2(command, capsys):
    err = _usage_error([command, NO_SUCH_FLAG, "x"], capsys)
    assert err == (f"ampflow {command}: error: unrecognized argument {NO_SUCH_FLAG} "
                   f"(see `ampflow {command} --help`)")


@pytest.mark.parametrize("argv, closest", [
    (["train", "--precison", "x"], "--precision"),
    (["train", "--data-dir", "d", "--output-dri", "o"], "--output-dir"),  # before "required"
    (["prepare-data", "--image-foldr", "x"], "--image-folder"),
    (["run-local", "--workdir", "w", "--epoch", "2"], "--epochs"),
    (["serve", "--model-base-pth", "x"], "--model-base-path"),
    (["check-model", "--data-dir", "d", "--mdoel", "x"], "--model"),
])
def test_a_misspelled_flag_gets_the_closest_flag(argv, closest, capsys):
    err = _usage_error(argv, capsys)
    typed = next(a for a in argv if a.startswith("--") and a not in ("--data-dir", "--workdir"))
    assert err.startswith(f"ampflow {argv[0]}: error: unrecognized argument {typed}; "
                          f"did you mean {closest}? "), err


def test_the_issue_example_word_for_word(capsys):
    err = _usage_error(["train", "--precison", "x"], capsys)
    assert err.startswith("ampflow train: error: unrecognized argument --precison; did you "
                          "mean --precision?")


def test_an_abbreviated_flag_is_not_silently_another_flag(capsys):
    # `--lr 0.1` was taken as `--lr-schedule 0.1` (argparse's prefix matching)
    err = _usage_error(["train", "--data-dir", "d", "--output-dir", "o", "--lr", "0.1"], capsys)
    assert "unrecognized argument --lr" in err


def test_an_option_of_ampflow_itself_after_the_command_says_where_it_goes(capsys):
    err = _usage_error(["train", "--quiet"], capsys)
    assert "--quiet is an option of `ampflow` itself: put it before the command" in err


def test_a_stray_positional_is_answered_by_the_command(capsys):
    err = _usage_error(["train", "stray", "--data-dir", "d", "--output-dir", "o"], capsys)
    assert err.startswith("ampflow train: error: unrecognized argument stray"), err


# ---- one exit-code rule --------------------------------------------------------------------

@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli-promises")
    (root / "empty").mkdir()
    (root / "one-class" / "cat").mkdir(parents=True)
    (root / "one-class" / "cat" / "a.png").write_bytes(b"not really a png")
    return root


@pytest.fixture(scope="module")
def closed_port():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# (argv, exit code, words of the one error line); {tmp}: the folders above, {port}: closed
EXIT_CODES = [
    # 2: the command was given something it cannot use (before: 1 for the first five)
    (["prepare-data", "--image-folder", "{tmp}/empty", "--output-dir", "{tmp}/o1"], 2,
     "--image-folder must hold one sub-folder per class"),
    (["prepare-data", "--image-folder", "{tmp}/one-class", "--output-dir", "{tmp}/o2"], 2,
     "--image-folder must hold at least 2 class sub-folders"),
    (["train", "--data-dir", "{tmp}/nope", "--output-dir", "{tmp}/t"], 2,
     "is not a prepared dataset"),
    (["check-model", "--data-dir", "{tmp}/nope"], 2, "is not a prepared dataset"),
    (["pretrain", "--data-dir", "{tmp}/nope", "--output-dir", "{tmp}/p"], 2,
     "is not a prepared dataset"),
    (["evaluate", "--model-dir", "{tmp}/nope", "--data-dir", "{tmp}/nope", "--output-dir",
      "{tmp}/e"], 2, "is not a prepared dataset"),
    (["export", "--model-dir", "{tmp}/nope", "--data-dir", "{tmp}/nope", "--export-base",
      "{tmp}/x", "--eval-dir", "{tmp}/nope"], 2, "--eval-dir must be the output dir of "
                                                 "`ampflow evaluate`"),
    (["convert", "--saved-model-dir", "{tmp}/nope", "--data-dir", "{tmp}/nope",
      "--output-dir", "{tmp}/c"], 2, "--saved-model-dir must be a SavedModel version dir"),
    (["prepare-data", "--image-folder", "{tmp}/nope", "--output-dir", "{tmp}/o3"], 2,
     "--image-folder must be an existing directory"),
    (["deploy", "--saved-model-dir", "{tmp}/nope", "--model-store", "{tmp}/store"], 2,
     "--saved-model-dir must be an exported SavedModel version dir"),
    (["serve", "--model-base-path", "{tmp}/nope", "--port", "{port}"], 2, ""),
    (["submit", "--host", "localhost:8080", "--image", "r/a:1"], 2,
     "--host must be an http(s) URL"),
    (["compile", "--image", "latest"], 2, "--image must be a pinned image reference"),
    # 1: the command ran and failed
    (["export", "--model-dir", "{tmp}/nope", "--data-dir", "{tmp}/nope", "--export-base",
      "{tmp}/x", "--eval-dir", "{tmp}/empty"], 1, "--eval-dir must hold verdict.json"),
    (["predict", "--port", "{port}", "--retries", "0", "--timeout-s", "0.5", "{tmp}/x.png"], 1,
     "nothing answers at"),
    (["model-status", "--port", "{port}", "--retries", "0", "--timeout-s", "0.5"], 1,
     "nothing answers at"),
    (["model-metadata", "--port", "{port}", "--retries", "0", "--timeout-s", "0.5"], 1,
     "nothing answers at"),
]


@pytest.mark.parametrize("argv, code, words", EXIT_CODES,
                         ids=[f"{a[0]}-{c}-{i}" for i, (a, c, _) in enumerate(EXIT_CODES)])
def test_one_exit_code_rule_in_every_command(argv, code, words, folders, closed_port, capsys):
    argv = [a.replace("{tmp}", str(folders)).replace("{port}", str(closed_port)) for a in argv]
    got = main(argv)
    err = capsys.readouterr().err.strip()
    assert got == code, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"ampflow {argv[0]}: error: ") and words in err, err


def test_the_rule_is_tested_for_every_command():
    tested = {argv[0] for argv, _, _ in EXIT_CODES}
    # run-local and demo run the pipeline's own prepare-data (pipeline/); their flags are
    # checked by test_every_command_answers_an_unknown_flag_itself_exit_2
    assert set(_commands()) - tested == {"run-local", "demo"}


def test_a_missing_model_dir_is_a_configuration_error(prepared_digits, tmp_path, capsys):
    code = main(["evaluate", "--model-dir", str(tmp_path / "nope"), "--data-dir",
                 str(prepared_digits), "--output-dir", str(tmp_path / "e")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "is not a published model" in err, err


def test_a_file_system_error_no_step_wrapped_is_one_line_exit_1(tmp_path, capsys):
    code = main(["compile", "--image", "r/a:1", "--output", str(tmp_path / "no" / "p.yaml")])
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("ampflow compile: error: ") and "No such file or directory" in err


# ---- a closed pipe ---------------------------------------------------------------------------

def _with_stdout_closed(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    """Run `argv` with a stdout whose reader is gone before it writes (`| head -0`)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(argv, stdout=write_end, stderr=subprocess.PIPE, text=True,
                              timeout=120, **kwargs)
    finally:
        os.close(write_end)


@pytest.mark.parametrize("args, codes", [
    (["compile", "--image", "r/a:1", "--output", "{tmp}/p.yaml"], {CLOSED_PIPE_EXIT_CODE}),
    (["train", "--help"], {0, CLOSED_PIPE_EXIT_CODE}),  # argparse ignores its own write error
])
def test_ampflow_into_a_closed_pipe_ends_quietly(args, codes, tmp_path):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    done = _with_stdout_closed([sys.executable, "-m", "ampflow.cli", *argv])
    assert done.returncode in codes and CLOSED_PIPE_EXIT_CODE == 141, done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr


def test_ampflow_client_metadata_into_a_closed_pipe_ends_quietly():
    # the client's own entry point, a real closed pipe; only the server is stood in for
    code = textwrap.dedent("""
        import contextlib, sys
        from ampflow_client import cli

        class Server:
            def metadata(self, name, version):
                return {}

        cli.make_client = lambda args: contextlib.nullcontext(Server())
        sys.exit(cli.main(["metadata"]))
    """)
    done = _with_stdout_closed([sys.executable, "-c", code])
    assert done.returncode == 141, done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr


# ---- what check-model and train log ---------------------------------------------------------

@pytest.mark.parametrize("xla", [None, "on"])
def test_check_model_reports_xla_as_train_will_decide_it(xla, prepared_digits, caplog, capsys):
    from ampflow.components.train.precision.policy import choose_jit, detect_hardware

    extra = ["--xla", xla] if xla else []
    with caplog.at_level(logging.INFO, logger="ampflow.components.train.precision.policy"):
        code = main(["check-model", "--data-dir", str(prepared_digits), "--precision",
                     "float32", *extra])
    assert code == 0, capsys.readouterr().err
    jit, reason = choose_jit(True if xla else None, detect_hardware(), "float32")
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("XLA ")]
    assert said == [f"XLA jit_compile={jit}: {reason}"], said
    assert ("requested explicitly" in said[0]) == (xla is not None)  # before: always said


def test_absl_checkpoint_timing_lines_are_silenced_and_its_other_lines_kept(caplog):
    from absl import logging as absl_logging

    from ampflow.fast_start import quiet_python_noise

    absl = logging.getLogger("absl")
    ours = [f for f in absl.filters if type(f).__name__ == "_DropPythonNoise"]
    assert len(ours) == 1  # installed by `import ampflow`: a KFP task never runs the CLI
    quiet_python_noise()  # twice: still one filter
    assert [f for f in absl.filters if type(f).__name__ == "_DropPythonNoise"] == ours
    # absl's own logger at INFO (TensorFlow may have set it higher), so that a line missing
    # from the capture is the filter's doing
    with caplog.at_level(logging.INFO), caplog.at_level(logging.INFO, logger="absl"):
        absl_logging.info("Sharding callback duration: %s microseconds", 201)
        absl_logging.warning("a real warning")
        quiet_python_noise(False)  # --log-level DEBUG
        absl_logging.info("Sharding callback duration: %s microseconds", 202)
        quiet_python_noise()
    said = [r.getMessage() for r in caplog.records]
    assert said == ["a real warning", "Sharding callback duration: 202 microseconds"], said
