"""Decide, the approval ledger and authentication from Python (grpcio), against
a real `toolgate serve` process on tests/fixtures/decide.toml."""

import json
import os
import signal
import subprocess
import time

import grpc
import pytest

from conftest import REPO, Server, events_by_name

POLICY = REPO / "tests" / "fixtures" / "decide.toml"
HOST = [("authorization", "Bearer host-secret")]
ALICE = [("authorization", "Bearer alice-secret")]
BOB = [("authorization", "Bearer bob-secret")]
CAROL = [("authorization", "Bearer carol-secret")]


@pytest.fixture
def toolgate(pb, start_server):
    pb2, pb2_grpc = pb
    server = start_server(POLICY.read_text().replace(
        'manifest = "../../examples/manifests/docs-search.json"',
        f'manifest = "{REPO / "examples" / "manifests" / "docs-search.json"}"'))
    channel = grpc.insecure_channel(server.address)
    yield pb2, pb2_grpc.PolicyDecisionPointStub(channel), pb2_grpc.ApprovalsStub(channel), server
    channel.close()


def decide(pb2, pdp, actor, session_id, call_id, name, arguments, workspace="acme", claimed=None):
    return pdp.Decide(pb2.DecideRequest(
        session=pb2.Session(actor=actor, session_id=session_id, workspace=workspace),
        proposal=pb2.Proposal(call_id=call_id, actor=claimed or actor, name=name, version=0,
                              arguments_json=json.dumps(arguments))), metadata=HOST)


def payment(amount):
    return {"amount": amount, "account_number": "12345678"}


def code_of(call):
    try:
        call()
    except grpc.RpcError as error:
        return error.code()
    return grpc.StatusCode.OK


def test_threshold_flow(toolgate):
    pb2, pdp, approvals, _ = toolgate
    small = decide(pb2, pdp, "payer", "s1", "c1", "payment_execute", payment(5000))
    assert (small.outcome, small.reason) == (pb2.OUTCOME_ALLOW, "allowed")

    large = decide(pb2, pdp, "payer", "s1", "c2", "payment_execute", payment(15000))
    assert (large.outcome, large.reason) == (pb2.OUTCOME_REQUIRE_APPROVAL, "approval-threshold-exceeded")
    again = decide(pb2, pdp, "payer", "s1", "c2", "payment_execute", payment(15000))
    assert again.approval_id == large.approval_id

    approval = approvals.GetApproval(pb2.GetApprovalRequest(approval_id=large.approval_id), metadata=ALICE)
    assert approval.fingerprint == large.fingerprint
    assert json.loads(approval.arguments_json) == {"account_number": "[redacted]", "amount": 15000}

    def grant(metadata):
        return approvals.GrantApproval(pb2.GrantApprovalRequest(approval_id=large.approval_id), metadata=metadata)

    assert code_of(lambda: grant(BOB)) == grpc.StatusCode.PERMISSION_DENIED
    assert grant(ALICE).status == pb2.APPROVAL_STATUS_GRANTED
    approved = decide(pb2, pdp, "payer", "s1", "c2", "payment_execute", payment(15000))
    assert (approved.outcome, approved.reason) == (pb2.OUTCOME_ALLOW, "approved")

    changed = decide(pb2, pdp, "payer", "s1", "c3", "payment_execute", payment(15001))
    assert changed.outcome == pb2.OUTCOME_REQUIRE_APPROVAL and changed.approval_id != large.approval_id
    approvals.DenyApproval(pb2.DenyApprovalRequest(approval_id=changed.approval_id, reason="no"), metadata=ALICE)
    denied = decide(pb2, pdp, "payer", "s1", "c3", "payment_execute", payment(15001))
    assert (denied.outcome, denied.reason) == (pb2.OUTCOME_DENY, "approval-denied")

    carol = decide(pb2, pdp, "carol", "s-carol", "c1", "payment_execute", payment(20000))
    code = code_of(lambda: approvals.GrantApproval(
        pb2.GrantApprovalRequest(approval_id=carol.approval_id), metadata=CAROL))
    assert code == grpc.StatusCode.PERMISSION_DENIED


def test_budgets_and_modes(toolgate):
    pb2, pdp, approvals, _ = toolgate
    assert decide(pb2, pdp, "tight", "t1", "c1", "payment_execute", payment(10)).reason == "allowed"
    assert decide(pb2, pdp, "tight", "t1", "c1", "payment_execute", payment(10)).reason == "allowed"
    assert decide(pb2, pdp, "tight", "t1", "c2", "payment_execute", payment(10)).reason == "tool-budget"
    assert decide(pb2, pdp, "tight", "t1", "c1", "payment_execute", payment(11)).reason == "call-id-conflict"
    info = pdp.GetSession(pb2.GetSessionRequest(session_id="t1"), metadata=HOST)
    # The tool-budget refusal still cost a decision (SPEC §4 "Charging").
    assert (info.decisions, info.tool_attempts, info.work_units, info.stopped_reason) == (2, 1, 2, "tool-budget")

    reasons = {
        ("read_balance", "payer"): "allowed",
        ("draft_invoice", "payer"): "allowed",
        ("change_role", "payer"): "forbidden-tool",
        ("no_such_tool", "payer"): "unknown-tool",
        ("read_balance", "mallory"): "forbidden",
        ("search_docs", "payer"): "manifest-unverified",
    }
    for index, ((name, claimed), reason) in enumerate(reasons.items()):
        answer = decide(pb2, pdp, "payer", "s2", f"m{index}", name, {}, claimed=claimed)
        assert answer.reason == reason, name

    with pytest.raises(grpc.RpcError) as raised:
        decide(pb2, pdp, "payer", "s2", "x1", "payment_execute", {**payment(50000), "approved": True})
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert raised.value.details().startswith("proposal.arguments:")
    listed = approvals.ListApprovals(pb2.ListApprovalsRequest(), metadata=ALICE)
    assert list(listed.approvals) == []


def test_authentication(toolgate):
    pb2, pdp, approvals, _ = toolgate
    request = pb2.DecideRequest(
        session=pb2.Session(actor="payer", session_id="s1", workspace="acme"),
        proposal=pb2.Proposal(call_id="c1", actor="payer", name="read_balance", arguments_json="{}"))
    assert code_of(lambda: pdp.Decide(request)) == grpc.StatusCode.UNAUTHENTICATED
    assert code_of(lambda: pdp.Decide(request, metadata=[("authorization", "Bearer nope")])) \
        == grpc.StatusCode.UNAUTHENTICATED
    assert code_of(lambda: pdp.Decide(request, metadata=ALICE)) == grpc.StatusCode.PERMISSION_DENIED
    other_host = [("authorization", "Bearer other-host-secret")]
    assert code_of(lambda: pdp.Decide(request, metadata=other_host)) == grpc.StatusCode.PERMISSION_DENIED
    assert code_of(lambda: approvals.ListApprovals(pb2.ListApprovalsRequest(), metadata=HOST)) \
        == grpc.StatusCode.PERMISSION_DENIED
    assert code_of(lambda: approvals.ListApprovals(pb2.ListApprovalsRequest())) \
        == grpc.StatusCode.UNAUTHENTICATED


def test_audit_events_are_json_lines(pb, tmp_path):
    """--log-format json: one JSON object per line, with stable event names."""
    pb2, pb2_grpc = pb
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY.read_text().replace(
        'manifest = "../../examples/manifests/docs-search.json"',
        f'manifest = "{REPO / "examples" / "manifests" / "docs-search.json"}"'))
    server = Server(policy, ["--log-format", "json"])
    with grpc.insecure_channel(server.address) as channel:
        pdp = pb2_grpc.PolicyDecisionPointStub(channel)
        answer = decide(pb2, pdp, "payer", "s1", "c1", "payment_execute", payment(15000))
        approvals = pb2_grpc.ApprovalsStub(channel)
        approvals.GrantApproval(pb2.GrantApprovalRequest(approval_id=answer.approval_id), metadata=ALICE)
    stderr = server.stop()
    by_name = events_by_name(stderr)
    decision = by_name["decision"][0]
    assert decision["reason"] == "approval-threshold-exceeded"
    assert decision["fingerprint"] == answer.fingerprint
    assert by_name["tool_call_require_approval"][0]["approval_id"] == answer.approval_id
    assert by_name["approval_granted"][0]["reviewer"] == "alice"
    # Secrets never reach the log: not the tokens, not the sensitive argument.
    assert "12345678" not in stderr and "alice-secret" not in stderr and "host-secret" not in stderr


def test_sighup_reloads_and_a_bad_file_keeps_the_old_policy(pb, tmp_path):
    pb2, pb2_grpc = pb
    policy = tmp_path / "policy.toml"
    text = POLICY.read_text().replace(
        'manifest = "../../examples/manifests/docs-search.json"',
        f'manifest = "{REPO / "examples" / "manifests" / "docs-search.json"}"')
    policy.write_text(text)
    server = Server(policy, [])

    def revision_and_reason():
        with grpc.insecure_channel(server.address) as channel:
            answer = decide(pb2, pb2_grpc.PolicyDecisionPointStub(channel), "payer", "s1", "c1", "draft_invoice", {})
            return answer.policy_revision, answer.reason

    def wait_for_revision_change(old):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            revision, reason = revision_and_reason()
            if revision != old:
                return revision, reason
            time.sleep(0.05)
        raise AssertionError("policy was not reloaded")

    first_revision, reason = revision_and_reason()
    assert reason == "allowed"
    policy.write_text(text.replace('[tools.draft_invoice]\nmode = "propose"', '[tools.draft_invoice]\nmode = "forbidden"'))
    os.kill(server.process.pid, signal.SIGHUP)
    second_revision, reason = wait_for_revision_change(first_revision)
    assert reason == "forbidden-tool"

    policy.write_text(text + "\n[tools.broken]\nmode = \"sideways\"\n")
    os.kill(server.process.pid, signal.SIGHUP)
    # A bad file is logged and the policy in force stays.
    deadline = time.monotonic() + 10
    stderr_lines = []
    while time.monotonic() < deadline:
        line = server.stderr_line(timeout=1)
        stderr_lines.append(line)
        if "policy_reload_failed" in line:
            break
    assert any("policy_reload_failed" in line for line in stderr_lines)
    assert revision_and_reason() == (second_revision, "forbidden-tool")
    server.stop()


def test_embedded_policy_prints_a_reviewer_token_once(pb):
    pb2, pb2_grpc = pb
    server = Server(None, [])
    # Log lines (the store, the recovery) may come first.
    token_line = ""
    for _ in range(10):
        token_line = server.stderr_line()
        if "reviewer token" in token_line:
            break
    assert "reviewer token" in token_line
    token = token_line.rsplit(" ", 1)[1].strip()
    with grpc.insecure_channel(server.address) as channel:
        approvals = pb2_grpc.ApprovalsStub(channel)
        listed = approvals.ListApprovals(pb2.ListApprovalsRequest(),
                                         metadata=[("authorization", f"Bearer {token}")])
        assert list(listed.approvals) == []
        assert code_of(lambda: approvals.ListApprovals(pb2.ListApprovalsRequest())) \
            == grpc.StatusCode.UNAUTHENTICATED
    stderr = server.stop()
    assert stderr.count(token) == 1, "the token is printed once, never logged"


def test_refuses_non_loopback_without_credentials():
    from conftest import toolgate_bin
    result = subprocess.run([toolgate_bin(), "serve", "--listen", "0.0.0.0:0"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode != 0
    assert "non-loopback" in result.stderr
