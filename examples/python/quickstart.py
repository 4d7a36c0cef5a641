#!/usr/bin/env python3
# toolgate quickstart: `pip install ./clients/python`, start `toolgate serve`
# (the embedded default policy), then run this; grant from a second terminal.
import sys
from toolgate_client import Host, VerdictTimeout

WAIT_SECONDS = 120  # how long to wait for a reviewer's verdict
address = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:50051"
host = Host(address, actor="support-agent", workspace="desk")
lamp = host.resource("lamp")
print(f"session {host.session_id}: lamp is {lamp.value_json} at version {lamp.version}")
proposals = [
    host.propose("draft_reply", {"ticket": "lamp", "text": "On it."}, version=lamp.version),
    host.propose("change_role", {"role": "admin"}, version=lamp.version),
    host.propose("set_ticket", {"ticket": "lamp", "status": "done"}, version=lamp.version),
]
for proposal in proposals:
    decision = host.decide(proposal)
    print(f"decide {proposal.tool}: {decision.outcome.name} {decision.reason} ({decision.message})")

def tell_the_reviewer(pending):
    print(f"waiting up to {WAIT_SECONDS} s for a reviewer; in a second terminal:"
          f" toolgate approvals grant {pending.approval_id}", flush=True)

set_ticket = proposals[-1]
try:
    verdict = host.wait_for_verdict(set_ticket, timeout=WAIT_SECONDS, on_waiting=tell_the_reviewer)
    print(f"verdict {set_ticket.tool}: {verdict.outcome.name} {verdict.reason} ({verdict.message})")
except VerdictTimeout as timeout:
    verdict = None
    print(f"verdict {set_ticket.tool}: none ({timeout})")

if verdict is not None and verdict.allowed:
    receipt = host.dispatch(set_ticket)
    print(f"dispatch {set_ticket.tool}: {receipt.status.name} {receipt.reason} ({receipt.message})"
          f" {receipt.resource}={receipt.value_json} version={receipt.version}"
          f" receipt={receipt.receipt_id} replayed={receipt.replayed}")

host.close()
