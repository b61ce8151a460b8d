"""The deploy step: put one exported SavedModel version where a model server serves it.

Three targets share one config: `local` (a temp dir and one rename into the model store, so a
polling server never sees half a model), `kubernetes` (canary Deployment, then promotion;
kubernetes_target.py) and `kserve` (kserve_target.py). A TFLite variant or a bfloat16 version is
checked before it is published (tflite_variant.py, bf16_parity.py). The step claims the version
number, so `ampflow deploy` and the pipeline's task number and lock alike. Each target's path
and the numbering rule: docs/explanation/design-notes.md, "deploy_serving/step.py".
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

from ampflow.components.deploy_serving import model_store
from ampflow.components.deploy_serving.config import DeployConfig, DeployResult, Payload

log = logging.getLogger(__name__)


def run_deploy(config: DeployConfig) -> DeployResult:
    """Deploy `config.saved_model_dir` to `config.target`; see the module docstring."""
    spec = model_store.check_saved_model(config.saved_model_dir)
    with _payload(config) as payload:
        spec = payload.spec or spec
        if config.target == "local":
            with config.claimed(payload.source) as claimed:
                return _deploy_local(claimed, claimed.resolved_model_name,
                                     claimed.resolved_version, spec, payload)
        model_name, version = config.resolved_model_name, config.resolved_version
        if config.target == "kserve":
            from ampflow.components.deploy_serving import kserve_target

            return kserve_target.deploy(config, model_name, version, spec, payload)
        from ampflow.components.deploy_serving import kubernetes_target

        return kubernetes_target.deploy(config, model_name, version, spec)


@contextlib.contextmanager
def _payload(config: DeployConfig) -> Iterator[Payload]:
    """The exported SavedModel, or the chosen TFLite variant staged with its expected answers."""
    if config.compute_precision == "bfloat16":
        yield _bf16_payload(config)
        return
    if config.serving_format != "tflite":
        yield Payload(config.saved_model_dir)
        return
    from ampflow.components.deploy_serving import canary, tflite_variant

    variant = tflite_variant.select_variant(config.tflite_dir, config.tflite_variant)
    recorded = canary.recorded_examples(config.saved_model_dir)
    with tflite_variant.staged_version(variant) as staged:
        published = tflite_variant.expected_answers(staged, variant, recorded)
        log.info("publishing TFLite variant %s (%s); the server must give its answers to the "
                 "%d recorded examples on %r", variant.name, variant.tflite,
                 len(recorded.images), published.spec.name)
        yield Payload(staged, model_format="tflite", expected=published.expected,
                      tflite_variant=variant.name, spec=published.spec)


def _bf16_payload(config: DeployConfig) -> Payload:
    """The SavedModel once it passed its bfloat16 gate, with the bf16 answers expected."""
    from ampflow.components.deploy_serving import bf16_parity, canary

    recorded = canary.recorded_examples(config.saved_model_dir) if config.server_address else None
    gate = bf16_parity.Gate(config.bfloat16_min_agreement, config.bfloat16_max_accuracy_drop,
                            config.bfloat16_max_prob_diff)
    verdict = bf16_parity.check(config.saved_model_dir, config.data_dir, gate,
                                limit=config.bfloat16_test_limit, recorded=recorded)
    return Payload(config.saved_model_dir, expected=verdict.expected,
                   bf16_parity=verdict.evidence)


def _deploy_local(
    config: DeployConfig, model_name: str, version: int, spec: model_store.SignatureSpec,
    payload: Payload,
) -> DeployResult:
    """Copy into the local base path; with a server address, prove it serves the version."""
    examples = payload.expected
    if config.server_address and examples is None:
        from ampflow.components.deploy_serving import canary

        examples = canary.recorded_examples(config.saved_model_dir)
    store = Path(str(config.model_store))
    record = config.to_dict()
    if payload.bf16_parity is not None:
        record["bf16_parity"] = payload.bf16_parity
    dest, already = model_store.push_local(
        payload.source, store / model_name / str(version), record
    )
    served = None
    if config.server_address:
        from ampflow.components.deploy_serving import canary

        try:
            served = canary.check_version_served(
                config.server_address, model_name, version, spec, examples,
                timeout_s=config.canary_timeout_s, atol=config.canary_atol,
            )
        except Exception:
            if not already:
                log.error("canary failed; removing %s so the previous version stays served", dest)
                model_store.remove_local_version(dest)
            raise
    log.info("deployed %s version %d to %s", model_name, version, dest)
    return DeployResult(
        target="local",
        model_name=model_name,
        version=version,
        model_path=str(dest),
        endpoint=config.server_address,
        served_version=served,
        already_present=already,
        tflite_variant=payload.tflite_variant,
        compute_precision=None if config.compute_precision == "float32" else
        config.compute_precision,
        bf16_parity=payload.bf16_parity,
    )
