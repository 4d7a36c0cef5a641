"""The Python client package (clients/python): its committed stubs are what
clients/python/generate_stubs.py makes today; it installs into a fresh venv;
the quickstart (examples/python/quickstart.py, also printed in README.md)
runs with it against the embedded default policy and prints every outcome
and reason. Also: an actor the policy does not know is named in the DENY."""

import contextlib
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import threading

import grpc
import pytest

from conftest import REPO, Server, toolgate_bin, reap

PACKAGE = REPO / "clients" / "python"
QUICKSTART = REPO / "examples" / "python" / "quickstart.py"
INSTALL_TIMEOUT_SECONDS = 300
RUN_TIMEOUT_SECONDS = 60


def test_committed_stubs_are_up_to_date():
    done = subprocess.run([sys.executable, str(PACKAGE / "generate_stubs.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (
        "the committed stubs in clients/python/src/toolgate_client differ from "
        f"proto/toolgate/v1/toolgate.proto: {done.stderr}")
    assert done.stderr == ""


def test_readme_quickstart_is_the_example_file():
    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    quickstarts = [block for block in blocks if "from toolgate_client import" in block
                   and "toolgate quickstart" in block]
    assert quickstarts == [QUICKSTART.read_text()], \
        "README.md's quickstart block must be examples/python/quickstart.py verbatim"


def site_packages(python):
    """The purelib and platlib directories of an interpreter (often one)."""
    done = subprocess.run(
        [python, "-c", "import sysconfig; p = sysconfig.get_paths();"
                       " print(p['purelib']); print(p['platlib'])"],
        capture_output=True, text=True, check=True, timeout=60)
    return list(dict.fromkeys(done.stdout.split()))


def dependencies_here():
    """True when this interpreter has what the package needs to build and run
    (grpcio-tools brings setuptools), so the install can be done offline."""
    try:
        import google.protobuf  # noqa: F401
        import grpc as _grpc  # noqa: F401
        import setuptools  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(scope="module")
def fresh_python(tmp_path_factory):
    """A new venv with clients/python installed by `pip install`; returns its python.

    Offline when this test environment already has the dependencies: the new
    venv sees this one's site-packages through a .pth file (appended after
    its own), its bundled setuptools is removed so that this environment's
    newer one builds the package, and pip runs with --no-index
    --no-build-isolation. Otherwise pip fetches the dependencies from the
    index, as `pip install ./clients/python` does on a user's machine.
    """
    root = tmp_path_factory.mktemp("client-venv")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True,
                   timeout=INSTALL_TIMEOUT_SECONDS)
    python = str(venv / "bin" / "python")
    # Install from a copy: pip builds in the source tree (build/, *.egg-info).
    source = root / "toolgate-client"
    shutil.copytree(PACKAGE, source, ignore=shutil.ignore_patterns(
        "build", "*.egg-info", "__pycache__"))
    pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    if dependencies_here():
        (pathlib.Path(site_packages(python)[0]) / "toolgate-test-deps.pth").write_text(
            "\n".join(site_packages(sys.executable)) + "\n")
        subprocess.run([python, "-m", "pip", "uninstall", "--quiet", "--yes", "setuptools"],
                       capture_output=True, text=True, timeout=INSTALL_TIMEOUT_SECONDS)
        pip += ["--no-index", "--no-build-isolation"]
    done = subprocess.run(pip + [str(source)], capture_output=True, text=True,
                          timeout=INSTALL_TIMEOUT_SECONDS)
    assert done.returncode == 0, f"pip install clients/python failed:\n{done.stdout}{done.stderr}"
    return python


def test_the_package_installs_into_a_fresh_venv(fresh_python):
    done = subprocess.run(
        [fresh_python, "-c", "import sys, toolgate_client; print(toolgate_client.__file__);"
                             " print(sys.prefix)"],
        capture_output=True, text=True, timeout=60, cwd="/")
    assert done.returncode == 0, done.stderr
    module_file, prefix = done.stdout.split()
    assert module_file.startswith(prefix), "imported from the venv, not from the repository"
    assert not module_file.startswith(str(REPO))


class EmbeddedServer:
    """`toolgate serve` on the embedded default, with the reviewer token it
    prints on stderr (the server's own thread drains the rest)."""

    def __init__(self):
        self.server = Server(None, [])
        self.token = None
        for _ in range(50):
            line = self.server.stderr_line()
            if not line:
                break
            if "reviewer token" in line:
                self.token = line.rsplit(" ", 1)[1].strip()
                break
        assert self.token, "serve on the embedded policy printed no reviewer token"
        self.address = self.server.address

    def grant_with_cli(self, approval_id):
        done = subprocess.run(
            [toolgate_bin(), "approvals", "grant", approval_id, "--server",
             f"http://{self.address}"],
            env={**os.environ, "TOOLGATE_TOKEN": self.token},
            capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, f"approvals grant failed: {done.stdout}{done.stderr}"

    def stop(self):
        self.server.stop()


@pytest.fixture
def embedded_server():
    server = EmbeddedServer()
    yield server
    server.stop()


def run_quickstart(python, server, cwd):
    """Runs the quickstart, granting with the CLI the approval it says it waits for."""
    process = subprocess.Popen([python, str(QUICKSTART), server.address], cwd=cwd,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watchdog = threading.Timer(RUN_TIMEOUT_SECONDS, process.kill)
    watchdog.start()
    lines = []
    try:
        for line in process.stdout:
            lines.append(line.rstrip("\n"))
            waiting = re.search(r"toolgate approvals grant (\S+)$", line)
            if waiting:
                server.grant_with_cli(waiting.group(1))
        stderr = process.stderr.read()
        code = process.wait()
    finally:
        reap(process, watchdog)
    return code, lines, stderr


UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


def expected_quickstart(before, version):
    """The lines the quickstart prints on a server whose lamp is `before` at `version`."""
    return [
        rf'session (s[0-9a-f]{{12}}): lamp is "{before}" at version {version}',
        r'decide draft_reply: ALLOW allowed \("draft_reply" may run\)',
        r'decide change_role: DENY forbidden-tool \(tool "change_role" is forbidden by policy\)',
        r"decide set_ticket: REQUIRE_APPROVAL approval-required \(.+\)",
        rf"waiting up to 120 s for a reviewer; in a second terminal:"
        rf" toolgate approvals grant ({UUID})",
        r"verdict set_ticket: ALLOW approved \(.+\)",
        rf'dispatch set_ticket: OK committed \(.+\) lamp="done" version={version + 1}'
        rf" receipt=({UUID}) replayed=False",
    ]


def test_quickstart_runs_against_the_embedded_default(fresh_python, embedded_server, tmp_path):
    sessions = []
    for before, version in [("open", 0), ("done", 1)]:
        code, lines, stderr = run_quickstart(fresh_python, embedded_server, tmp_path)
        assert code == 0, f"quickstart exited {code}:\n" + "\n".join(lines) + stderr
        assert stderr == ""
        expected = expected_quickstart(before, version)
        assert len(lines) == len(expected), lines
        for line, pattern in zip(lines, expected):
            assert re.fullmatch(pattern, line), f"{line!r} does not match {pattern!r}"
        sessions.append(re.fullmatch(expected[0], lines[0]).group(1))
    assert sessions[0] != sessions[1], "every run is a new session"


def test_an_unknown_actor_is_named_in_the_denial(pb, embedded_server):
    pb2, pb2_grpc = pb
    with grpc.insecure_channel(embedded_server.address) as channel:
        pdp = pb2_grpc.PolicyDecisionPointStub(channel)

        def decide(actor, tool, arguments):
            return pdp.Decide(pb2.DecideRequest(
                session=pb2.Session(actor=actor, session_id=f"s-{actor}", workspace="desk"),
                proposal=pb2.Proposal(call_id="c1", actor=actor, name=tool, version=0,
                                      arguments_json=arguments)), timeout=10)

        unknown = decide("learner", "set_ticket", '{"ticket":"lamp","status":"done"}')
        assert (unknown.outcome, unknown.reason, unknown.message) == (
            pb2.OUTCOME_DENY, "not-authorized", 'actor "learner" is not defined in the policy')
        dispatched = pdp.Dispatch(pb2.DispatchRequest(
            session=pb2.Session(actor="learner", session_id="s-learner", workspace="desk"),
            proposal=pb2.Proposal(call_id="c1", actor="learner", name="set_ticket", version=0,
                                  arguments_json='{"ticket":"lamp","status":"done"}')), timeout=10)
        assert (dispatched.status, dispatched.reason, dispatched.message) == (
            pb2.DISPATCH_STATUS_DENIED, "not-authorized",
            'actor "learner" is not defined in the policy')
        # A known actor without the tool's role keeps the role message.
        roleless = decide("support-agent", "payment_execute",
                          '{"amount":5,"currency":"EUR","account_number":"12345678"}')
        assert (roleless.outcome, roleless.reason, roleless.message) == (
            pb2.OUTCOME_DENY, "not-authorized",
            'actor "support-agent" holds no role that may call "payment_execute"')


@pytest.fixture
def client_module():
    """toolgate_client from its source in the repository (the installed copy
    is what the fresh-venv tests use)."""
    source = str(PACKAGE / "src")
    sys.path.insert(0, source)
    try:
        import toolgate_client
        yield toolgate_client
    finally:
        sys.path.remove(source)


def test_host_wrapper_reports_timeouts_denials_and_stale_versions(client_module, embedded_server):
    tc = client_module
    with tc.Host(embedded_server.address, actor="support-agent", workspace="desk") as host:
        lamp = host.resource("lamp")
        assert (lamp.name, lamp.value, lamp.version) == ("lamp", "open", 0)
        proposal = host.propose("set_ticket", {"ticket": "lamp", "status": "done"},
                                version=lamp.version)
        assert proposal.call_id == f"{host.session_id}-1"
        assert proposal.arguments == {"ticket": "lamp", "status": "done"}

        # Nobody decides: the wait ends with the pending answer it waited on.
        waited = []
        with pytest.raises(tc.VerdictTimeout) as raised:
            host.wait_for_verdict(proposal, timeout=0.3, poll_interval=0.1,
                                  on_waiting=waited.append)
        pending = raised.value.decision
        assert (pending.outcome, pending.reason) == (tc.Outcome.REQUIRE_APPROVAL,
                                                     "approval-required")
        assert pending.approval_expires_at is not None
        assert [decision.approval_id for decision in waited] == [pending.approval_id]
        assert str(raised.value) == f"no reviewer decided approval {pending.approval_id} within 0.3 s"

        # A reviewer denies: the verdict is the DENY, and Dispatch commits nothing.
        approvals = tc.toolgate_pb2_grpc.ApprovalsStub(host.channel)
        approvals.DenyApproval(
            tc.toolgate_pb2.DenyApprovalRequest(approval_id=pending.approval_id, reason="no"),
            metadata=[("authorization", f"Bearer {embedded_server.token}")], timeout=10)
        verdict = host.wait_for_verdict(proposal, timeout=10)
        assert (verdict.outcome, verdict.reason, verdict.approval_id) == (
            tc.Outcome.DENY, "approval-denied", pending.approval_id)
        assert not verdict.allowed
        refused = host.dispatch(proposal)
        assert (refused.status, refused.reason, refused.committed, refused.value) == (
            tc.DispatchStatus.APPROVAL_REQUIRED, "approval-denied", False, None)

        # A proposal made against another version is stale: the receipt says the current one.
        stale = host.dispatch(host.propose("set_ticket", {"ticket": "lamp", "status": "done"},
                                           version=7))
        assert (stale.status, stale.committed, stale.version) == (
            tc.DispatchStatus.STALE_VERSION, False, 0)
        assert host.resource("lamp").value == "open", "nothing was committed"


def test_host_wrapper_keeps_tokens_local_and_retries_what_may_not_have_arrived(client_module):
    tc = client_module
    # A token goes over plaintext only to this machine, unless told otherwise.
    with pytest.raises(ValueError, match="only to loopback, not to 10.0.0.7:50051"):
        tc.Host("10.0.0.7:50051", actor="a", workspace="w", token="t")
    tc.Host("10.0.0.7:50051", actor="a", workspace="w", token="t", insecure_plaintext=True).close()
    for target in ("localhost:1", "127.0.0.1:1", "[::1]:1", "http://127.0.0.2:1"):
        tc.Host(target, actor="a", workspace="w", token="t").close()

    # Nothing listens: a Dispatch whose answer never came is sent again, the
    # same request each time, then the error raised; the wait for a verdict
    # asks again until its timeout.
    calls = []

    class Count(grpc.UnaryUnaryClientInterceptor):
        def intercept_unary_unary(self, continuation, details, request):
            calls.append((details.method, request.SerializeToString()))
            return continuation(details, request)

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    channel = grpc.intercept_channel(grpc.insecure_channel(f"127.0.0.1:{closed_port}"), Count())
    host = tc.Host("unused", actor="support-agent", workspace="desk", channel=channel,
                   rpc_timeout=1)
    proposal = host.propose("set_ticket", {"ticket": "lamp", "status": "done"}, version=0)
    with pytest.raises(grpc.RpcError) as raised:
        host.dispatch(proposal, retries=2)
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
    assert [method for method, _ in calls] == ["/toolgate.v1.PolicyDecisionPoint/Dispatch"] * 3
    assert len({request for _, request in calls}) == 1, "one proposal, sent again"
    calls.clear()
    with pytest.raises(grpc.RpcError) as raised:
        host.wait_for_verdict(proposal, timeout=0.5, poll_interval=0.1)
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
    assert len(calls) >= 2, calls
    with pytest.raises(ValueError, match="timeout"):
        host.wait_for_verdict(proposal, timeout=float("nan"))
    with pytest.raises(ValueError, match="poll_interval"):
        host.wait_for_verdict(proposal, timeout=1, poll_interval=0)
    channel.close()


@contextlib.contextmanager
def fake_host(tc, servicer, rpc_timeout):
    """A `Host` (actor support-agent, workspace desk) and a proposal of
    set_ticket, talking to `servicer` served in this process."""
    from concurrent import futures

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    tc.toolgate_pb2_grpc.add_PolicyDecisionPointServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with tc.Host(f"127.0.0.1:{port}", actor="support-agent", workspace="desk",
                     rpc_timeout=rpc_timeout) as host:
            yield host, host.propose("set_ticket", {"ticket": "lamp", "status": "done"},
                                     version=0)
    finally:
        server.stop(None)


def test_a_dispatch_without_room_for_its_answer_is_sent_again(client_module):
    """The server answers RESOURCE_EXHAUSTED also after a commit whose
    answer found no room to be sent: the same request again is answered
    from the receipt, so the wrapper sends it again rather than leave the
    host to propose anew (a second commit)."""
    tc = client_module
    seen = []

    class Pdp(tc.toolgate_pb2_grpc.PolicyDecisionPointServicer):
        def Dispatch(self, request, context):
            seen.append(request.SerializeToString())
            if len(seen) == 1:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              "response buffer is full; retry with backoff")
            return tc.toolgate_pb2.DispatchResponse(
                status=tc.toolgate_pb2.DISPATCH_STATUS_OK, reason="replayed",
                replayed=True, receipt_id="r-1", version=1)

    with fake_host(tc, Pdp(), rpc_timeout=10) as (host, proposal):
        receipt = host.dispatch(proposal, retries=2)
    assert (receipt.status, receipt.replayed, receipt.receipt_id) == (
        tc.DispatchStatus.OK, True, "r-1")
    assert len(seen) == 2 and seen[0] == seen[1], "the same request, sent again"
    # The messages name the package's module, so they pickle (a raw answer
    # handed to multiprocessing or a cache). In a process of its own: this
    # one has loaded the test's own stubs of the same proto, whose classes
    # the descriptor pool hands out first.
    script = ("import pickle\n"
              "from toolgate_client import toolgate_pb2\n"
              "answer = toolgate_pb2.DispatchResponse(receipt_id='r-1')\n"
              "assert type(answer).__module__ == 'toolgate_client.toolgate_pb2'\n"
              "assert pickle.loads(pickle.dumps(answer)) == answer\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(PACKAGE / "src")}, timeout=60)
    assert done.returncode == 0, done.stderr


def test_no_decide_of_a_wait_outlasts_its_timeout(client_module):
    """A server that holds every Decide: the wait ends at its timeout with
    the call's error, not after the host's (longer) rpc_timeout."""
    import time

    tc = client_module
    release = threading.Event()

    answered = []

    class Slow(tc.toolgate_pb2_grpc.PolicyDecisionPointServicer):
        def Decide(self, request, context):
            if answered_once and not answered:
                answered.append(request)
                return tc.toolgate_pb2.DecideResponse(
                    outcome=tc.toolgate_pb2.OUTCOME_REQUIRE_APPROVAL,
                    reason="approval-required", approval_id="a-1")
            release.wait(30)
            context.abort(grpc.StatusCode.UNAVAILABLE, "held")

    answered_once = False

    with fake_host(tc, Slow(), rpc_timeout=30) as (host, proposal):
        try:
            started = time.monotonic()
            with pytest.raises(grpc.RpcError) as raised:
                host.wait_for_verdict(proposal, timeout=0.5)
            assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert time.monotonic() - started < 10, "bounded by the wait, not rpc_timeout"
            # Once an answer said pending, a Decide cut short by the wait's
            # end is the wait running out, not the server gone.
            answered_once = True
            with pytest.raises(tc.VerdictTimeout) as timed_out:
                host.wait_for_verdict(proposal, timeout=0.5, poll_interval=0.1)
            assert timed_out.value.decision.approval_id == "a-1"
        finally:
            release.set()


def test_an_appends_receipt_says_where_the_item_landed(client_module, embedded_server):
    tc = client_module
    with tc.Host(embedded_server.address, actor="support-agent", workspace="desk") as host:
        outbox = host.resource("outbox")
        assert host.version("outbox") == outbox.version
        proposal = host.propose("send_reply", {"recipient": "customer-1", "text": "hi"},
                                version=outbox.version)
        pending = host.decide(proposal)
        assert pending.pending, pending
        approvals = tc.toolgate_pb2_grpc.ApprovalsStub(host.channel)
        approvals.GrantApproval(
            tc.toolgate_pb2.GrantApprovalRequest(approval_id=pending.approval_id, comment="ok"),
            metadata=[("authorization", f"Bearer {embedded_server.token}")], timeout=10)
        receipt = host.dispatch(proposal)
        assert receipt.committed, receipt
        assert receipt.appended_index == len(outbox.value)
        assert receipt.value == {"recipient": "customer-1", "text": "hi"}
