"""SPEC §7 over gRPC from Python: AssessManifest against a pinned manifest."""

import hashlib
import json

import grpc

from conftest import REPO

EXAMPLE = REPO / "examples" / "manifests" / "docs-search.json"


def load_manifest(pb2):
    data = json.loads(EXAMPLE.read_text())
    tools = []
    for tool in data["tools"]:
        schema = tool.get("input_schema")
        tools.append(pb2.ManifestTool(
            name=tool["name"],
            description=tool.get("description", ""),
            parameters=tool.get("parameters", []),
            read_only=tool.get("read_only", False),
            scopes=tool.get("scopes", []),
            input_schema_json=json.dumps(schema) if schema is not None else "",
        ))
    return pb2.Manifest(server_id=data["server_id"], revision=data["revision"], tools=tools)


REVIEWER_TOKEN = "alice-secret"


def policy_for_example():
    digest = hashlib.sha256(REVIEWER_TOKEN.encode()).hexdigest()
    return (
        f'[tools.noop]\nmode = "forbidden"\n[server]\nopen_host_api = true\n'
        f'[reviewers.alice]\nroles = ["manifest-reviewer"]\nworkspaces = ["*"]\n'
        f'[[credentials]]\nkind = "reviewer"\nidentity = "alice"\nsha256 = "{digest}"\n'
        f'[[pins]]\nserver = "docs-search"\nmanifest = "{EXAMPLE}"\n'
    )


def test_manifest_scenario(pb, start_server):
    pb2, pb2_grpc = pb
    server = start_server(policy_for_example())
    with grpc.insecure_channel(server.address) as channel:
        pdp = pb2_grpc.PolicyDecisionPointStub(channel)
        pins = pb2_grpc.ManifestPinsStub(channel)

        matched = pdp.AssessManifest(pb2.AssessManifestRequest(manifest=load_manifest(pb2)))
        assert matched.accepted
        assert matched.reason == pb2.ASSESS_REASON_MATCHED
        assert matched.fingerprint == matched.pinned_fingerprint
        pinned = matched.pinned_fingerprint

        reordered = load_manifest(pb2)
        for tool in reordered.tools:
            tool.scopes.reverse()
        reordered.tools.reverse()
        same = pdp.AssessManifest(pb2.AssessManifestRequest(manifest=reordered))
        assert same.reason == pb2.ASSESS_REASON_MATCHED
        assert same.fingerprint == pinned

        changed = load_manifest(pb2)
        changed.tools[0].description = "now also deletes pages"
        answer = pdp.AssessManifest(pb2.AssessManifestRequest(manifest=changed))
        assert not answer.accepted
        assert answer.reason == pb2.ASSESS_REASON_CHANGED
        assert answer.pinned_fingerprint == pinned
        assert [d.tool for d in answer.diffs] == [changed.tools[0].name]
        assert answer.diffs[0].description_changed
        listed = pins.ListPins(pb2.ListPinsRequest(),
                               metadata=[("authorization", f"Bearer {REVIEWER_TOKEN}")]).pins
        assert [(p.server_id, p.fingerprint) for p in listed] == [("docs-search", pinned)]

        unknown = load_manifest(pb2)
        unknown.server_id = "not-reviewed"
        answer = pdp.AssessManifest(pb2.AssessManifestRequest(manifest=unknown))
        assert not answer.accepted
        assert answer.reason == pb2.ASSESS_REASON_UNPINNED
        assert answer.pinned_fingerprint == ""


def test_fingerprint_matches_cli_and_python_canonical_form(pb, start_server):
    """The manifest fingerprint is reproducible from SPEC §1 in Python."""
    import subprocess

    from conftest import toolgate_bin

    pb2, pb2_grpc = pb
    data = json.loads(EXAMPLE.read_text())
    for tool in data["tools"]:
        tool.setdefault("description", "")
        tool.setdefault("read_only", False)
        tool["parameters"] = sorted(tool.get("parameters", []))
        tool["scopes"] = sorted(tool.get("scopes", []))
    data["tools"].sort(key=lambda tool: tool["name"])
    canonical = json.dumps(data, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
    expected = hashlib.sha256(canonical.encode("ascii")).hexdigest()

    cli = subprocess.run([toolgate_bin(), "manifest", "fingerprint", str(EXAMPLE)],
                         capture_output=True, text=True, check=True)
    assert cli.stdout.strip() == expected

    server = start_server(policy_for_example())
    with grpc.insecure_channel(server.address) as channel:
        pdp = pb2_grpc.PolicyDecisionPointStub(channel)
        answer = pdp.AssessManifest(pb2.AssessManifestRequest(manifest=load_manifest(pb2)))
        assert answer.fingerprint == expected


def test_invalid_manifest_is_invalid_argument(pb, start_server):
    pb2, pb2_grpc = pb
    server = start_server(None)
    manifest = load_manifest(pb2)
    manifest.tools.append(manifest.tools[0])
    with grpc.insecure_channel(server.address) as channel:
        pdp = pb2_grpc.PolicyDecisionPointStub(channel)
        try:
            pdp.AssessManifest(pb2.AssessManifestRequest(manifest=manifest))
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert error.details().startswith("manifest.tools[2].name:")
        else:
            raise AssertionError("duplicate tool names were accepted")
