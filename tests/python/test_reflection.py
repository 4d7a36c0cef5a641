"""Server reflection serves the google.rpc error-detail types, so a reflection
client (grpcurl, buf curl, ghz) can decode the details of an error: resolved
here by symbol through grpcio-reflection (v1alpha) and a raw v1 request, and
then used, as grpcurl does, to decode the BadRequest detail of a real
INVALID_ARGUMENT."""

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from grpc_reflection.v1alpha import reflection_pb2
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

ERROR_DETAILS = "google/rpc/error_details.proto"
DETAIL_TYPES = [
    ("google.rpc.Status", "google/rpc/status.proto", ["code", "message", "details"]),
    ("google.rpc.BadRequest", ERROR_DETAILS, ["field_violations"]),
    ("google.rpc.BadRequest.FieldViolation", ERROR_DETAILS,
     ["field", "description", "reason", "localized_message"]),
    ("google.rpc.ErrorInfo", ERROR_DETAILS, ["reason", "domain", "metadata"]),
    ("google.rpc.PreconditionFailure", ERROR_DETAILS, ["violations"]),
    ("google.rpc.RetryInfo", ERROR_DETAILS, ["retry_delay"]),
    ("google.rpc.QuotaFailure", ERROR_DETAILS, ["violations"]),
    ("google.rpc.ResourceInfo", ERROR_DETAILS,
     ["resource_type", "resource_name", "owner", "description"]),
]


@pytest.fixture
def address(start_server):
    return start_server(None).address


@pytest.fixture
def reflected_pool(address):
    """A descriptor pool that knows only what the server's reflection serves."""
    channel = grpc.insecure_channel(address)
    yield descriptor_pool.DescriptorPool(ProtoReflectionDescriptorDatabase(channel))
    channel.close()


@pytest.mark.parametrize("symbol, file_name, fields", DETAIL_TYPES)
def test_reflection_resolves_error_detail_types_by_symbol(reflected_pool, symbol, file_name,
                                                          fields):
    found = reflected_pool.FindMessageTypeByName(symbol)
    assert found.file.name == file_name
    assert [field.name for field in found.fields] == fields


def test_reflection_v1_serves_bad_request_with_its_imports(address):
    """grpcurl asks grpc.reflection.v1 first: the same request, v1 method path
    (the v1 and v1alpha messages are the same on the wire)."""
    with grpc.insecure_channel(address) as channel:
        call = channel.stream_stream(
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString)

        def ask(**request):
            answers = list(call(iter([reflection_pb2.ServerReflectionRequest(**request)]),
                                timeout=10))
            assert len(answers) == 1
            assert not answers[0].HasField("error_response"), answers[0].error_response
            return [descriptor_pb2.FileDescriptorProto.FromString(raw)
                    for raw in answers[0].file_descriptor_response.file_descriptor_proto]

        [error_details] = ask(file_containing_symbol="google.rpc.BadRequest")
        assert (error_details.name, error_details.package) == (ERROR_DETAILS, "google.rpc")
        assert list(error_details.dependency) == ["google/protobuf/duration.proto"]
        [duration] = ask(file_by_filename="google/protobuf/duration.proto")
        assert [message.name for message in duration.message_type] == ["Duration"]
        [status] = ask(file_containing_symbol="google.rpc.Status")
        assert list(status.dependency) == ["google/protobuf/any.proto"]


def test_invalid_argument_details_decode_with_reflected_types(pb, address, reflected_pool):
    pb2, pb2_grpc = pb
    status_class = message_factory.GetMessageClass(
        reflected_pool.FindMessageTypeByName("google.rpc.Status"))
    bad_request_class = message_factory.GetMessageClass(
        reflected_pool.FindMessageTypeByName("google.rpc.BadRequest"))
    with grpc.insecure_channel(address) as channel:
        pdp = pb2_grpc.PolicyDecisionPointStub(channel)
        request = pb2.DecideRequest(
            session=pb2.Session(actor="support-agent", session_id="s1", workspace="desk"),
            proposal=pb2.Proposal(call_id="c1", actor="support-agent", name="set_ticket",
                                  version=0,
                                  arguments_json='{"ticket":"lamp","status":"maybe"}'))
        with pytest.raises(grpc.RpcError) as raised:
            pdp.Decide(request, timeout=10)
    error = raised.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = dict(error.trailing_metadata())["grpc-status-details-bin"]
    status = status_class.FromString(details)
    assert status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    [detail] = status.details
    assert detail.type_url == "type.googleapis.com/google.rpc.BadRequest"
    bad_request = bad_request_class.FromString(detail.value)
    [violation] = bad_request.field_violations
    assert violation.field == "proposal.arguments.status"
    assert violation.description == (
        'fails the input schema of "set_ticket": `enum` at /properties/status/enum')
