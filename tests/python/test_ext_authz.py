"""toolgate as Envoy's external authorizer (issue 17), driven from Python
through grpcio as Envoy drives it: `envoy.service.auth.v3.Authorization/Check`
against a real `toolgate serve` on examples/tickets.toml plus an
`[ext_authz]` section.

Envoy's message types come from the server itself: its reflection serves
the descriptors of `envoy/service/auth/v3/external_auth.proto` and every
file it imports (compiled from the envoy-types crate's copy of Envoy's
protos), and the test builds its CheckRequest and CheckResponse classes
from them, as grpcurl would. So this also checks that reflection serves
Envoy's service whole."""

import hashlib
import json
import subprocess

import grpc
import pytest
from google.protobuf import descriptor_pool, message_factory
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from conftest import REPO, events_by_name, toolgate_bin

TICKETS = REPO / "examples" / "tickets.toml"
REVIEWER = [("authorization", "Bearer example-reviewer-token")]
CHECK = "/envoy.service.auth.v3.Authorization/Check"
MAPPING = """
[ext_authz]
actor_header = "x-agent"
session_header = "mcp-session-id"
workspace = "desk"
other_methods = "deny"
"""


class Envoy:
    """Check calls as Envoy's ext_authz filter makes them, with message
    classes built from the server's reflection."""

    def __init__(self, address):
        self.channel = grpc.insecure_channel(address)
        pool = descriptor_pool.DescriptorPool(ProtoReflectionDescriptorDatabase(self.channel))
        service = pool.FindServiceByName("envoy.service.auth.v3.Authorization")
        assert [method.name for method in service.methods] == ["Check"]
        self.CheckRequest = message_factory.GetMessageClass(
            pool.FindMessageTypeByName("envoy.service.auth.v3.CheckRequest"))
        self.CheckResponse = message_factory.GetMessageClass(
            pool.FindMessageTypeByName("envoy.service.auth.v3.CheckResponse"))
        self.check_rpc = self.channel.unary_unary(
            CHECK,
            request_serializer=self.CheckRequest.SerializeToString,
            response_deserializer=self.CheckResponse.FromString)

    def check(self, body, headers=None, method="POST", raw=False):
        request = self.CheckRequest()
        http = request.attributes.request.http
        http.method = method
        http.path = "/mcp"
        http.host = "tickets.local"
        http.protocol = "HTTP/1.1"
        http.headers[":method"] = method
        http.headers[":path"] = "/mcp"
        http.headers["content-type"] = "application/json"
        for key, value in (headers or {}).items():
            http.headers[key] = value
        if body is not None:
            if raw:
                http.raw_body = body.encode()
            else:
                http.body = body
        return self.check_rpc(request, timeout=10)

    def close(self):
        self.channel.close()


def tool_call(request_id, name, arguments):
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                       "params": {"name": name, "arguments": arguments}})


LEARNER = {"x-agent": "learner", "mcp-session-id": "9b2f0c4e-session"}


def metadata(answer):
    return dict(answer.dynamic_metadata.fields.items())


def allowed(answer, reason):
    assert answer.status.code == 0, answer
    assert answer.HasField("ok_response"), answer
    fields = {key: value.string_value for key, value in metadata(answer).items()}
    assert fields["outcome"] == "allow"
    assert fields["reason"] == reason
    upstream = {option.header.key: option.header.value for option in answer.ok_response.headers}
    assert upstream["x-toolgate-decision-id"] == fields["decision_id"]
    return fields


def denied(answer, reason):
    assert answer.status.code == grpc.StatusCode.PERMISSION_DENIED.value[0], answer
    assert answer.HasField("denied_response"), answer
    assert answer.denied_response.status.code == 403
    headers = {option.header.key: option.header.value
               for option in answer.denied_response.headers}
    assert headers["content-type"] == "application/json"
    body = json.loads(answer.denied_response.body)
    assert body["jsonrpc"] == "2.0"
    assert body["error"]["data"]["reason"] == reason, body
    assert metadata(answer)["reason"].string_value == reason
    return body


@pytest.fixture
def envoy(start_server, pb):
    server = start_server(TICKETS.read_text() + MAPPING)
    client = Envoy(server.address)
    client.server = server
    yield client
    client.close()


def test_a_tool_call_needs_approval_then_passes_once(envoy, pb):
    pb2, pb2_grpc = pb
    ticket = {"ticket": "lamp", "status": "done"}
    first = denied(envoy.check(tool_call(1, "set_ticket", ticket), LEARNER),
                   "approval-required")
    assert first["id"] == 1
    assert first["error"]["code"] == -32002
    approval_id = first["error"]["data"]["approval_id"]
    assert approval_id in first["error"]["message"]
    # A retry with a new JSON-RPC id (and a raw body) meets the same approval.
    retry = denied(envoy.check(tool_call("again", "set_ticket", ticket), LEARNER, raw=True),
                   "approval-required")
    assert retry["id"] == "again"
    assert retry["error"]["data"]["approval_id"] == approval_id
    assert retry["error"]["data"]["fingerprint"] == first["error"]["data"]["fingerprint"]

    approvals = pb2_grpc.ApprovalsStub(envoy.channel)
    granted = approvals.GrantApproval(pb2.GrantApprovalRequest(approval_id=approval_id),
                                      metadata=REVIEWER)
    assert granted.status == pb2.APPROVAL_STATUS_GRANTED
    passed = allowed(envoy.check(tool_call(3, "set_ticket", ticket), LEARNER), "approved")
    assert passed["approval_id"] == approval_id
    assert passed["fingerprint"] == first["error"]["data"]["fingerprint"]
    consumed = approvals.GetApproval(pb2.GetApprovalRequest(approval_id=approval_id),
                                     metadata=REVIEWER)
    assert consumed.status == pb2.APPROVAL_STATUS_CONSUMED
    # Consumed: the same call again needs a new approval.
    again = denied(envoy.check(tool_call(4, "set_ticket", ticket), LEARNER), "approval-required")
    assert again["error"]["data"]["approval_id"] != approval_id


def test_schema_failures_and_malformed_requests_are_denied(envoy):
    schema = denied(envoy.check(tool_call(7, "set_ticket", {"ticket": "lamp", "status": "maybe"}),
                                LEARNER), "invalid-arguments")
    assert schema["id"] == 7
    assert schema["error"]["message"].startswith("proposal.arguments.status: ")
    denied(envoy.check(tool_call(8, "no_such_tool", {}), LEARNER), "unknown-tool")
    denied(envoy.check("not json", LEARNER), "body-not-json")
    denied(envoy.check("[]", LEARNER), "batch-not-supported")
    denied(envoy.check(None, LEARNER), "body-missing")
    denied(envoy.check(tool_call(9, "set_ticket", {}),
                       {**LEARNER, "x-envoy-auth-partial-body": "true"}), "body-truncated")
    denied(envoy.check(tool_call(9, "set_ticket", {}), {**LEARNER, "mcp-name": "send_reply"}),
           "mcp-header-mismatch")
    listing = denied(envoy.check(json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
                                 LEARNER), "method-not-allowed")
    assert listing["id"] == 2
    smuggled = denied(envoy.check(tool_call(10, "set_ticket", {"ticket": "lamp"}), LEARNER,
                                  method="PUT"), "method-not-allowed")
    assert "is not a method of MCP's streamable HTTP" in smuggled["error"]["message"]
    in_a_get = denied(envoy.check(tool_call(11, "set_ticket", {"ticket": "lamp"}), LEARNER,
                                  method="GET"), "method-not-allowed")
    assert "but this one has a body" in in_a_get["error"]["message"]
    # Only UTF-8 JSON as sent is read: in UTF-7 the same bytes are another call.
    utf7 = denied(envoy.check(tool_call(12, "set_ticket", {"ticket": "+ACI-"}),
                              {**LEARNER, "content-type": "application/json; charset=utf-7"}),
                  "unsupported-media-type")
    assert "charset=utf-7" in utf7["error"]["message"]
    denied(envoy.check(tool_call(13, "set_ticket", {}), {**LEARNER, "content-encoding": "gzip"}),
           "unsupported-media-type")
    # Names a Go server reads as one ("params", "Params": the last wins).
    go = json.dumps({"jsonrpc": "2.0", "id": 15, "method": "tools/call",
                     "params": {"name": "set_ticket", "arguments": {"ticket": "lamp"}},
                     "Params": {"name": "send_reply", "arguments": {}}})
    denied(envoy.check(go, LEARNER), "ambiguous-member-names")
    # Two copies of the session header, as Envoy joins them.
    denied(envoy.check(tool_call(14, "set_ticket", {}),
                       {**LEARNER, "mcp-session-id": "9b2f0c4e-session,other"}),
           "session-missing")


def test_every_check_leaves_a_decision_line_with_its_id(start_server, pb):
    server = start_server(TICKETS.read_text() + MAPPING, ["--log-format", "json"])
    envoy = Envoy(server.address)
    answer = envoy.check(tool_call(1, "set_ticket", {"ticket": "lamp", "status": "open"}),
                         LEARNER)
    envoy.close()
    decision_id = metadata(answer)["decision_id"].string_value
    decisions = events_by_name(server.stop()).get("decision", [])
    assert [line["decision_id"] for line in decisions] == [decision_id]
    assert decisions[0]["reason"] == "approval-required"


ENVOY_TOKEN = "envoy-proxy-token"
WITH_HOST = f"""
[ext_authz]
actor_header = "x-agent"
workspace = "desk"
host_credential = "envoy"

[[credentials]]
kind = "host"
identity = "envoy"
actors = ["learner"]
sha256 = "{hashlib.sha256(ENVOY_TOKEN.encode()).hexdigest()}"
"""


def test_the_ext_authz_listener_takes_checks_without_a_token_as_its_host(start_server):
    policy = TICKETS.read_text().replace("open_host_api = true", "open_host_api = false")
    server = start_server(policy + WITH_HOST, ["--ext-authz-listen", "127.0.0.1:0"])
    line = server.process.stdout.readline()
    assert line.startswith("toolgate ext_authz on "), line
    address = line.rsplit(" ", 1)[1].strip()
    # Reflection is not served there: the message classes come from the
    # gRPC listener's reflection, the Checks go to the ext_authz listener.
    reflected = Envoy(server.address)
    channel = grpc.insecure_channel(address)
    check = channel.unary_unary(
        CHECK,
        request_serializer=reflected.CheckRequest.SerializeToString,
        response_deserializer=reflected.CheckResponse.FromString)
    reflected.check_rpc = check
    ticket = {"ticket": "lamp", "status": "done"}
    body = denied(reflected.check(tool_call(1, "set_ticket", ticket),
                                  {"x-agent": "learner", "mcp-session-id": "s1"}),
                  "approval-required")
    assert body["error"]["data"]["approval_id"]
    # The gRPC listener still wants the host's token.
    reflected.check_rpc = reflected.channel.unary_unary(
        CHECK,
        request_serializer=reflected.CheckRequest.SerializeToString,
        response_deserializer=reflected.CheckResponse.FromString)
    with pytest.raises(grpc.RpcError) as raised:
        reflected.check(tool_call(1, "set_ticket", ticket), {"x-agent": "learner"})
    assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
    channel.close()
    reflected.close()


def test_the_ext_authz_listener_needs_a_host_credential(tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text(TICKETS.read_text() + MAPPING)
    done = subprocess.run(
        [toolgate_bin(), "serve", "--listen", "127.0.0.1:0", "--store", "memory",
         "--ext-authz-listen", "127.0.0.1:0", "--config", str(policy)],
        capture_output=True, text=True, timeout=30)
    assert done.returncode != 0
    assert "--ext-authz-listen needs [ext_authz] host_credential" in done.stderr
