"""`--model-config-file-poll-wait-seconds`: the model config file re-read on a timer.

TF Serving's `--model_config_file_poll_wait_seconds` (server.cc's PollFilesystemAndReloadConfig):
every N seconds the file is read again and, when it says something new, applied as a
HandleReloadConfigRequest would apply it (models added, dropped, relabelled; the registry loads
the new ones while the old keep serving). A file that cannot be read or parsed keeps the config
that serves and is said in one log line (once per distinct error, not on every poll); a later
good file is applied. Each `--workers N` worker polls the file itself, so all of them follow it.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from pathlib import Path

from ampflow.errors import ConfigError
from ampflow.serving.config import ModelConfig, load_model_config_file
from ampflow.serving.status import ServingStatusError

log = logging.getLogger(__name__)


class ConfigFilePoller:
    """Re-reads one model config file every `interval_s` seconds and applies what changed.

    `template`: a model of the config at start, whose server-wide settings (`--model-format`,
    `--compute-precision`, which the file does not hold) every model read later gets too, as
    the command line gave them to the file's models at start.
    """

    def __init__(self, path: Path, registry, interval_s: float, template: ModelConfig) -> None:
        self.path, self.registry, self.interval_s = Path(path), registry, interval_s
        self._template = template
        self._applied = registry.configs()
        self._last_error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ampflow-config-poller",
                                        daemon=True)

    def start(self) -> ConfigFilePoller:
        """Start polling in a thread of its own; returns self."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop polling (a poll under way finishes first)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=60)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.poll_once()
            except Exception:  # one bad poll must never end the polling
                log.exception("model config poll failed; retrying in %gs", self.interval_s)

    def poll_once(self) -> bool:
        """Read the file; apply it when it differs from what was last applied. True if applied."""
        try:
            models = tuple(dataclasses.replace(
                m, model_format=self._template.model_format,
                compute_precision=self._template.compute_precision)
                for m in load_model_config_file(self.path))
        except ConfigError as e:
            self._say_once(f"model config file {self.path} not applied, the models served stay "
                           f"as they are: {e}")
            return False
        if models == self._applied:
            self._last_error = None
            return False
        self._applied = models
        try:
            self.registry.reload_config(models)
        except ServingStatusError as e:  # labels on versions not served: dropped, as TF Serving
            self._say_once(f"model config file {self.path} applied without its version labels: "
                           f"{e.message}")
            return True
        self._last_error = None
        log.info("model config file %s applied: models %s", self.path, [m.name for m in models])
        return True

    def _say_once(self, line: str) -> None:
        if line != self._last_error:
            log.error("%s", line)
            self._last_error = line
