"""Pod attribution: which container holds which GPU or MIG device, from kubelet's pod-resources API.

``client`` is the one module that talks to the kubelet; ``api_pb2``/``api_pb2_grpc`` are generated
from ``api.proto`` (``make protos``) and committed.
"""
