"""toolgate's Python client: the generated gRPC stubs (`toolgate_pb2`,
`toolgate_pb2_grpc`, made by `clients/python/generate_stubs.py` from
proto/toolgate/v1/toolgate.proto) and `Host`, a typed wrapper for the agent
host loop (decide, wait for the reviewer's verdict, dispatch, receipt)."""

from toolgate_client import toolgate_pb2, toolgate_pb2_grpc
from toolgate_client.client import (
    Decision,
    DispatchStatus,
    Host,
    Outcome,
    Proposal,
    ProtocolError,
    Receipt,
    Resource,
    ToolgateError,
    VerdictTimeout,
    open_channel,
)

__all__ = [
    "Decision",
    "DispatchStatus",
    "Host",
    "Outcome",
    "Proposal",
    "ProtocolError",
    "Receipt",
    "Resource",
    "ToolgateError",
    "VerdictTimeout",
    "open_channel",
    "toolgate_pb2",
    "toolgate_pb2_grpc",
]
