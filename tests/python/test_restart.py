"""Restarts on one data directory (issue 15), from Python (grpcio), against
real `toolgate serve --data-dir DIR` processes on
tests/fixtures/policies/crash.toml: a grant given before the server stops,
by SIGKILL or by SIGTERM, is still there after it starts again; the
Dispatch it allows commits exactly once; its receipt survives the next stop
too, so sending the Dispatch again answers `replayed` with the same receipt
and changes nothing."""

import json
import signal

import grpc
import pytest

from conftest import REPO, Server

POLICY = REPO / "tests" / "fixtures" / "policies" / "crash.toml"
HOST = [("authorization", "Bearer host-secret")]
REVIEWER = [("authorization", "Bearer alice-secret")]


@pytest.fixture
def servers(tmp_path):
    """start() -> a Server on the crash policy and tmp_path/data, the same
    directory each time; whatever still runs at the end is killed."""
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY.read_text())
    data = tmp_path / "data"  # made by the first start, owner-only
    started = []

    def start():
        server = Server(policy, ["--data-dir", str(data)])
        started.append(server)
        return server

    yield start
    for server in started:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait(timeout=10)


def stop(server, how):
    """Stops `server` with SIGKILL or SIGTERM and checks how it ended."""
    if how == "sigkill":
        server.process.kill()
        assert server.process.wait(timeout=10) == -signal.SIGKILL
    else:
        server.process.terminate()
        assert server.process.wait(timeout=10) == 0, "SIGTERM stops toolgate cleanly"


class Client:
    def __init__(self, pb, address):
        self.pb2, pb2_grpc = pb
        self.channel = grpc.insecure_channel(address)
        self.pdp = pb2_grpc.PolicyDecisionPointStub(self.channel)
        self.approvals = pb2_grpc.ApprovalsStub(self.channel)
        self.resources = pb2_grpc.ResourcesStub(self.channel)

    def close(self):
        self.channel.close()

    def approval_status(self, approval_id):
        """The approval's status, or the gRPC code GetApproval fails with."""
        try:
            return self.approvals.GetApproval(
                self.pb2.GetApprovalRequest(approval_id=approval_id), metadata=REVIEWER).status
        except grpc.RpcError as error:
            return error.code()

    def resource(self, name):
        found = self.resources.GetResource(self.pb2.GetResourceRequest(name=name), metadata=HOST)
        return found.value_json, found.version


@pytest.mark.parametrize("how", ["sigkill", "sigterm"])
def test_a_grant_and_its_receipt_survive_restarts(pb, servers, how):
    pb2 = pb[0]
    session = pb2.Session(actor="a0", session_id="py", workspace="crash")
    value = f"after-{how}"
    proposal = pb2.Proposal(call_id="py1", actor="a0", name="gset", version=0,
                            arguments_json=json.dumps({"item": "k0", "value": value}))
    decide = pb2.DecideRequest(session=session, proposal=proposal)
    dispatch = pb2.DispatchRequest(session=session, proposal=proposal)

    server = servers()
    client = Client(pb, server.address)
    asked = client.pdp.Decide(decide, metadata=HOST)
    assert (asked.outcome, asked.reason) == (pb2.OUTCOME_REQUIRE_APPROVAL, "approval-required"), asked
    approval_id = asked.approval_id
    granted = client.approvals.GrantApproval(
        pb2.GrantApprovalRequest(approval_id=approval_id, comment="ok"), metadata=REVIEWER)
    assert granted.status == pb2.APPROVAL_STATUS_GRANTED
    client.close()
    stop(server, how)

    # The grant survived the stop; the Dispatch it allows commits once.
    server = servers()
    client = Client(pb, server.address)
    assert client.approval_status(approval_id) == pb2.APPROVAL_STATUS_GRANTED
    assert client.resource("k0") == ('"initial"', 0)
    committed = client.pdp.Dispatch(dispatch, metadata=HOST)
    assert (committed.status, committed.reason, committed.replayed) == (
        pb2.DISPATCH_STATUS_OK, "committed", False), committed
    assert (committed.version, committed.resource, committed.value_json) == (1, "k0", json.dumps(value))
    assert committed.receipt_id != ""
    assert client.approval_status(approval_id) == pb2.APPROVAL_STATUS_CONSUMED
    replayed = client.pdp.Dispatch(dispatch, metadata=HOST)
    assert (replayed.status, replayed.replayed, replayed.receipt_id, replayed.version) == (
        pb2.DISPATCH_STATUS_OK, True, committed.receipt_id, 1), replayed
    client.close()
    stop(server, how)

    # The receipt survived the second stop: a replay, nothing committed again.
    server = servers()
    client = Client(pb, server.address)
    replayed = client.pdp.Dispatch(dispatch, metadata=HOST)
    assert (replayed.status, replayed.reason, replayed.replayed) == (
        pb2.DISPATCH_STATUS_OK, "replayed", True), replayed
    assert (replayed.receipt_id, replayed.version, replayed.resource, replayed.value_json) == (
        committed.receipt_id, 1, "k0", json.dumps(value))
    assert client.resource("k0") == (json.dumps(value), 1), "committed exactly once"
    assert client.approval_status(approval_id) == pb2.APPROVAL_STATUS_CONSUMED
    info = client.pdp.GetSession(pb2.GetSessionRequest(session_id="py"), metadata=HOST)
    assert (info.decisions, info.executed_tools) == (1, 1), info
    client.close()
    server.stop()
