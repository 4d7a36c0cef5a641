"""Dispatch from Python (grpcio), against a real `toolgate serve` process on
examples/tickets.toml (SPEC §6): the two-ticket exercise, approvals bound to
what the reviewer saw, and the audit events a dispatch leaves behind. The
first two run twice: on one server, and on a pair of replicas sharing one
PostgreSQL schema, every call going to the other replica than the last."""

import json
import os
import secrets
import time

import grpc
import pytest

from conftest import REPO, Server, events_by_name

TICKETS = REPO / "examples" / "tickets.toml"
# The host API of tickets.toml is open; the reviewer API takes the example token.
REVIEWER = [("authorization", "Bearer example-reviewer-token")]
TEXT = "Your lamp is fixed."


class Alternating:
    """The same stub on each of several servers: every call goes to the next."""

    def __init__(self, stubs):
        self._stubs = stubs
        self._next = 0

    def __getattr__(self, name):
        stub = self._stubs[self._next % len(self._stubs)]
        self._next += 1
        return getattr(stub, name)


class Tickets:
    """Stubs on channels to one server (or several replicas, alternating),
    plus the few calls every test makes."""

    def __init__(self, pb, *addresses):
        self.pb2, pb2_grpc = pb
        self.channels = [grpc.insecure_channel(address) for address in addresses]
        self.pdp = Alternating([pb2_grpc.PolicyDecisionPointStub(c) for c in self.channels])
        self.approvals = Alternating([pb2_grpc.ApprovalsStub(c) for c in self.channels])
        self.resources = Alternating([pb2_grpc.ResourcesStub(c) for c in self.channels])

    def close(self):
        for channel in self.channels:
            channel.close()

    def session(self, actor, session_id):
        return self.pb2.Session(actor=actor, session_id=session_id, workspace="desk")

    def proposal(self, call_id, name, version, arguments, actor="learner"):
        return self.pb2.Proposal(call_id=call_id, actor=actor, name=name, version=version,
                                 arguments_json=json.dumps(arguments))

    def set_ticket(self, call_id, version, ticket, status):
        return self.proposal(call_id, "set_ticket", version, {"ticket": ticket, "status": status})

    def reply(self, call_id, version, recipient):
        return self.proposal(call_id, "send_reply", version, {"recipient": recipient, "text": TEXT})

    def decide(self, session, proposal):
        return self.pdp.Decide(self.pb2.DecideRequest(session=session, proposal=proposal))

    def dispatch(self, session, proposal):
        return self.pdp.Dispatch(self.pb2.DispatchRequest(session=session, proposal=proposal))

    def approve(self, session, proposal):
        """Decide (must ask for approval), then grant as the reviewer; returns the approval id."""
        decision = self.decide(session, proposal)
        assert (decision.outcome, decision.reason) == (
            self.pb2.OUTCOME_REQUIRE_APPROVAL, "approval-required"), decision
        granted = self.approvals.GrantApproval(
            self.pb2.GrantApprovalRequest(approval_id=decision.approval_id), metadata=REVIEWER)
        assert granted.status == self.pb2.APPROVAL_STATUS_GRANTED
        assert granted.decided_by == "reviewer"
        assert granted.fingerprint == decision.fingerprint
        return decision.approval_id

    def resource(self, name):
        found = self.resources.GetResource(self.pb2.GetResourceRequest(name=name), metadata=REVIEWER)
        return found.value_json, found.version

    def approval_status(self, approval_id):
        return self.approvals.GetApproval(
            self.pb2.GetApprovalRequest(approval_id=approval_id), metadata=REVIEWER).status

    def outbox(self):
        value_json, _ = self.resource("outbox")
        return json.loads(value_json)

    def snapshot(self):
        """Everything a refusal must leave alone that the API lets us see."""
        resources = {name: self.resource(name) for name in ("lamp", "sensor", "outbox")}
        listed = self.approvals.ListApprovals(self.pb2.ListApprovalsRequest(page_size=500),
                                              metadata=REVIEWER)
        assert listed.next_page_token == ""
        approvals = sorted((approval.approval_id, approval.status) for approval in listed.approvals)
        info = self.pdp.GetSession(self.pb2.GetSessionRequest(session_id="s1"))
        session = (info.decisions, info.tool_attempts, info.executed_tools, info.work_units)
        return resources, approvals, session


def postgres_schema_url():
    """A fresh schema of the test database (TOOLGATE_TEST_DATABASE_URL, which
    `.ci/run` sets); without it the replica runs fail saying so."""
    base = os.environ.get("TOOLGATE_TEST_DATABASE_URL")
    if not base:
        pytest.fail("TOOLGATE_TEST_DATABASE_URL is not set: run `source .ci/postgres start`")
    separator = "&" if "?" in base else "?"
    return f"{base}{separator}schema=py_{secrets.token_hex(8)}"


@pytest.fixture(params=["one-server", "postgres-replicas"])
def tickets(request, pb, start_server):
    text = TICKETS.read_text()
    if request.param == "one-server":
        servers = [start_server(text)]
    else:
        store = ["--store", postgres_schema_url(), "--migrate"]
        servers = [start_server(text, store), start_server(text, store)]
    client = Tickets(pb, *(server.address for server in servers))
    yield client
    client.close()


def test_the_two_ticket_exercise(tickets):
    t = tickets
    pb2 = t.pb2
    learner = t.session("learner", "s1")
    assert {name: t.resource(name) for name in ("lamp", "sensor", "outbox")} == {"lamp": ('"open"', 0), "sensor": ('"open"', 0), "outbox": ("[]", 0)}

    c1 = t.set_ticket("c1", 0, "lamp", "done")
    approval_id = t.approve(learner, c1)
    committed = t.dispatch(learner, c1)
    assert (committed.status, committed.reason) == (pb2.DISPATCH_STATUS_OK, "committed"), committed
    assert committed.replayed is False
    assert (committed.version, committed.resource, committed.value_json) == (1, "lamp", '"done"')
    assert committed.approval_id == approval_id
    assert committed.receipt_id != ""
    assert t.resource("lamp") == ('"done"', 1)
    assert t.resource("sensor") == ('"open"', 1), "global scope: one version for all"
    assert t.resource("outbox") == ("[]", 1)
    assert t.approval_status(approval_id) == pb2.APPROVAL_STATUS_CONSUMED

    # Replay: the stored result again, replayed, nothing changes, no approval needed.
    before = t.snapshot()
    replayed = t.dispatch(learner, c1)
    assert (replayed.status, replayed.reason) == (pb2.DISPATCH_STATUS_OK, "replayed")
    assert replayed.replayed is True
    assert (replayed.version, replayed.receipt_id, replayed.resource, replayed.value_json) == (
        1, committed.receipt_id, "lamp", '"done"')
    assert replayed.fingerprint == committed.fingerprint
    assert t.snapshot() == before
    # The returned message is the caller's copy: changing it changes nothing stored.
    replayed.value_json = '"tampered"'
    replayed.version = 99
    replayed.receipt_id = "tampered"
    again = t.dispatch(learner, c1)
    assert (again.status, again.replayed, again.version, again.receipt_id, again.value_json) == (
        pb2.DISPATCH_STATUS_OK, True, 1, committed.receipt_id, '"done"')
    assert t.resource("lamp") == ('"done"', 1)
    assert t.snapshot() == before

    # Each refusal changes nothing but its session's charge: a call id new to
    # session s1 costs it a decision and a tool attempt (SPEC §4 "Charging").
    other = t.session("other", "s2")
    refusals = [
        ("actor other", other, c1, pb2.DISPATCH_STATUS_FORBIDDEN, "forbidden", False),
        ("same call id, other arguments", learner, t.set_ticket("c1", 0, "lamp", "open"),
         pb2.DISPATCH_STATUS_CALL_ID_CONFLICT, "call-id-conflict", False),
        ("new call id at version 0", learner, t.set_ticket("c2", 0, "sensor", "done"),
         pb2.DISPATCH_STATUS_STALE_VERSION, "stale-version", True),
        ("unknown tool", learner, t.proposal("c3", "delete_ticket", 1, {"ticket": "lamp"}),
         pb2.DISPATCH_STATUS_UNKNOWN_TOOL, "unknown-tool", True),
    ]
    for label, session, proposal, status, reason, charged in refusals:
        before = t.snapshot()
        answer = t.dispatch(session, proposal)
        assert (answer.status, answer.reason) == (status, reason), label
        assert answer.replayed is False, label
        assert (answer.receipt_id, answer.resource, answer.value_json, answer.approval_id) == (
            "", "", "", ""), label
        if status == pb2.DISPATCH_STATUS_STALE_VERSION:
            assert answer.version == 1, "STALE_VERSION reports the current version"
        else:
            assert answer.version == 0, label
        if charged:
            resources, approvals, (decisions, attempts, executed, work) = before
            before = resources, approvals, (decisions + 1, attempts + 1, executed, work + 1)
        assert t.snapshot() == before, f"{label} changed state"
    assert t.resource("lamp") == ('"done"', 1)
    assert t.resource("sensor") == ('"open"', 1)
    assert t.resource("outbox") == ("[]", 1)

    # Unapproved at the current version: the only thing it may do is open a
    # pending request (and, being a new call id, charge its session).
    before = t.snapshot()
    c4 = t.set_ticket("c4", 1, "sensor", "done")
    answer = t.dispatch(learner, c4)
    assert (answer.status, answer.reason) == (pb2.DISPATCH_STATUS_APPROVAL_REQUIRED, "approval-required")
    assert answer.receipt_id == "" and answer.approval_id != ""
    after = t.snapshot()
    decisions, attempts, executed, work = before[2]
    assert after[0] == before[0] and after[2] == (decisions + 1, attempts + 1, executed, work + 1)
    assert after[1] == sorted(before[1] + [(answer.approval_id, pb2.APPROVAL_STATUS_PENDING)])

    # A ticket that fits the pattern but does not exist: refused, grant kept.
    ghost = t.set_ticket("c5", 1, "ghost", "done")
    ghost_approval = t.approve(learner, ghost)
    before = t.snapshot()
    answer = t.dispatch(learner, ghost)
    assert (answer.status, answer.reason) == (pb2.DISPATCH_STATUS_MISSING_RESOURCE, "missing-resource")
    assert (answer.replayed, answer.receipt_id) == (False, "")
    assert t.snapshot() == before, "MISSING_RESOURCE consumed nothing"
    assert t.approval_status(ghost_approval) == pb2.APPROVAL_STATUS_GRANTED
    assert t.resource("lamp") == ('"done"', 1)
    assert t.resource("sensor") == ('"open"', 1)
    assert t.resource("outbox") == ("[]", 1)
    info = t.pdp.GetSession(pb2.GetSessionRequest(session_id="s1"))
    assert info.executed_tools == 1


def test_approval_is_bound_to_what_the_reviewer_saw(tickets):
    t = tickets
    pb2 = t.pb2
    learner = t.session("learner", "s1")

    # (A) The model claims approval: data, not permission (the schema refuses extra keys).
    claimed = t.proposal("a1", "send_reply", 0,
                         {"recipient": "customer-42", "text": "hi", "approved": True})
    with pytest.raises(grpc.RpcError) as raised:
        t.dispatch(learner, claimed)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert raised.value.details().startswith("proposal.arguments:"), raised.value.details()
    unapproved = t.dispatch(learner, t.reply("a2", 0, "customer-42"))
    assert (unapproved.status, unapproved.reason) == (
        pb2.DISPATCH_STATUS_APPROVAL_REQUIRED, "approval-required")
    assert unapproved.approval_id != "" and unapproved.receipt_id == ""
    assert t.approval_status(unapproved.approval_id) == pb2.APPROVAL_STATUS_PENDING
    assert t.resource("outbox") == ("[]", 0)

    # (B) Granted for customer-42, sent to customer-99 under the same call id: refused.
    granted = t.approve(learner, t.reply("b1", 0, "customer-42"))
    # The session decided b1 for the other proposal: a conflict (SPEC §4 step 6).
    swapped = t.dispatch(learner, t.reply("b1", 0, "customer-99"))
    assert (swapped.status, swapped.reason) == (
        pb2.DISPATCH_STATUS_CALL_ID_CONFLICT, "call-id-conflict")
    assert swapped.receipt_id == ""
    # Under a new call id it needs an approval of its own.
    swapped = t.dispatch(learner, t.reply("b2", 0, "customer-99"))
    assert (swapped.status, swapped.reason) == (
        pb2.DISPATCH_STATUS_APPROVAL_REQUIRED, "approval-required")
    assert swapped.approval_id not in ("", granted)
    assert swapped.receipt_id == ""
    assert t.approval_status(granted) == pb2.APPROVAL_STATUS_GRANTED, "the grant is not consumed"
    assert t.resource("outbox") == ("[]", 0)

    # (D) The granted proposal dispatched twice: one entry, the second call replays.
    fresh = t.reply("d1", 0, "customer-42")
    fresh_approval = t.approve(learner, fresh)
    first = t.dispatch(learner, fresh)
    assert (first.status, first.replayed, first.version, first.resource) == (
        pb2.DISPATCH_STATUS_OK, False, 1, "outbox")
    assert first.approval_id == fresh_approval and first.receipt_id != ""
    entry = {"recipient": "customer-42", "text": TEXT}
    assert json.loads(first.value_json) == entry, "the item appended, not the queue"
    assert first.HasField("appended_index") and first.appended_index == 0
    second = t.dispatch(learner, fresh)
    assert (second.status, second.replayed, second.version, second.receipt_id) == (
        pb2.DISPATCH_STATUS_OK, True, 1, first.receipt_id)
    assert json.loads(second.value_json) == entry
    assert second.HasField("appended_index") and second.appended_index == 0
    assert t.outbox() == [entry]
    assert t.resource("outbox")[1] == 1
    assert t.approval_status(fresh_approval) == pb2.APPROVAL_STATUS_CONSUMED

    # (C) The state moved on: an approved proposal made against version 0 is stale.
    behind = t.reply("e1", 0, "customer-44")
    behind_approval = t.approve(learner, behind)
    stale = t.dispatch(learner, behind)
    assert (stale.status, stale.reason, stale.version, stale.receipt_id) == (
        pb2.DISPATCH_STATUS_STALE_VERSION, "stale-version", 1, "")
    assert t.outbox() == [entry], "zero new entries"
    assert t.resource("outbox")[1] == 1
    assert t.approval_status(behind_approval) == pb2.APPROVAL_STATUS_GRANTED
    # The earlier grant bound to customer-42 (b1) is still unused, and b1 still
    # cannot be committed at a stale version.
    assert t.dispatch(learner, t.reply("b1", 0, "customer-42")).status == pb2.DISPATCH_STATUS_STALE_VERSION
    assert t.outbox() == [entry]


def test_an_expired_grant_is_no_permission(pb, start_server):
    text = TICKETS.read_text()
    assert "grant_ttl_seconds = 600" in text
    server = start_server(text.replace("grant_ttl_seconds = 600", "grant_ttl_seconds = 1"))
    t = Tickets(pb, server.address)
    pb2 = t.pb2
    learner = t.session("learner", "s1")
    late = t.reply("c1", 0, "customer-43")
    approval_id = t.approve(learner, late)
    time.sleep(1.5)  # waiting for the 1 s grant TTL to pass, not for readiness
    answer = t.dispatch(learner, late)
    assert (answer.status, answer.reason) == (pb2.DISPATCH_STATUS_APPROVAL_REQUIRED, "approval-required")
    assert answer.receipt_id == "" and answer.replayed is False
    assert answer.approval_id not in ("", approval_id), "a fresh request, not the expired grant"
    assert t.approval_status(approval_id) == pb2.APPROVAL_STATUS_EXPIRED
    assert t.approval_status(answer.approval_id) == pb2.APPROVAL_STATUS_PENDING
    assert t.resource("outbox") == ("[]", 0)
    assert t.resource("lamp") == ('"open"', 0)
    t.close()


def test_dispatch_audit_events_are_json_lines(pb):
    server = Server(TICKETS, ["--log-format", "json"])
    try:
        t = Tickets(pb, server.address)
        pb2 = t.pb2
        learner = t.session("learner", "s1")
        c1 = t.set_ticket("c1", 0, "lamp", "done")
        approval_id = t.approve(learner, c1)
        committed = t.dispatch(learner, c1)
        assert committed.status == pb2.DISPATCH_STATUS_OK
        replayed = t.dispatch(learner, c1)
        assert replayed.replayed is True
        refused = {
            "c2": t.dispatch(learner, t.set_ticket("c2", 0, "sensor", "done")),
            "c4": t.dispatch(learner, t.set_ticket("c4", 1, "sensor", "done")),
        }
        forbidden = t.dispatch(t.session("other", "s2"), c1)
        assert refused["c2"].status == pb2.DISPATCH_STATUS_STALE_VERSION
        assert refused["c4"].status == pb2.DISPATCH_STATUS_APPROVAL_REQUIRED
        assert forbidden.status == pb2.DISPATCH_STATUS_FORBIDDEN
        t.close()
    finally:
        stderr = server.stop()
    by_name = events_by_name(stderr)

    dispatched = by_name["tool_call_dispatched"]
    assert [(e["call_id"], e["replayed"], e["receipt_id"], e["version"], e["resource"]) for e in dispatched] == [
        ("c1", False, committed.receipt_id, 1, "lamp"),
        ("c1", True, committed.receipt_id, 1, "lamp"),
    ]
    assert dispatched[0]["approval_id"] == approval_id
    assert dispatched[0]["fingerprint"] == committed.fingerprint
    assert (dispatched[0]["tool"], dispatched[0]["actor"], dispatched[0]["session_id"]) == (
        "set_ticket", "learner", "s1")

    consumed = by_name["approval_consumed"]
    assert len(consumed) == 1
    assert (consumed[0]["approval_id"], consumed[0]["status"], consumed[0]["call_id"],
            consumed[0]["fingerprint"], consumed[0]["reviewer"]) == (
        approval_id, "consumed", "c1", committed.fingerprint, "reviewer")

    refusals = [(e["call_id"], e["actor"], e["status"], e["reason"]) for e in by_name["dispatch_refused"]]
    assert refusals == [
        ("c2", "learner", "stale-version", "stale-version"),
        ("c4", "learner", "approval-required", "approval-required"),
        ("c1", "other", "forbidden", "forbidden"),
    ]
    assert by_name["dispatch_refused"][1]["approval_id"] == refused["c4"].approval_id
    # The reviewer token never reaches the log.
    assert "example-reviewer-token" not in stderr
