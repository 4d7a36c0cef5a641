"""A thin typed wrapper over toolgate's host API for the agent host loop:
propose, decide, wait for the reviewer's verdict, dispatch, read the receipt.

Every method is one or a few plain gRPC calls on the generated stubs
(`toolgate_client.toolgate_pb2`, `toolgate_client.toolgate_pb2_grpc`); the
stubs stay reachable as `Host.pdp` and `Host.resources_stub` for anything the
wrapper does not cover. Refusals are answers, not exceptions: a DENY is a
`Decision`, a STALE_VERSION is a `Receipt`. Bad input and transport failures
raise `grpc.RpcError` unchanged (an INVALID_ARGUMENT's details name the field
and the rule). An answer this client cannot read (an outcome or status number
it does not know) raises `ProtocolError`, never passes as allowed.
"""

from __future__ import annotations

import datetime
import enum
import ipaddress
import itertools
import json
import math
import time
import urllib.parse
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from toolgate_client import toolgate_pb2 as pb2
from toolgate_client import toolgate_pb2_grpc as pb2_grpc


class Outcome(enum.Enum):
    """What Decide answered."""

    ALLOW = pb2.OUTCOME_ALLOW
    DENY = pb2.OUTCOME_DENY
    REQUIRE_APPROVAL = pb2.OUTCOME_REQUIRE_APPROVAL


class DispatchStatus(enum.Enum):
    """What Dispatch answered; only OK committed (or replayed) the change."""

    OK = pb2.DISPATCH_STATUS_OK
    FORBIDDEN = pb2.DISPATCH_STATUS_FORBIDDEN
    UNKNOWN_TOOL = pb2.DISPATCH_STATUS_UNKNOWN_TOOL
    DENIED = pb2.DISPATCH_STATUS_DENIED
    CALL_ID_CONFLICT = pb2.DISPATCH_STATUS_CALL_ID_CONFLICT
    STALE_VERSION = pb2.DISPATCH_STATUS_STALE_VERSION
    APPROVAL_REQUIRED = pb2.DISPATCH_STATUS_APPROVAL_REQUIRED
    MISSING_RESOURCE = pb2.DISPATCH_STATUS_MISSING_RESOURCE
    LOG_FULL = pb2.DISPATCH_STATUS_LOG_FULL


class ToolgateError(Exception):
    """Base class of the errors this wrapper raises itself."""


class ProtocolError(ToolgateError):
    """The server answered something this client cannot interpret."""


class VerdictTimeout(ToolgateError):
    """No reviewer granted or denied the approval within the timeout."""

    def __init__(self, decision: Decision, timeout: float):
        super().__init__(
            f"no reviewer decided approval {decision.approval_id} within {timeout:g} s")
        self.decision = decision
        self.timeout = timeout


@dataclass(frozen=True)
class Proposal:
    """One intended tool call. `arguments_json` is serialised once, so that
    asking again sends the same text and so the same fingerprint."""

    call_id: str
    tool: str
    version: int
    arguments_json: str

    @property
    def arguments(self) -> Any:
        return json.loads(self.arguments_json)


@dataclass(frozen=True)
class Decision:
    outcome: Outcome
    reason: str
    message: str
    fingerprint: str
    policy_revision: str
    approval_id: str
    approval_expires_at: datetime.datetime | None

    @property
    def allowed(self) -> bool:
        return self.outcome is Outcome.ALLOW

    @property
    def pending(self) -> bool:
        return self.outcome is Outcome.REQUIRE_APPROVAL


@dataclass(frozen=True)
class Receipt:
    status: DispatchStatus
    reason: str
    message: str
    fingerprint: str
    # After OK: the version the commit produced; on STALE_VERSION: the current one.
    version: int
    resource: str
    value_json: str
    # Hosts use it as the idempotency key of their own side effect.
    receipt_id: str
    replayed: bool
    approval_id: str
    policy_revision: str
    # After an append: the index the item landed at.
    appended_index: int | None = None

    @property
    def committed(self) -> bool:
        return self.status is DispatchStatus.OK

    @property
    def value(self) -> Any:
        """What the commit wrote (None when the effect touches none): the value set,
        or for an append the item appended, never the whole queue."""
        return json.loads(self.value_json) if self.value_json else None


@dataclass(frozen=True)
class Resource:
    name: str
    value_json: str
    # The version a proposal against this resource must carry.
    version: int

    @property
    def value(self) -> Any:
        return json.loads(self.value_json)


def _enum(kind: type[enum.Enum], number: int, what: str):
    try:
        return kind(number)
    except ValueError:
        raise ProtocolError(f"unknown {what} {number} in the server's answer") from None


def _timestamp(message, field: str) -> datetime.datetime | None:
    if not message.HasField(field):
        return None
    return getattr(message, field).ToDatetime(tzinfo=datetime.timezone.utc)


def open_channel(target: str, *, ca: str | None = None, cert: str | None = None,
                 key: str | None = None) -> grpc.Channel:
    """A channel to `target`: `host:port` or `http://host:port` in
    plaintext, `https://host:port` over TLS. `ca` is the PEM file of the CA
    that signed the server's certificate (the system's roots when absent);
    `cert` and `key` are the client's PEM certificate and key, for mTLS."""
    if target.startswith("https://"):
        def read(path):
            with open(path, "rb") as file:
                return file.read()
        if (cert is None) != (key is None):
            raise ValueError("cert and key go together")
        credentials = grpc.ssl_channel_credentials(
            root_certificates=read(ca) if ca else None,
            private_key=read(key) if key else None,
            certificate_chain=read(cert) if cert else None)
        return grpc.secure_channel(target.removeprefix("https://"), credentials)
    if ca or cert or key:
        raise ValueError(f"ca, cert and key need an https:// target (got {target})")
    return grpc.insecure_channel(target.removeprefix("http://"))


def _is_loopback(target: str) -> bool:
    """Whether a `host:port` (or `http://host:port`) target is this machine."""
    host = urllib.parse.urlsplit("//" + target.removeprefix("http://")).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


#: The codes after which a call may have reached the server or not.
_TRANSIENT = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
#: The codes after which a Dispatch is sent again: those, and
#: RESOURCE_EXHAUSTED, which the server also answers when a commit's answer
#: found no room to be sent ("retry with backoff"); a Dispatch sent again
#: is answered from its stored receipt, so sending it again is always safe.
_DISPATCH_AGAIN = _TRANSIENT + (grpc.StatusCode.RESOURCE_EXHAUSTED,)


class Host:
    """One agent session's view of toolgate.

        with Host("127.0.0.1:50051", actor="support-agent", workspace="desk") as host:
            proposal = host.propose("set_ticket", {"ticket": "lamp", "status": "done"},
                                    version=host.resource("lamp").version)
            decision = host.wait_for_verdict(proposal, timeout=120)
            if decision.allowed:
                receipt = host.dispatch(proposal)

    `session_id` defaults to a fresh random id, so that every run is a new
    session whose call ids (`<session_id>-<n>`) are new operations. `token`
    is sent as `authorization: Bearer <token>` when the policy has host
    credentials. `target` may be `https://host:port`, with `ca`, `cert`
    and `key` as [`open_channel`] takes them (mTLS: a client certificate
    may be the host's credential, with or without a token). A token goes
    over plaintext only to this machine (loopback), unless
    `insecure_plaintext` says a network the caller trusts carries it
    (a mesh that encrypts it, say).
    """

    def __init__(self, target: str, *, actor: str, workspace: str,
                 session_id: str | None = None, token: str | None = None,
                 rpc_timeout: float = 5.0, channel: grpc.Channel | None = None,
                 ca: str | None = None, cert: str | None = None, key: str | None = None,
                 insecure_plaintext: bool = False):
        if (token and channel is None and not target.startswith("https://")
                and not _is_loopback(target) and not insecure_plaintext):
            raise ValueError(
                f"a token goes over plaintext only to loopback, not to {target}: use "
                "https:// (with ca=...), or insecure_plaintext=True behind a mesh that "
                "encrypts it")
        self.actor = actor
        self.workspace = workspace
        self.session_id = session_id or f"s{uuid.uuid4().hex[:12]}"
        self.rpc_timeout = rpc_timeout
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._owns_channel = channel is None
        self.channel = channel if channel is not None else open_channel(
            target, ca=ca, cert=cert, key=key)
        self.pdp = pb2_grpc.PolicyDecisionPointStub(self.channel)
        self.resources_stub = pb2_grpc.ResourcesStub(self.channel)
        self._call_numbers = itertools.count(1)

    def __enter__(self) -> Host:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        if self._owns_channel:
            self.channel.close()

    def _session(self):
        return pb2.Session(actor=self.actor, session_id=self.session_id, workspace=self.workspace)

    def _request(self, proposal: Proposal, kind):
        return kind(session=self._session(), proposal=pb2.Proposal(
            call_id=proposal.call_id, actor=self.actor, name=proposal.tool,
            version=proposal.version, arguments_json=proposal.arguments_json))

    def propose(self, tool: str, arguments: Mapping[str, Any], *, version: int,
                call_id: str | None = None) -> Proposal:
        """A proposal of this session's actor; `call_id` defaults to `<session_id>-<n>`."""
        if call_id is None:
            call_id = f"{self.session_id}-{next(self._call_numbers)}"
        return Proposal(call_id=call_id, tool=tool, version=version,
                        arguments_json=json.dumps(dict(arguments)))

    def decide(self, proposal: Proposal, *, timeout: float | None = None) -> Decision:
        """May this proposal run? One Decide call (within `timeout` s, by
        default the host's `rpc_timeout`)."""
        answer = self.pdp.Decide(self._request(proposal, pb2.DecideRequest),
                                 timeout=self.rpc_timeout if timeout is None else timeout,
                                 metadata=self._metadata)
        return Decision(
            outcome=_enum(Outcome, answer.outcome, "outcome"),
            reason=answer.reason,
            message=answer.message,
            fingerprint=answer.fingerprint,
            policy_revision=answer.policy_revision,
            approval_id=answer.approval_id,
            approval_expires_at=_timestamp(answer, "approval_expires_at"),
        )

    def wait_for_verdict(self, proposal: Proposal, *, timeout: float,
                         poll_interval: float = 0.2,
                         on_waiting: Callable[[Decision], None] | None = None) -> Decision:
        """Decides, and while the answer is REQUIRE_APPROVAL asks again every
        `poll_interval` seconds (same call id and fingerprint: it costs no
        budget) until a reviewer granted it (ALLOW `approved`) or denied it
        (DENY `approval-denied`). Returns the first answer that is not
        pending; raises VerdictTimeout after `timeout` seconds.

        `on_waiting(decision)` is called for each approval id waited on: the
        first one, and a new one if the request expired and Decide opened
        another. A server that is unreachable for a while (a restart keeps
        the request) is asked again until the timeout; when none of its
        Decides was answered, the last error (a `grpc.RpcError`) is raised
        then; once one answered pending, a Decide that the wait's end cut
        short ends it with VerdictTimeout and that pending answer. No Decide
        outlasts the timeout.
        """
        if not (math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
        if not poll_interval >= 0.05:
            raise ValueError(f"poll_interval must be at least 0.05 s, not {poll_interval!r}")
        deadline = time.monotonic() + timeout
        waited_on = ""
        decision = None
        while True:
            unreachable = None
            left = max(deadline - time.monotonic(), 0.05)
            cut = self.rpc_timeout is None or left < self.rpc_timeout
            try:
                answered = self.decide(proposal, timeout=left if cut else self.rpc_timeout)
            except grpc.RpcError as error:
                if error.code() not in _TRANSIENT:
                    raise
                # A call cut short by the wait's end, after an answer that
                # was pending: the wait is over, not the server gone.
                if not (cut and decision is not None
                        and error.code() == grpc.StatusCode.DEADLINE_EXCEEDED):
                    unreachable = error
            else:
                decision = answered
            if unreachable is None and decision is not None:
                if not decision.pending:
                    return decision
                if decision.approval_id != waited_on:
                    waited_on = decision.approval_id
                    if on_waiting is not None:
                        on_waiting(decision)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if unreachable is not None:
                    raise unreachable
                raise VerdictTimeout(decision, timeout)
            time.sleep(min(poll_interval, remaining))

    def dispatch(self, proposal: Proposal, *, retries: int = 3) -> Receipt:
        """Commit the proposal's change exactly once. When the answer is lost
        (UNAVAILABLE, DEADLINE_EXCEEDED) or had no room to be sent
        (RESOURCE_EXHAUSTED) the same proposal is sent again, up to
        `retries` times: a commit that happened is answered from its stored
        receipt (`replayed`), never made twice. A `grpc.RpcError` raised
        here means the outcome is unknown: call `dispatch` again with the
        same proposal, never `propose` anew (a new call id is a new commit).
        A Dispatch sent again is checked against the policy before its
        receipt is looked up (the contract's order): should a reload or a
        changed manifest refuse the tool in between, a refusal can answer a
        change that the first attempt committed; read the resource before
        acting on it."""
        request = self._request(proposal, pb2.DispatchRequest)
        for attempt in range(retries + 1):
            try:
                answer = self.pdp.Dispatch(request, timeout=self.rpc_timeout,
                                           metadata=self._metadata)
                break
            except grpc.RpcError as error:
                if error.code() not in _DISPATCH_AGAIN or attempt == retries:
                    raise
                time.sleep(0.2 * 2 ** attempt)
        return Receipt(
            status=_enum(DispatchStatus, answer.status, "dispatch status"),
            reason=answer.reason,
            message=answer.message,
            fingerprint=answer.fingerprint,
            version=answer.version,
            resource=answer.resource,
            value_json=answer.value_json,
            receipt_id=answer.receipt_id,
            replayed=answer.replayed,
            approval_id=answer.approval_id,
            policy_revision=answer.policy_revision,
            appended_index=(answer.appended_index if answer.HasField("appended_index")
                            else None),
        )

    def version(self, name: str) -> int:
        """The version a proposal against the resource must carry: its first
        page only, however long a queue it is."""
        return self.resources_stub.GetResource(pb2.GetResourceRequest(name=name),
                                               timeout=self.rpc_timeout,
                                               metadata=self._metadata).version

    def resource(self, name: str) -> Resource:
        """A resource's current value and the version a proposal against it must carry."""
        found = self.resources_stub.GetResource(pb2.GetResourceRequest(name=name),
                                                timeout=self.rpc_timeout,
                                                metadata=self._metadata)
        if not found.next_page_token:
            return Resource(name=found.name, value_json=found.value_json, version=found.version)
        # A queue comes a page at a time: join the pages' items.
        items = json.loads(found.value_json)
        while found.next_page_token:
            found = self.resources_stub.GetResource(
                pb2.GetResourceRequest(name=name, page_token=found.next_page_token),
                timeout=self.rpc_timeout, metadata=self._metadata)
            items.extend(json.loads(found.value_json))
        return Resource(name=found.name, value_json=json.dumps(items, separators=(",", ":")),
                        version=found.version)
