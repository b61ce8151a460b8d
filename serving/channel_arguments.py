"""TF Serving's `--grpc_channel_arguments`: gRPC server arguments, read as its main.cc reads them.

TF Serving takes a comma list of `key=value` and hands each to its gRPC server, the value as an
int when it parses as one, else as a string (`grpc.max_connection_age_ms=2000,
grpc.lb_policy_name=grpclb` starts its server). `ampflow serve` does the same, except for the
keys it sets itself from a flag of its own: those set that flag (`CHANNEL_ARGUMENT_FLAGS`, so
the flag's checks and the real binary's argv see one value), and the two it decides alone
(`RESERVED`) are refused in one line. What is left is passed to grpcio unchanged
(`ServerConfig.grpc_channel_arguments`); gRPC ignores a key it does not know, as there.
"""

from __future__ import annotations

import re

from ampflow.errors import ConfigError

# key -> (the config field it sets, the factor from the key's unit to the field's)
CHANNEL_ARGUMENT_FLAGS = {
    "grpc.max_receive_message_length": ("max_message_bytes", 1),
    "grpc.max_send_message_length": ("max_message_bytes", 1),
    "grpc.max_connection_age_ms": ("grpc_max_connection_age_s", 1e-3),
    "grpc.max_connection_age_grace_ms": ("grpc_max_connection_age_grace_s", 1e-3),
    "grpc.max_connection_idle_ms": ("grpc_max_connection_idle_s", 1e-3),
    "grpc.max_concurrent_streams": ("grpc_max_concurrent_streams", 1),
    "grpc.http2.min_ping_interval_without_data_ms": ("grpc_min_ping_interval_s", 1e-3),
}
RESERVED = {
    "grpc.so_reuseport": "--workers N decides it (the workers share the ports)",
    "grpc.keepalive_permit_without_calls": "the keepalive pings a client may send are bounded "
                                           "by --grpc-min-ping-interval-s",
}
_KEY = re.compile(r"[A-Za-z0-9_.\-]+")
_INT32 = 2**31 - 1


def parse_channel_arguments(value: str) -> dict[str, object]:
    """`--grpc_channel_arguments` -> {config field: value}; passed-through ones under their key.

    The keys of `CHANNEL_ARGUMENT_FLAGS` set their field (both message lengths must agree:
    ampflow has one --max-message-bytes); any other key goes, with its value, into the tuple
    `grpc_channel_arguments`. ConfigError, naming the item, for a reserved key, a malformed
    item, or a number where a number is needed.
    """
    fields: dict[str, object] = {}
    passed: list[tuple[str, int | str]] = []
    for item in filter(None, (part.strip() for part in value.split(","))):
        key, sep, raw = (part.strip() for part in item.partition("="))
        if not sep or not _KEY.fullmatch(key):
            raise ConfigError(f"--grpc_channel_arguments takes key=value items separated by "
                              f"commas. Received: {item!r}")
        if key in RESERVED:
            raise ConfigError(f"--grpc_channel_arguments: {key} is not taken: {RESERVED[key]}. "
                              f"Received: {item!r}")
        number = _int(raw)
        if key not in CHANNEL_ARGUMENT_FLAGS:
            passed.append((key, raw if number is None else number))
            continue
        field, factor = CHANNEL_ARGUMENT_FLAGS[key]
        if number is None or number < 0:
            raise ConfigError(f"--grpc_channel_arguments: {key} must be a whole number >= 0. "
                              f"Received: {item!r}")
        converted = number if factor == 1 else number * factor
        if fields.get(field, converted) != converted:
            raise ConfigError(
                "--grpc_channel_arguments: ampflow has one --max-message-bytes for both "
                "directions, so give grpc.max_receive_message_length and "
                f"grpc.max_send_message_length the same value. Received: {value!r}")
        fields[field] = converted
    fields["grpc_channel_arguments"] = tuple(passed)
    return fields


def _int(text: str) -> int | None:
    try:
        number = int(text)
    except ValueError:
        return None
    return number if -_INT32 - 1 <= number <= _INT32 else None  # gRPC's int arguments


def check_passed_through(arguments) -> tuple[tuple[str, int | str], ...]:
    """`arguments` as a tuple of (key, int or str), each key neither a flag's nor reserved."""
    checked = []
    for pair in arguments:
        key, value = pair
        if not isinstance(key, str) or not _KEY.fullmatch(key) or not isinstance(
                value, (int, str)) or isinstance(value, bool):
            raise ConfigError("grpc_channel_arguments must be (key, int or str) pairs. "
                              f"Received: {pair!r}")
        if key in RESERVED or key in CHANNEL_ARGUMENT_FLAGS:
            raise ConfigError(f"grpc_channel_arguments must not hold {key} (set its flag, or "
                              f"leave it to ampflow). Received: {pair!r}")
        checked.append((key, value))
    return tuple(checked)


def tf_serving_form(config) -> str:
    """The value of the real binary's `--grpc_channel_arguments` for a `ServerConfig`."""
    limits = config.connection_limits
    items = [f"grpc.max_receive_message_length={config.max_message_bytes}",
             f"grpc.max_send_message_length={config.max_message_bytes}"]
    if limits.grpc_max_connection_age_s:
        items += [f"grpc.max_connection_age_ms={round(limits.grpc_max_connection_age_s * 1000)}",
                  "grpc.max_connection_age_grace_ms="
                  f"{round(limits.grpc_max_connection_age_grace_s * 1000)}"]
    items += [f"{key}={value}" for key, value in config.grpc_channel_arguments]
    return ",".join(items)
