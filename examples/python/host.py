#!/usr/bin/env python3
"""A toolgate host in Python: the agent loop around a (scripted) model.

    examples/python/host.py --server 127.0.0.1:50051 [--session ID] [--timeout 120] [--token T]

against `toolgate serve --config examples/tickets.toml`. A deterministic
stand-in for the model proposes two tool calls (set_ticket lamp -> done, then
send_reply to customer-42). For each one the host

1. reads the current version of the resource it changes (GetResource);
2. asks Decide whether it may run;
3. on REQUIRE_APPROVAL prints `waiting approval_id=<id>` and asks Decide again
   with the same proposal every 100 ms (same call id and fingerprint: it costs
   nothing) until a reviewer granted it (ALLOW `approved`) or denied it (DENY),
   or the wait times out — the host holds only a host credential, so it
   never talks to the reviewer API; a reviewer grants from a second terminal
   (`toolgate approvals grant <id>`);
4. commits it with Dispatch and prints the receipt.

Every run is a new session (a random id unless --session is given) whose call
ids are `<session>-<n>`, so the host can run again and again on one server.
`--token` (or TOOLGATE_HOST_TOKEN: not TOOLGATE_TOKEN, which the CLI reads as
a reviewer's) is sent as `authorization: Bearer <token>` when the policy has
host credentials; over plaintext only to loopback, unless
--insecure-plaintext.

Every line on stdout is `<word> key=value ...` (a `value=` or `arguments=`
JSON text is always last). Exit status: 0 when every proposal was committed,
1 on any other outcome (denied, timed out, refused, RPC error), 2 on bad usage.

Uses the toolgate_client package (`pip install ./clients/python`); from a
clone without it, the package's source in clients/python/src is used (needs
`grpcio` and `protobuf`).
"""

import argparse
import json
import os
import pathlib
import re
import sys
import uuid

import grpc

try:
    import toolgate_client
except ImportError:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "clients" / "python" / "src"))
    import toolgate_client

ACTOR = "learner"
WORKSPACE = "desk"
POLL_SECONDS = 0.1
RPC_TIMEOUT_SECONDS = 5.0
DEFAULT_TIMEOUT_SECONDS = 120.0
ID_PATTERN = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,39}")


class HostError(Exception):
    """An outcome the host does not go on from."""


def scripted_model():
    """The deterministic stand-in for a language model: the tool calls it
    proposes, each with the resource whose version it is proposed against."""
    yield "set_ticket", {"ticket": "lamp", "status": "done"}, "lamp"
    yield "send_reply", {"recipient": "customer-42", "text": "Your lamp is fixed."}, "outbox"


def emit(line):
    print(line, flush=True)


def emit_decision(call_id, decision):
    emit(f"decide call_id={call_id} outcome={decision.outcome.name} reason={decision.reason}")


def run(host, timeout):
    for tool, arguments, resource in scripted_model():
        version = host.version(resource)
        proposal = host.propose(tool, arguments, version=version)
        call_id = proposal.call_id
        emit(f"propose call_id={call_id} tool={tool} version={version}"
             f" arguments={proposal.arguments_json}")
        decision = host.decide(proposal)
        emit_decision(call_id, decision)
        if decision.pending:
            try:
                decision = host.wait_for_verdict(
                    proposal, timeout=timeout, poll_interval=POLL_SECONDS,
                    on_waiting=lambda pending: emit(f"waiting approval_id={pending.approval_id}"))
            except toolgate_client.VerdictTimeout as error:
                raise HostError(str(error)) from None
            emit_decision(call_id, decision)
        if not decision.allowed:
            raise HostError(f"{call_id} may not run: {decision.reason} ({decision.message})")

        receipt = host.dispatch(proposal)
        if not receipt.committed:
            raise HostError(f"{call_id} was not committed: {receipt.status.name} {receipt.reason}"
                            f" ({receipt.message})")
        emit(f"receipt call_id={call_id} resource={receipt.resource} receipt_id={receipt.receipt_id}"
             f" version={receipt.version} replayed={str(receipt.replayed).lower()}"
             f" value={receipt.value_json}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", required=True, metavar="HOST:PORT",
                        help="address of a toolgate serving examples/tickets.toml"
                             " (https://HOST:PORT for TLS)")
    parser.add_argument("--ca", metavar="PEM",
                        help="https: the CA certificate the server's must chain to")
    parser.add_argument("--cert", metavar="PEM", help="https with mTLS: the client certificate")
    parser.add_argument("--key", metavar="PEM", help="https with mTLS: the client key")
    parser.add_argument("--session", metavar="SESSION_ID",
                        help="session id; call ids are <session>-<n> (default: a new random id)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_SECONDS, metavar="SECONDS",
                        help=f"how long to wait for a reviewer per approval ({DEFAULT_TIMEOUT_SECONDS:g})")
    parser.add_argument("--token", default=os.environ.get("TOOLGATE_HOST_TOKEN"),
                        help="host credential, sent as `authorization: Bearer`"
                             " (default: $TOOLGATE_HOST_TOKEN)")
    parser.add_argument("--insecure-plaintext", action="store_true",
                        help="send --token over plaintext to a non-loopback server"
                             " (behind a mesh that encrypts it)")
    args = parser.parse_args(argv)
    session_id = args.session or f"py-{uuid.uuid4().hex[:8]}"
    # Call ids are `<session>-<n>` and must fit the 40-character id pattern.
    if not ID_PATTERN.fullmatch(session_id) or len(session_id) > 37:
        parser.error("--session must match [A-Za-z][A-Za-z0-9_-]* and have at most 37 characters")
    if not args.timeout > 0:
        parser.error("--timeout must be a positive number of seconds")

    try:
        host = toolgate_client.Host(args.server, actor=ACTOR, workspace=WORKSPACE,
                                    session_id=session_id, token=args.token or None,
                                    rpc_timeout=RPC_TIMEOUT_SECONDS,
                                    ca=args.ca, cert=args.cert, key=args.key,
                                    insecure_plaintext=args.insecure_plaintext)
    except (ValueError, OSError) as error:
        parser.error(str(error))
    try:
        with host:
            run(host, args.timeout)
    except (HostError, toolgate_client.ToolgateError) as error:
        print(f"host: {error}", file=sys.stderr, flush=True)
        return 1
    except grpc.RpcError as error:
        print(f"host: {error.code().name}: {error.details()}", file=sys.stderr, flush=True)
        return 1
    emit("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
