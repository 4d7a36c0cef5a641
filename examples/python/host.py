#!/usr/bin/env python3
"""A toolgate host in Python: the agent loop around a (scripted) model.

    python examples/python/host.py --server 127.0.0.1:50051 --session s1

against `toolgate serve --config examples/tickets.toml`. A deterministic
stand-in for the model proposes two tool calls (set_ticket lamp -> done, then
send_reply to customer-42). For each one the host

1. asks Decide whether it may run;
2. on REQUIRE_APPROVAL prints `waiting approval_id=<id>` and asks Decide again
   with the same proposal every 100 ms (same call id and fingerprint: it costs
   nothing) until a reviewer granted it (ALLOW `approved`) or denied it (DENY),
   or the wait times out — the host holds only a host credential, so it
   never talks to the reviewer API;
3. commits it with Dispatch at the version the previous Dispatch returned
   (0 for the first), and prints the receipt.

Every line on stdout is `<word> key=value ...` (a `value=` or `arguments=`
JSON text is always last). Exit status: 0 when every proposal was committed,
1 on any other outcome (denied, timed out, refused, RPC error), 2 on bad usage.

The gRPC stubs are generated at start with grpcio-tools from
proto/toolgate/v1/toolgate.proto into a temporary directory (needs `grpcio`
and `grpcio-tools`, as in tests/python/requirements.txt).
"""

import argparse
import atexit
import importlib
import json
import pathlib
import re
import shutil
import sys
import tempfile
import time

import grpc

REPO = pathlib.Path(__file__).resolve().parents[2]
PROTO_ROOT = REPO / "proto"
PROTO_FILE = PROTO_ROOT / "toolgate" / "v1" / "toolgate.proto"

ACTOR = "learner"
WORKSPACE = "desk"
POLL_SECONDS = 0.1
RPC_TIMEOUT_SECONDS = 5.0
ID_PATTERN = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,39}")


class HostError(Exception):
    """An outcome the host does not go on from."""


def load_stubs():
    """Generate toolgate_pb2 / toolgate_pb2_grpc into a temporary directory and import them."""
    import grpc_tools
    from grpc_tools import protoc

    out = pathlib.Path(tempfile.mkdtemp(prefix="toolgate-stubs-"))
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    # grpc_tools ships google/protobuf/*.proto (timestamp.proto) in its _proto dir.
    well_known = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    code = protoc.main([
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        str(PROTO_FILE),
    ])
    if code != 0:
        raise HostError(f"grpc_tools.protoc failed with exit code {code} on {PROTO_FILE}")
    for package in (out / "toolgate", out / "toolgate" / "v1"):
        (package / "__init__.py").touch()
    sys.path.insert(0, str(out))
    return (importlib.import_module("toolgate.v1.toolgate_pb2"),
            importlib.import_module("toolgate.v1.toolgate_pb2_grpc"))


def scripted_model(session_id):
    """The deterministic stand-in for a language model: the tool calls it proposes.

    Call ids are derived from the session so that another session on the same
    server proposes new operations instead of retrying these.
    """
    yield f"{session_id}-1", "set_ticket", {"ticket": "lamp", "status": "done"}
    yield f"{session_id}-2", "send_reply", {"recipient": "customer-42", "text": "Your lamp is fixed."}


def emit(line):
    print(line, flush=True)


def enum_name(enum, number, prefix):
    return enum.Name(number).removeprefix(prefix)


def wait_until_decided(pb2, pdp, request, first, timeout):
    """Re-ask Decide every 100 ms until the pending approval is granted or denied."""
    emit(f"waiting approval_id={first.approval_id}")
    deadline = time.monotonic() + timeout
    answer = first
    while answer.outcome == pb2.OUTCOME_REQUIRE_APPROVAL:
        if answer.approval_id != first.approval_id:
            # The request expired and Decide opened a new one: a reviewer must look again.
            emit(f"waiting approval_id={answer.approval_id}")
            first = answer
        if time.monotonic() >= deadline:
            raise HostError(f"no reviewer decided approval {answer.approval_id} within {timeout:g} s")
        time.sleep(POLL_SECONDS)
        answer = pdp.Decide(request, timeout=RPC_TIMEOUT_SECONDS)
    return answer


def run(pb2, rpc, server, session_id, timeout):
    channel = grpc.insecure_channel(server)
    pdp = rpc.PolicyDecisionPointStub(channel)
    session = pb2.Session(actor=ACTOR, session_id=session_id, workspace=WORKSPACE)
    version = 0  # the state version the next proposal is made against
    try:
        for call_id, tool, arguments in scripted_model(session_id):
            arguments_json = json.dumps(arguments)
            emit(f"propose call_id={call_id} tool={tool} version={version} arguments={arguments_json}")
            proposal = pb2.Proposal(call_id=call_id, actor=ACTOR, name=tool, version=version,
                                    arguments_json=arguments_json)
            request = pb2.DecideRequest(session=session, proposal=proposal)
            answer = pdp.Decide(request, timeout=RPC_TIMEOUT_SECONDS)
            emit(f"decide call_id={call_id} outcome={enum_name(pb2.Outcome, answer.outcome, 'OUTCOME_')}"
                 f" reason={answer.reason}")
            if answer.outcome == pb2.OUTCOME_REQUIRE_APPROVAL:
                answer = wait_until_decided(pb2, pdp, request, answer, timeout)
                emit(f"decide call_id={call_id} outcome={enum_name(pb2.Outcome, answer.outcome, 'OUTCOME_')}"
                     f" reason={answer.reason}")
            if answer.outcome != pb2.OUTCOME_ALLOW:
                raise HostError(f"{call_id} may not run: {answer.reason} ({answer.message})")

            result = pdp.Dispatch(pb2.DispatchRequest(session=session, proposal=proposal),
                                  timeout=RPC_TIMEOUT_SECONDS)
            if result.status != pb2.DISPATCH_STATUS_OK:
                status = enum_name(pb2.DispatchStatus, result.status, "DISPATCH_STATUS_")
                raise HostError(f"{call_id} was not committed: {status} {result.reason} ({result.message})")
            emit(f"receipt call_id={call_id} resource={result.resource} receipt_id={result.receipt_id}"
                 f" version={result.version} replayed={str(result.replayed).lower()}"
                 f" value={result.value_json}")
            version = result.version
    finally:
        channel.close()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", required=True, metavar="HOST:PORT",
                        help="address of a toolgate serving examples/tickets.toml")
    parser.add_argument("--session", required=True, metavar="SESSION_ID",
                        help="session id (call ids are derived from it)")
    parser.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                        help="how long to wait for a reviewer per approval (30)")
    args = parser.parse_args(argv)
    # Call ids are `<session>-<n>` and must fit the 40-character id pattern.
    if not ID_PATTERN.fullmatch(args.session) or len(args.session) > 37:
        parser.error("--session must match [A-Za-z][A-Za-z0-9_-]* and have at most 37 characters")

    try:
        pb2, rpc = load_stubs()
        run(pb2, rpc, args.server, args.session, args.timeout)
    except HostError as error:
        print(f"host: {error}", file=sys.stderr, flush=True)
        return 1
    except grpc.RpcError as error:
        print(f"host: {error.code().name}: {error.details()}", file=sys.stderr, flush=True)
        return 1
    emit("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
