"""The polyglot host examples, run against a real `toolgate serve` process on
examples/tickets.toml: examples/python/host.py (grpcio) and
examples/node/host.mjs (@grpc/grpc-js). The test plays the reviewer with the
`toolgate approvals grant` CLI each time a host prints `waiting approval_id=`.
Each host runs as an executable (its shebang), twice on one server, and with
a host token from `--token` or TOOLGATE_HOST_TOKEN. Also checks that the request bodies of the ghz configs in benches/ghz/ are
accepted by the server and answer what benches/ghz/README.md says."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading

import grpc
import pytest
from google.protobuf import json_format, message_factory

from conftest import REPO, toolgate_bin, reap

TICKETS = REPO / "examples" / "tickets.toml"
PYTHON_HOST = REPO / "examples" / "python" / "host.py"
NODE_DIR = REPO / "examples" / "node"
GHZ_DIR = REPO / "benches" / "ghz"
REVIEWER_TOKEN = "example-reviewer-token"
REVIEWER = [("authorization", f"Bearer {REVIEWER_TOKEN}")]
HOST_TOKEN = "example-host-token"
HOST_CREDENTIAL = f"""
[[credentials]]
kind = "host"
identity = "example-host"
sha256 = "{hashlib.sha256(HOST_TOKEN.encode()).hexdigest()}"
actors = ["learner"]
"""
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


def run_host(args, reviewer, tmp_path, on_waiting=None, env=None):
    """Runs a host to its end, answering each `waiting approval_id=X` line
    (by default: grant X with the CLI). Returns (exit code, parsed lines, stderr)."""
    on_waiting = on_waiting or reviewer.grant_with_cli
    stderr_path = tmp_path / "host-stderr.txt"
    with open(stderr_path, "w") as stderr_file:
        process = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=stderr_file,
                                   text=True, env=env)
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
        reap(process, watchdog)
        process.stdout.close()
    return code, lines, stderr_path.read_text()



def assert_refused_without_token(name, host, reviewer, tmp_path, lamp):
    """`host` run with no token exits 1 on UNAUTHENTICATED, printing nothing on
    stdout, and leaves the lamp at `lamp`."""
    code, lines, stderr = run_host(host, reviewer, tmp_path, env=script_env())
    assert code == 1, f"{name} without a token exited {code}: {lines} {stderr}"
    assert lines == []
    assert stderr.startswith("host: UNAUTHENTICATED: ") and "authorization" in stderr, stderr
    assert reviewer.resource("lamp") == lamp, "the refused run changed nothing"

def script_env(**overrides):
    """The environment a host runs in as an executable: its shebang's
    `env python3` finds this interpreter; no TOOLGATE_HOST_TOKEN (nor the
    CLI's TOOLGATE_TOKEN) unless given."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("TOOLGATE_TOKEN", "TOOLGATE_HOST_TOKEN")}
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    env.update(overrides)
    return env


def node_host():
    """The path of host.mjs, once node and its packages are there."""
    assert shutil.which("node") is not None, "node is not on PATH (CI installs node 20)"
    assert (NODE_DIR / "node_modules" / "@grpc" / "grpc-js").is_dir(), (
        "examples/node has no node_modules: run `npm ci --no-audit --no-fund` in examples/node")
    return NODE_DIR / "host.mjs"


@pytest.fixture
def tickets_server(start_server):
    return start_server(TICKETS.read_text())


@pytest.fixture
def tickets_server_with_host_token(start_server):
    # A host credential closes the host API: the open setting goes.
    return start_server(TICKETS.read_text().replace("open_host_api = true", "open_host_api = false")
                        + HOST_CREDENTIAL)


@pytest.mark.parametrize("script, interpreter", [
    (PYTHON_HOST, "python3"),
    (REPO / "examples" / "python" / "quickstart.py", "python3"),
    (NODE_DIR / "host.mjs", "node"),
])
def test_examples_are_executable(script, interpreter):
    assert os.access(script, os.X_OK), f"{script.relative_to(REPO)} has no run bit"
    assert script.read_text().splitlines()[0] == f"#!/usr/bin/env {interpreter}"


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


def python_host_run(lines):
    """(call ids, proposal versions, receipt versions) of one host.py run."""
    proposals = [fields for word, fields in lines if word == "propose"]
    receipts = [fields for word, fields in lines if word == "receipt"]
    return ([p["call_id"] for p in proposals], [p["version"] for p in proposals],
            [r["version"] for r in receipts])


def test_python_host_runs_twice_on_one_server(pb, tickets_server, tmp_path):
    reviewer = Reviewer(pb, tickets_server.address)
    runs = []
    for _ in range(2):
        code, lines, stderr = run_host(
            [str(PYTHON_HOST), "--server", tickets_server.address, "--timeout", "20"],
            reviewer, tmp_path, env=script_env())
        assert code == 0, f"host.py exited {code}: {lines} {stderr}"
        assert [word for word, _ in lines] == [
            "propose", "decide", "waiting", "decide", "receipt",
            "propose", "decide", "waiting", "decide", "receipt", "done"]
        runs.append(python_host_run(lines))

    (first_ids, first_versions, first_receipts), (second_ids, second_versions, second_receipts) = runs
    # Each run is a new session with new call ids, proposed at the version the state has.
    session = first_ids[0].rsplit("-", 1)[0]
    assert session.startswith("py-") and first_ids == [f"{session}-1", f"{session}-2"]
    second_session = second_ids[0].rsplit("-", 1)[0]
    assert second_session != session and second_ids == [f"{second_session}-1", f"{second_session}-2"]
    assert (first_versions, first_receipts) == (["0", "1"], ["1", "2"])
    assert (second_versions, second_receipts) == (["2", "3"], ["3", "4"])
    assert reviewer.resource("lamp") == ("done", 4)
    assert reviewer.resource("outbox") == ([REPLY, REPLY], 4)
    reviewer.channel.close()


def test_python_host_sends_its_token(pb, tickets_server_with_host_token, tmp_path):
    address = tickets_server_with_host_token.address
    reviewer = Reviewer(pb, address)
    host = [str(PYTHON_HOST), "--server", address, "--timeout", "20"]

    code, lines, stderr = run_host(host + ["--token", HOST_TOKEN], reviewer, tmp_path,
                                   env=script_env())
    assert code == 0, f"host.py --token exited {code}: {lines} {stderr}"
    assert python_host_run(lines)[1:] == (["0", "1"], ["1", "2"])

    code, lines, stderr = run_host(host, reviewer, tmp_path,
                                   env=script_env(TOOLGATE_HOST_TOKEN=HOST_TOKEN))
    assert code == 0, f"host.py with TOOLGATE_HOST_TOKEN exited {code}: {lines} {stderr}"
    assert python_host_run(lines)[1:] == (["2", "3"], ["3", "4"])

    assert_refused_without_token("host.py", host, reviewer, tmp_path, ("done", 4))
    reviewer.channel.close()


def test_node_host_runs_twice_with_its_token(pb, tickets_server_with_host_token, tmp_path):
    address = tickets_server_with_host_token.address
    reviewer = Reviewer(pb, address)
    host = [str(node_host()), "--server", address, "--timeout", "20"]
    runs = [
        run_host(host + ["--token", HOST_TOKEN], reviewer, tmp_path, env=script_env()),
        run_host(host, reviewer, tmp_path, env=script_env(TOOLGATE_HOST_TOKEN=HOST_TOKEN)),
    ]
    call_ids = []
    for (code, lines, stderr), (version, committed) in zip(runs, [("0", "1"), ("1", "2")]):
        assert code == 0, f"host.mjs exited {code}: {lines} {stderr}"
        assert [word for word, _ in lines] == ["propose", "decide", "waiting", "decide", "receipt",
                                               "done"]
        assert lines[0][1]["version"] == version, "proposed at the version the state has"
        assert (lines[4][1]["version"], lines[4][1]["replayed"]) == (committed, "false")
        call_ids.append(lines[0][1]["call_id"])
    assert all(call_id.startswith("node-") and call_id.endswith("-1") for call_id in call_ids)
    assert call_ids[0] != call_ids[1], "each run is a new session"
    assert reviewer.resource("lamp") == ("done", 2)

    assert_refused_without_token("host.mjs", host, reviewer, tmp_path, ("done", 2))
    reviewer.channel.close()


def test_node_host_decides_and_dispatches(pb, tickets_server, tmp_path):
    node = shutil.which("node")
    reviewer = Reviewer(pb, tickets_server.address)
    code, lines, stderr = run_host(
        [node, str(node_host()), "--server", tickets_server.address, "--session", "node-s1"],
        reviewer, tmp_path)
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


def test_hosts_send_a_token_over_plaintext_only_to_loopback(tmp_path):
    """A token for a server off this machine over plaintext is a usage error
    (exit 2), before anything is sent; --insecure-plaintext allows it."""
    for host in (str(PYTHON_HOST), str(node_host())):
        refused = subprocess.run([host, "--server", "10.0.0.7:50051", "--token", "t"],
                                 env=script_env(), capture_output=True, text=True, timeout=60)
        assert refused.returncode == 2, (host, refused)
        assert "only to loopback" in refused.stderr, (host, refused.stderr)
