"""Write `.proto` sources from the FileDescriptorProtos compiled into installed packages.

Used once, in the main ampflow environment, for the TensorFlow core protos the TF Serving
API imports (see protos/SOURCES.md): the tensorflow 2.21.0 wheel ships only their generated
`_pb2.py` modules, whose embedded FileDescriptorProto is exactly what `protoc` compiled from
TensorFlow's `.proto` files at that release (comments excepted). Also the gRPC health
service (from grpcio-health-checking). `tests/clients/test_protos.py` checks that what these
sources compile to equals the installed descriptors, field for field.

    python clients/python/tools/protos_from_descriptors.py --out clients/python/protos
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

from google.protobuf import descriptor_pb2

F = descriptor_pb2.FieldDescriptorProto
_SCALARS = {v: k[5:].lower() for k, v in F.Type.items()}
_LABELS = {F.LABEL_OPTIONAL: "optional", F.LABEL_REQUIRED: "required",
           F.LABEL_REPEATED: "repeated"}

# The TensorFlow core files TF Serving's API imports (all of them, transitively), and the
# module of the 2.21 wheel that holds each one's descriptor.
TENSORFLOW_MODULES = [
    "tensorflow.core.example.example_pb2",
    "tensorflow.core.example.feature_pb2",
    "tensorflow.core.framework.attr_value_pb2",
    "tensorflow.core.framework.full_type_pb2",
    "tensorflow.core.framework.function_pb2",
    "tensorflow.core.framework.graph_pb2",
    "tensorflow.core.framework.graph_debug_info_pb2",
    "tensorflow.core.framework.node_def_pb2",
    "tensorflow.core.framework.op_def_pb2",
    "tensorflow.core.framework.resource_handle_pb2",
    "tensorflow.core.framework.tensor_pb2",
    "tensorflow.core.framework.tensor_shape_pb2",
    "tensorflow.core.framework.types_pb2",
    "tensorflow.core.framework.variable_pb2",
    "tensorflow.core.framework.versions_pb2",
    "tensorflow.core.protobuf.error_codes_pb2",
    "tensorflow.core.protobuf.meta_graph_pb2",
    "tensorflow.core.protobuf.saved_object_graph_pb2",
    "tensorflow.core.protobuf.saver_pb2",
    "tensorflow.core.protobuf.struct_pb2",
    "tensorflow.core.protobuf.trackable_object_graph_pb2",
    "tensorflow.compiler.xla.tsl.protobuf.error_codes_pb2",  # xla/tsl/protobuf/error_codes.proto,
    "grpc_health.v1.health_pb2",
    # TF Serving 2.21 added PredictRequest.RequestOptions.handshake (field 13), which no
    # stored TF Serving source has yet: the 2.21.0 wheel's descriptor is the source.
    "tensorflow_serving.apis.predict_pb2",
]


def _literal(field, value) -> str:
    if field.type == field.TYPE_STRING:
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if field.type == field.TYPE_BOOL:
        return "true" if value else "false"
    if field.type == field.TYPE_ENUM:
        return field.enum_type.values_by_number[value].name
    return str(value)


def _options(options) -> list[tuple[str, str]]:
    return [(f.name, _literal(f, v)) for f, v in options.ListFields()]


def _inline(options, extra: list[tuple[str, str]] = ()) -> str:
    items = list(extra) + _options(options)
    return " [" + ", ".join(f"{k} = {v}" for k, v in items) + "]" if items else ""


def _type(field: F) -> str:
    return field.type_name if field.type_name else _SCALARS[field.type]


def _field(field: F, syntax: str, maps: dict) -> str:
    if field.type_name in maps:
        key, value = maps[field.type_name]
        head = f"map<{_type(key)}, {_type(value)}>"
    else:
        label = _LABELS[field.label]
        if syntax == "proto3" and label == "optional" and not field.proto3_optional:
            label = ""
        head = (label + " " if label else "") + _type(field)
    extra = []
    if field.HasField("default_value"):
        value = field.default_value
        extra.append(("default", f'"{value}"' if field.type in (F.TYPE_STRING, F.TYPE_BYTES)
                      else value))
    if field.HasField("json_name"):
        extra.append(("json_name", f'"{field.json_name}"'))
    return f"{head} {field.name} = {field.number}{_inline(field.options, extra)};"


def _reserved(item, indent: str) -> list[str]:
    lines = []
    if item.reserved_range:
        ranges = []
        for r in item.reserved_range:
            end = r.end - (1 if isinstance(item, descriptor_pb2.DescriptorProto) else 0)
            ranges.append(str(r.start) if r.start == end else f"{r.start} to {end}")
        lines.append(f"{indent}reserved {', '.join(ranges)};")
    if item.reserved_name:
        names = ", ".join(f'"{n}"' for n in item.reserved_name)
        lines.append(f"{indent}reserved {names};")
    return lines


def _enum(enum, indent: str) -> list[str]:
    lines = [f"{indent}enum {enum.name} {{"]
    lines += [f"{indent}  option {k} = {v};" for k, v in _options(enum.options)]
    for value in enum.value:
        lines.append(f"{indent}  {value.name} = {value.number}{_inline(value.options)};")
    lines += _reserved(enum, indent + "  ")
    return lines + [f"{indent}}}"]


def _message(msg, syntax: str, scope: str, indent: str) -> list[str]:
    full = f"{scope}.{msg.name}"
    maps = {f"{full}.{n.name}": (n.field[0], n.field[1]) for n in msg.nested_type
            if n.options.map_entry}
    lines = [f"{indent}message {msg.name} {{"]
    lines += [f"{indent}  option {k} = {v};" for k, v in _options(msg.options)]
    for enum in msg.enum_type:
        lines += _enum(enum, indent + "  ")
    # protoc lists a map's entry type among the nested types where the map field stands, so
    # nested messages are written just before the first map field that follows them.
    pending = list(enumerate(msg.nested_type))
    entry_index = {f"{full}.{n.name}": i for i, n in pending}

    def nested_before(limit: int) -> list[str]:
        out = []
        while pending and pending[0][0] < limit:
            _, nested = pending.pop(0)
            if not nested.options.map_entry:
                out += _message(nested, syntax, full, indent + "  ")
        return out

    real_oneofs = {i for i, _ in enumerate(msg.oneof_decl)} - {
        f.oneof_index for f in msg.field if f.proto3_optional}
    emitted = set()
    for field in msg.field:
        if field.HasField("oneof_index") and field.oneof_index in real_oneofs:
            i = field.oneof_index
            if i in emitted:
                continue
            emitted.add(i)
            lines.append(f"{indent}  oneof {msg.oneof_decl[i].name} {{")
            lines += [f"{indent}    {_field(f, 'proto3', maps)}" for f in msg.field
                      if f.HasField("oneof_index") and f.oneof_index == i]
            lines.append(f"{indent}  }}")
        else:
            if field.type_name in maps:
                lines += nested_before(entry_index[field.type_name] + 1)
            lines.append(f"{indent}  {_field(field, syntax, maps)}")
    lines += nested_before(len(msg.nested_type))
    if msg.extension_range:
        raise SystemExit(f"{full}: extension ranges are not supported by this printer")
    lines += _reserved(msg, indent + "  ")
    return lines + [f"{indent}}}"]


def proto_source(fdp: descriptor_pb2.FileDescriptorProto, origin: str) -> str:
    """The `.proto` text of one FileDescriptorProto."""
    syntax = fdp.syntax or "proto2"
    lines = ["// Written by clients/python/tools/protos_from_descriptors.py from the",
             f"// FileDescriptorProto in {origin}.",
             "// Comments of the original file are not part of a descriptor.",
             "", f'syntax = "{syntax}";', ""]
    if fdp.package:
        lines += [f"package {fdp.package};", ""]
    public = set(fdp.public_dependency)
    for i, dep in enumerate(fdp.dependency):
        lines.append(f'import {"public " if i in public else ""}"{dep}";')
    if fdp.dependency:
        lines.append("")
    lines += [f"option {k} = {v};" for k, v in _options(fdp.options)]
    scope = f".{fdp.package}" if fdp.package else ""
    for enum in fdp.enum_type:
        lines += [""] + _enum(enum, "")
    for msg in fdp.message_type:
        lines += [""] + _message(msg, syntax, scope, "")
    for service in fdp.service:
        lines += ["", f"service {service.name} {{"]
        for m in service.method:
            cin = "stream " if m.client_streaming else ""
            sout = "stream " if m.server_streaming else ""
            lines.append(f"  rpc {m.name}({cin}{m.input_type}) returns ({sout}{m.output_type});")
        lines.append("}")
    if fdp.extension:
        raise SystemExit(f"{fdp.name}: extensions are not supported by this printer")
    return "\n".join(lines) + "\n"


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    from importlib.metadata import version

    for name in TENSORFLOW_MODULES:
        module = importlib.import_module(name)
        fdp = descriptor_pb2.FileDescriptorProto.FromString(module.DESCRIPTOR.serialized_pb)
        dist = {"grpc_health": "grpcio-health-checking",
                "tensorflow_serving": "tensorflow-serving-api"}.get(name.split(".")[0],
                                                                    "tensorflow")
        origin = f"{dist} {version(dist)} ({name})"
        path = args.out / fdp.name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(proto_source(fdp, origin))
        print(path)


if __name__ == "__main__":
    main()
