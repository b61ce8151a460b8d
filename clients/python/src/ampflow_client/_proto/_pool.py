"""The descriptor pool of the client's protos: private, so TensorFlow's modules never clash.

`tensorflow` and `tensorflow_serving` register the same messages (`tensorflow.TensorProto`,
`tensorflow.serving.PredictRequest`) in protobuf's default pool; a second registration of
those names there fails, whatever file holds it. The generated modules under this package
register in `POOL` instead (tools/generate_protos.py rewrites that one line). `POOL` holds
the well-known types the protos import.
"""

from google.protobuf import any_pb2, descriptor_pool, wrappers_pb2

POOL = descriptor_pool.DescriptorPool()
for _module in (any_pb2, wrappers_pb2):
    POOL.AddSerializedFile(_module.DESCRIPTOR.serialized_pb)
