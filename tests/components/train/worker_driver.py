"""`python worker_driver.py <ampflow args>`: the ampflow CLI plus test-only models and devices.

Worker processes of the distributed tests run this instead of `python -m ampflow.cli`, so that
they know the test models below. AMPFLOW_TEST_LOGICAL_CPUS=N splits the CPU into N logical
devices first (MirroredStrategy then has N replicas in one process).

`<args of job 1> --then <args of job 2> ...` runs several jobs one after the other in this one
process, because each process pays ~9 CPU-s to start TensorFlow and its runtime, more than a
small job itself costs. Before each job after the first, TensorFlow's eager context is reset
(its own helper for tests; a fresh context has fresh devices and collectives: a second
MirroredStrategy in the old one collides with the first one's collective keys), so no
strategy, device or collective state of one job reaches the next. AMPFLOW_TEST_JOB_ENVS, a JSON
list of one object per job, sets each job's environment before its context is made (a null
value removes the variable): its own TF_CONFIG (fresh ports: the previous job's collective
server lives on until the process ends), or none and AMPFLOW_TEST_LOGICAL_CPUS for a job that
runs alone. After each job a `COMMAND_DONE` line on stderr says its exit code; the process
exits with the last job's. With one job the driver is the CLI, nothing more.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _inf_gradient_on_replica_1(input_shape, num_classes, image_size):
    """Every step, replica 1's gradients (only) are infinite: the replicas must agree to skip."""
    import keras
    import tensorflow as tf

    from ampflow.modeling.models import float32_head

    class InfGradientOnReplica1(keras.layers.Layer):
        def call(self, x):
            context = tf.distribute.get_replica_context()  # None while building in a scope
            replica = context.replica_id_in_sync_group if context is not None else 0

            @tf.custom_gradient
            def identity(t):
                def grad(dy):
                    factor = tf.where(tf.equal(replica, 1), float("inf"), 1.0)
                    return dy * tf.cast(factor, dy.dtype)

                return tf.identity(t), grad

            return identity(x)

    inputs = keras.Input(shape=input_shape, name="images")
    x = keras.layers.Flatten()(keras.layers.Rescaling(1 / 255)(inputs))
    x = InfGradientOnReplica1()(keras.layers.Dense(16, activation="relu")(x))
    return keras.Model(inputs, float32_head(x, num_classes))


def batch_norm_cnn(input_shape, num_classes, image_size=None):
    """Small, with the fused BatchNormalization whose moving statistics each replica updates.

    Also a user's builder (`--model worker_driver:batch_norm_cnn --model-path <this dir>`): the
    local launcher's workers run `python -m ampflow.cli`, which knows no test model by name."""
    import keras

    from ampflow.modeling.layers import FusedBatchNormalization
    from ampflow.modeling.models import float32_head

    inputs = keras.Input(shape=input_shape, name="images")
    x = keras.layers.Rescaling(1 / 255)(inputs)
    x = keras.layers.Conv2D(16, 3, padding="same", use_bias=False)(x)
    x = keras.layers.ReLU()(FusedBatchNormalization()(x))
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, float32_head(x, num_classes))


SEPARATOR = "--then"
COMMAND_DONE = "worker_driver: command {index} exited with code {code}"


def split_commands(argv: list[str]) -> list[list[str]]:
    """`a b --then c d` -> [[a, b], [c, d]]."""
    commands: list[list[str]] = [[]]
    for arg in argv:
        if arg == SEPARATOR:
            commands.append([])
        else:
            commands[-1].append(arg)
    return commands


def _split_cpu() -> None:
    devices = int(os.environ.get("AMPFLOW_TEST_LOGICAL_CPUS", "0"))
    if devices:
        import tensorflow as tf

        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * devices)


def _fresh_tensorflow_context() -> None:
    from tensorflow.python.eager import context

    context._reset_context()
    _split_cpu()


def _set_job_env(changes: dict) -> None:
    """One job's environment: each variable set, or removed where its value is None."""
    for name, value in changes.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def main() -> int:
    commands = split_commands(sys.argv[1:])
    job_envs = json.loads(os.environ.get("AMPFLOW_TEST_JOB_ENVS", "null")) or [{}] * len(commands)
    _set_job_env(job_envs[0])
    _split_cpu()
    from ampflow.cli import main as ampflow_main
    from ampflow.modeling.models import register_model

    register_model("test_inf_gradient_on_replica_1", _inf_gradient_on_replica_1)
    register_model("test_batch_norm_cnn", batch_norm_cnn)
    if len(commands) == 1:
        return ampflow_main(commands[0])
    code = 0
    for index, command in enumerate(commands):
        if index:
            _set_job_env(job_envs[index])
            _fresh_tensorflow_context()
        code = ampflow_main(command)
        sys.stdout.flush()
        print(COMMAND_DONE.format(index=index, code=code), file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
