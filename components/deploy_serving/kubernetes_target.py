"""Deploy to Kubernetes as a canary: a small share first, checked on real examples, then promoted.

1. Before anything changes: the API server answers, a model store that is a directory (the
   claim mounted in the KFP deploy task) is writable by this user, the version's recorded
   expected answers are readable, the overlay renders; this deploy takes the rollout lock
   (ConfigMap `<stable>-rollout-lock`, created exclusively: of two deploys of one Deployment
   at once, the second fails here, naming the first) and reads the release record.
2. The version is copied to the model store.
3. Canary: the new model ConfigMap and a `<stable>-canary` Deployment (a few replicas, same pod
   template as the new release) are applied. Behind the same Service as the stable pods, it
   serves about canary/(canary + stable) of the traffic. `kubectl rollout status` waits for it;
   then the real test images recorded at export are sent to it (through `<service>-canary`,
   which reaches only canary pods) and its answers must match the recorded ones; with
   `canary_soak_s` it keeps serving its share and is re-checked until the soak ends.
4. Promote: the whole release (stable Deployment pinned to the new version, Service, HPA, ...)
   is applied, `kubectl rollout status` waits, the canary is scaled to 0, the Service must give
   the recorded answers, and the release is recorded (`<stable>-release` ConfigMap).
5. Any failure rolls back: the canary is scaled to 0; if the stable Deployment was touched, the
   recorded previous render is re-applied exactly (without a record, `kubectl rollout undo`; on a
   first deploy the new stable Deployment is scaled to 0, so nothing wrong is served).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from ampflow.components.deploy_serving import model_store
from ampflow.components.deploy_serving.config import DeployConfig, DeployResult
from ampflow.components.deploy_serving.kubernetes_cluster import Cluster
from ampflow.components.deploy_serving.kubernetes_render import (
    VERSION_ANNOTATION,
    canary_objects,
    one,
    parse_record,
    record_name,
    release_record,
    render,
    scaled,
    service_address,
    shared_objects,
)
from ampflow.errors import DeployError
from ampflow.serving.model_format import parse_version_name

log = logging.getLogger(__name__)

_SOAK_CHECK_EVERY_S = 10.0
REVISION_ANNOTATION = "deployment.kubernetes.io/revision"  # set by the Deployment controller


def deploy(
    config: DeployConfig, model_name: str, version: int, spec: model_store.SignatureSpec
) -> DeployResult:
    """The kubernetes target of `run_deploy` (see the module docstring for the order)."""
    cluster = Cluster(config)
    try:
        return _Rollout(cluster, config, model_name, version, spec).run()
    finally:
        cluster.close()


class _Rollout:
    """One canary-then-promote deployment, and what to undo if it fails."""

    def __init__(self, cluster: Cluster, config: DeployConfig, model_name: str, version: int,
                 spec: model_store.SignatureSpec) -> None:
        self.cluster, self.config = cluster, config
        self.model_name, self.version, self.spec = model_name, version, spec
        self.canary_applied = False
        self.stable_touched = False

    def run(self) -> DeployResult:
        """Check, render, push, canary, promote; roll back on any failure after the push."""
        self.cluster.check_reachable()
        if not model_store.is_uri(str(self.config.model_store)):
            # the store is a mounted claim (the KFP deploy task's): KFP sets no fsGroup, so a
            # fresh volume's root is root's 0755; say so now, before anything is changed
            from ampflow.files import check_volume_writable

            check_volume_writable(self.config.model_store,
                                  f"the model store {self.config.model_store}")
        from ampflow.components.deploy_serving import canary

        self.examples = canary.recorded_examples(self.config.saved_model_dir)
        with self.config.claimed(self.config.saved_model_dir) as self.config:
            self.version = self.config.resolved_version
            self.release = render(self.config, self.model_name, self.version)
            self.canary = canary_objects(self.release, self.config.canary_replicas)
            self.stable_name = one(self.release, "Deployment")["metadata"]["name"]
            self.cluster.lock_rollout(self.stable_name, self.version, self._lock_ttl_s())
            try:
                return self._locked_run()
            finally:
                self.cluster.unlock_rollout()

    def _lock_ttl_s(self) -> float:
        """How long the rollout lock holds: longer than any rollout of this config can take."""
        cfg = self.config
        return 3 * cfg.rollout_timeout_s + 3 * cfg.canary_timeout_s + cfg.canary_soak_s + 300

    def _locked_run(self) -> DeployResult:
        """Everything after the lock: read what is live, push, canary, promote or roll back."""
        self.record = parse_record(self.cluster.read_config_map(record_name(self.release)))
        live = self.cluster.deployment_annotations(self.stable_name)
        self.stable_existed = live is not None
        self.revision_before = (live or {}).get(REVISION_ANNOTATION)
        live_version = (live or {}).get(VERSION_ANNOTATION, "")
        previous = self.record[1] if self.record else parse_version_name(live_version)
        dest = f"{self.config.model_store.rstrip('/')}/{self.model_name}/{self.version}"
        _push(self.config, dest)
        try:
            canary_address, share = self._canary()
            endpoint = self._promote()
        except DeployError as e:
            self._roll_back(e, previous)
            raise
        except Exception as e:  # client/transport errors (unknown kind, urllib3 timeouts) too
            error = DeployError(f"deploying version {self.version} failed: "
                                f"{type(e).__name__}: {e}")
            self._roll_back(error, previous)
            raise error from e
        return DeployResult(
            target="kubernetes", model_name=self.model_name, version=self.version,
            model_path=dest, endpoint=endpoint, served_version=self.version,
            previous_version=previous, canary_address=canary_address, canary_share=share,
            promoted=True)

    def _canary(self) -> tuple[str, float]:
        """Run the new version on the canary track and check its answers; (address, share)."""
        if not self.stable_existed:  # a first deploy: the Service etc. must exist for it
            self.cluster.apply(shared_objects(self.release))
        self.canary_applied = True
        self.cluster.apply(self.canary)
        canary_name = one(self.canary, "Deployment")["metadata"]["name"]
        self.cluster.rollout_status(canary_name)
        share = _share(self.config.canary_replicas, self.cluster, self.stable_name)
        address = self.config.canary_address or service_address(
            [one(self.canary, "Service")], self.config.namespace)
        log.info("canary %s (version %d) serves about %.0f%% of the traffic; checking it at %s",
                 canary_name, self.version, 100 * share, address)
        self._check(address)
        deadline = time.monotonic() + self.config.canary_soak_s
        while time.monotonic() < deadline:
            time.sleep(min(_SOAK_CHECK_EVERY_S, max(0.0, deadline - time.monotonic())))
            self._check(address)
        return address, share

    def _promote(self) -> str:
        """Roll the stable Deployment to the new version, retire the canary, record it."""
        self.stable_touched = True
        self.cluster.apply(self.release)
        self.cluster.rollout_status(self.stable_name)
        self.cluster.apply([scaled(one(self.canary, "Deployment"), 0)])
        endpoint = self.config.server_address or service_address(
            self.release, self.config.namespace)
        self._check(endpoint)
        self.cluster.apply([release_record(self.release, self.model_name, self.version,
                                           self.config.namespace)])
        log.info("promoted %s version %d on %s", self.model_name, self.version, self.stable_name)
        return endpoint

    def _check(self, address: str) -> None:
        from ampflow.components.deploy_serving import canary

        canary.check_version_served(address, self.model_name, self.version, self.spec,
                                    self.examples, timeout_s=self.config.canary_timeout_s,
                                    atol=self.config.canary_atol)

    def _roll_back(self, error: DeployError, previous: int | None) -> None:
        """Undo what this deployment changed; say what is serving now in the error."""
        done, failed = [], []
        if self.canary_applied:
            _attempt(lambda: self.cluster.apply([scaled(one(self.canary, "Deployment"), 0)]),
                     "the canary was scaled to 0", done, failed)
        if self.stable_touched and self.record is not None:
            objects, recorded = self.record

            def restore() -> None:
                self.cluster.apply(objects)
                self.cluster.rollout_status(self.stable_name)

            _attempt(restore, f"the recorded release of version {recorded} was re-applied and "
                              "rolled out", done, failed)
        elif self.stable_touched and self.stable_existed:
            _attempt(self._undo, "no release record: `kubectl rollout undo` restored the "
                                 f"revision that was live before ({self.revision_before})",
                     done, failed)
        elif self.stable_touched:
            _attempt(lambda: self.cluster.apply([scaled(one(self.release, "Deployment"), 0)]),
                     "first deploy: the new stable Deployment was scaled to 0", done, failed)
        if failed:
            error.args = (f"{error}; and the rollback failed too: {'; '.join(failed)}",)
            return
        if previous is not None:
            serving = f"version {previous} is serving"
        elif self.stable_existed:
            serving = "the stable Deployment that was live before is serving"
        else:
            serving = "nothing is serving (there was no previous version)"
        if not self.stable_touched and self.stable_existed:
            serving += " (the stable Deployment was never changed)"
        log.error("deploy of %s version %d failed; rolled back: %s", self.model_name,
                  self.version, "; ".join(done))
        error.args = (f"{error}; rolled back: {serving}; {'; '.join(done)}",)

    def _undo(self) -> None:
        """Back to the revision that was live before this deploy, if the apply changed it."""
        now = (self.cluster.deployment_annotations(self.stable_name) or {}).get(
            REVISION_ANNOTATION)
        if now is not None and now == self.revision_before:
            return  # the apply never reached the Deployment: nothing to undo
        self.cluster.rollout_undo(self.stable_name, self.revision_before)
        self.cluster.rollout_status(self.stable_name)


def _attempt(action, what: str, done: list[str], failed: list[str]) -> None:
    try:
        action()
        done.append(what)
    except Exception as e:  # noqa: BLE001 (report every rollback failure, keep the first error)
        failed.append(f"{what.split(':')[0]} did not work ({e})")


def _share(canary_replicas: int, cluster: Cluster, stable_name: str) -> float:
    """The canary's approximate share of the Service's traffic (kube-proxy spreads by pod)."""
    stable = cluster.ready_replicas(stable_name)
    return canary_replicas / (canary_replicas + stable)


def _push(config: DeployConfig, dest: str) -> None:
    """Copy the version into the model store (atomic on a volume, .pb last in a bucket)."""
    record: dict[str, Any] = config.to_dict()
    if model_store.is_uri(dest):
        model_store.push_uri(config.saved_model_dir, dest, record)
    else:
        model_store.push_local(config.saved_model_dir, Path(dest), record)
