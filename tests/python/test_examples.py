"""The polyglot host examples, run against a real `toolgate serve` process on
examples/tickets.toml: examples/python/host.py (grpcio) and
examples/node/host.mjs (@grpc/grpc-js). The test plays the reviewer with the
`toolgate approvals grant` CLI each time a host prints `waiting approval_id=`.
Also checks that the request bodies of the ghz configs in benches/ghz/ are
accepted by the server and answer what benches/ghz/README.md says."""

import json
import os
import shutil
import subprocess
import sys
import threading

import grpc
import pytest
from google.protobuf import json_format, message_factory

from conftest import REPO, toolgate_bin

TICKETS = REPO / "examples" / "tickets.toml"
PYTHON_HOST = REPO / "examples" / "python" / "host.py"
NODE_DIR = REPO / "examples" / "node"
GHZ_DIR = REPO / "benches" / "ghz"
REVIEWER_TOKEN = "example-reviewer-token"
REVIEWER = [("authorization", f"Bearer {REVIEWER_TOKEN}")]
HOST_DEADLINE_SECONDS = 60  # a host that has not finished by then is killed
REPLY = {"recipient": "customer-42", "text": "Your lamp is fixed."}


def parse(line):
    """`word k=v k=v ... value=<json>` -> (word, {k: v}); `value`/`arguments` are JSON, always last."""
    word, _, rest = line.partition(" ")
    fields = {}
    while rest:
        key, _, rest = rest.partition("=")
        if key in ("value", "arguments"):
            fields[key] = json.loads(rest)
            break
        fields[key], _, rest = rest.partition(" ")
    return word, fields


class Reviewer:
    """Grants through the CLI, checks through the reviewer API."""

    def __init__(self, pb, address):
        self.pb2, pb2_grpc = pb
        self.address = address
        self.channel = grpc.insecure_channel(address)
        self.approvals = pb2_grpc.ApprovalsStub(self.channel)
        self.resources = pb2_grpc.ResourcesStub(self.channel)

    def grant_with_cli(self, approval_id):
        done = subprocess.run(
            [toolgate_bin(), "approvals", "grant", approval_id, "--server", f"http://{self.address}"],
            env={**os.environ, "TOOLGATE_TOKEN": REVIEWER_TOKEN},
            capture_output=True, text=True, timeout=30,
        )
        assert done.returncode == 0, (
            f"`toolgate approvals grant {approval_id}` failed with {done.returncode}:\n"
            f"{done.stdout}{done.stderr}")
        approval = self.approval(approval_id)
        # The host may already have dispatched (and so consumed) it.
        assert approval.status in (self.pb2.APPROVAL_STATUS_GRANTED,
                                   self.pb2.APPROVAL_STATUS_CONSUMED), approval
        assert approval.decided_by == "reviewer"

    def approval(self, approval_id):
        return self.approvals.GetApproval(
            self.pb2.GetApprovalRequest(approval_id=approval_id), metadata=REVIEWER)

    def resource(self, name):
        found = self.resources.GetResource(self.pb2.GetResourceRequest(name=name), metadata=REVIEWER)
        return json.loads(found.value_json), found.version


def run_host(args, reviewer, tmp_path, on_waiting=None):
    """Runs a host to its end, answering each `waiting approval_id=X` line
    (by default: grant X with the CLI). Returns (exit code, parsed lines, stderr)."""
    on_waiting = on_waiting or reviewer.grant_with_cli
    stderr_path = tmp_path / "host-stderr.txt"
    with open(stderr_path, "w") as stderr_file:
        process = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=stderr_file,
                                   text=True)
    watchdog = threading.Timer(HOST_DEADLINE_SECONDS, process.kill)
    watchdog.start()
    lines = []
    try:
        for line in process.stdout:
            word, fields = parse(line.rstrip("\n"))
            lines.append((word, fields))
            if word == "waiting":
                on_waiting(fields["approval_id"])
        code = process.wait()
    finally:
        watchdog.cancel()
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdout.close()
    return code, lines, stderr_path.read_text()


@pytest.fixture
def tickets_server(start_server):
    return start_server(TICKETS.read_text())


def test_python_host_runs_the_two_ticket_loop(pb, tickets_server, tmp_path):
    reviewer = Reviewer(pb, tickets_server.address)
    code, lines, stderr = run_host(
        [sys.executable, str(PYTHON_HOST), "--server", tickets_server.address,
         "--session", "py-s1", "--timeout", "20"],
        reviewer, tmp_path)
    assert code == 0, f"host.py exited {code}: {lines} {stderr}"
    assert [word for word, _ in lines] == [
        "propose", "decide", "waiting", "decide", "receipt",
        "propose", "decide", "waiting", "decide", "receipt", "done"]

    proposals = [fields for word, fields in lines if word == "propose"]
    assert [(p["call_id"], p["tool"], p["version"]) for p in proposals] == [
        ("py-s1-1", "set_ticket", "0"), ("py-s1-2", "send_reply", "1")], \
        "the second proposal is made at the version the first Dispatch returned"
    decisions = [(f["outcome"], f["reason"]) for word, f in lines if word == "decide"]
    assert decisions == [("REQUIRE_APPROVAL", "approval-required"), ("ALLOW", "approved")] * 2

    waited = [fields["approval_id"] for word, fields in lines if word == "waiting"]
    assert len(set(waited)) == 2

    lamp, outbox = [fields for word, fields in lines if word == "receipt"]
    assert (lamp["call_id"], lamp["resource"], lamp["version"], lamp["replayed"], lamp["value"]) == (
        "py-s1-1", "lamp", "1", "false", "done")
    assert (outbox["call_id"], outbox["resource"], outbox["version"], outbox["replayed"],
            outbox["value"]) == ("py-s1-2", "outbox", "2", "false", REPLY), \
        "an append's receipt carries the item appended, not the queue"
    assert lamp["receipt_id"] and outbox["receipt_id"] and lamp["receipt_id"] != outbox["receipt_id"]

    # The reviewer's view agrees: both changes committed (global scope: one version, now 2),
    # and each grant was consumed by its Dispatch.
    assert reviewer.resource("lamp") == ("done", 2)
    assert reviewer.resource("outbox") == ([REPLY], 2)
    for approval_id in waited:
        assert reviewer.approval(approval_id).status == reviewer.pb2.APPROVAL_STATUS_CONSUMED
    reviewer.channel.close()


def test_python_host_stops_when_the_reviewer_denies(pb, tickets_server, tmp_path):
    reviewer = Reviewer(pb, tickets_server.address)

    def deny(approval_id):
        reviewer.approvals.DenyApproval(
            reviewer.pb2.DenyApprovalRequest(approval_id=approval_id, reason="not today"),
            metadata=REVIEWER)

    code, lines, stderr = run_host(
        [sys.executable, str(PYTHON_HOST), "--server", tickets_server.address,
         "--session", "py-s2", "--timeout", "20"],
        reviewer, tmp_path, on_waiting=deny)
    assert code == 1, f"host.py exited {code}: {lines} {stderr}"
    assert [word for word, _ in lines] == ["propose", "decide", "waiting", "decide"]
    assert (lines[-1][1]["outcome"], lines[-1][1]["reason"]) == ("DENY", "approval-denied")
    assert "approval-denied" in stderr
    assert reviewer.resource("lamp") == ("open", 0), "nothing was committed"
    reviewer.channel.close()


def test_node_host_decides_and_dispatches(pb, tickets_server, tmp_path):
    node = shutil.which("node")
    assert node is not None, "node is not on PATH (CI installs node 20)"
    assert (NODE_DIR / "node_modules" / "@grpc" / "grpc-js").is_dir(), (
        "examples/node has no node_modules: run `npm ci --no-audit --no-fund` in examples/node")
    reviewer = Reviewer(pb, tickets_server.address)
    code, lines, stderr = run_host(
        [node, str(NODE_DIR / "host.mjs"), "--server", tickets_server.address], reviewer, tmp_path)
    assert code == 0, f"host.mjs exited {code}: {lines} {stderr}"
    assert [word for word, _ in lines] == ["propose", "decide", "waiting", "decide", "receipt", "done"]
    assert (lines[0][1]["call_id"], lines[0][1]["tool"], lines[0][1]["version"],
            lines[0][1]["arguments"]) == ("node-s1-1", "set_ticket", "0",
                                          {"ticket": "lamp", "status": "done"})
    decisions = [(f["outcome"], f["reason"]) for word, f in lines if word == "decide"]
    assert decisions == [("REQUIRE_APPROVAL", "approval-required"), ("ALLOW", "approved")]
    receipt = lines[4][1]
    assert (receipt["call_id"], receipt["resource"], receipt["version"], receipt["replayed"],
            receipt["value"]) == ("node-s1-1", "lamp", "1", "false", "done")
    assert receipt["receipt_id"]
    assert reviewer.resource("lamp") == ("done", 1)
    assert reviewer.approval(lines[2][1]["approval_id"]).status == reviewer.pb2.APPROVAL_STATUS_CONSUMED
    reviewer.channel.close()


# ----- benches/ghz: the request bodies are accepted and answer as documented -----

GHZ_KEYS = {  # the JSON keys of ghz's runner.Config that these files may use
    "name", "call", "host", "insecure", "total", "concurrency", "connections", "timeout",
    "duration", "max-duration", "data", "metadata", "skipFirst", "cpus", "format", "output",
}


def ghz_request(pb, config_name, request_number=0):
    """The config's call and its data rendered like ghz does for one request number."""
    pb2, pb2_grpc = pb
    config = json.loads((GHZ_DIR / config_name).read_text())
    assert set(config) <= GHZ_KEYS, set(config) - GHZ_KEYS
    assert "proto" not in config and "protoset" not in config, "ghz must use reflection"
    package, service, method = config["call"].rsplit(".", 2)
    assert package == "toolgate.v1"
    descriptor = pb2.DESCRIPTOR.services_by_name[service].methods_by_name[method]
    rendered = json.dumps(config["data"]).replace("{{.RequestNumber}}", str(request_number))
    assert "{{" not in rendered
    request = json_format.ParseDict(json.loads(rendered),
                                    message_factory.GetMessageClass(descriptor.input_type)())
    stub = getattr(pb2_grpc, f"{service}Stub")
    return config, request, stub, method


def call_ghz(pb, address, config_name, request_number=0):
    _, request, stub_class, method = ghz_request(pb, config_name, request_number)
    with grpc.insecure_channel(address) as channel:
        return getattr(stub_class(channel), method)(request, timeout=5)


def test_ghz_configs_on_the_embedded_policy(pb, start_server):
    pb2, _ = pb
    configs = sorted(path.name for path in GHZ_DIR.glob("*.json"))
    assert configs == ["assess-manifest.json", "decide-allow-new-calls.json", "decide-allow.json",
                       "decide-pending.json", "dispatch-replay.json"]
    address = start_server(None).address

    for _ in range(2):  # same call id, same answer, costs nothing
        allowed = call_ghz(pb, address, "decide-allow.json")
        assert (allowed.outcome, allowed.reason) == (pb2.OUTCOME_ALLOW, "allowed"), allowed

    fresh = [call_ghz(pb, address, "decide-allow-new-calls.json", n) for n in (0, 1)]
    assert [(a.outcome, a.reason) for a in fresh] == [(pb2.OUTCOME_ALLOW, "allowed")] * 2
    assert fresh[0].fingerprint != fresh[1].fingerprint, "a new call id per request"

    pending = [call_ghz(pb, address, "decide-pending.json") for _ in range(3)]
    assert {(a.outcome, a.reason) for a in pending} == {
        (pb2.OUTCOME_REQUIRE_APPROVAL, "approval-threshold-exceeded")}
    assert len({a.approval_id for a in pending}) == 1 and pending[0].approval_id, \
        "every request hits the one pending approval"

    assessed = call_ghz(pb, address, "assess-manifest.json")
    assert (assessed.accepted, assessed.reason) == (True, pb2.ASSESS_REASON_MATCHED), assessed


def test_ghz_dispatch_replay_after_the_documented_setup(pb, start_server):
    pb2, pb2_grpc = pb
    address = start_server(TICKETS.read_text()).address
    # The one-time setup of benches/ghz/README.md: Decide, grant, Dispatch (commits c1).
    _, request, _, _ = ghz_request(pb, "dispatch-replay.json")
    with grpc.insecure_channel(address) as channel:
        pdp = pb2_grpc.PolicyDecisionPointStub(channel)
        decision = pdp.Decide(pb2.DecideRequest(session=request.session, proposal=request.proposal))
        assert decision.outcome == pb2.OUTCOME_REQUIRE_APPROVAL
        pb2_grpc.ApprovalsStub(channel).GrantApproval(
            pb2.GrantApprovalRequest(approval_id=decision.approval_id), metadata=REVIEWER)
        committed = pdp.Dispatch(request)
        assert (committed.status, committed.replayed, committed.version) == (
            pb2.DISPATCH_STATUS_OK, False, 1)
    for _ in range(2):
        replayed = call_ghz(pb, address, "dispatch-replay.json")
        assert (replayed.status, replayed.reason, replayed.replayed, replayed.version,
                replayed.receipt_id) == (pb2.DISPATCH_STATUS_OK, "replayed", True, 1,
                                         committed.receipt_id)
