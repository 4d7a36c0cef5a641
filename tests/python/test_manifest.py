"""SPEC §7 from Python: toolgate's manifest fingerprints are the reference
algorithm's, byte for byte, through AssessManifest, PinManifest and the CLI.

The reference algorithm is `reference_fingerprint` below, in a few lines;
thousands of random manifests (Unicode names, reorderings, duplicates,
empty strings, optional MCP fields) are compared with toolgate."""

import copy
import hashlib
import json
import random
import subprocess
import tomllib

import grpc

from conftest import REPO, toolgate_bin

EXAMPLE = REPO / "examples" / "manifests" / "docs-search.json"
DEFAULT_POLICY = REPO / "examples" / "policy.toml"
REVIEWER_TOKEN = "alice-secret"
REVIEWER = [("authorization", f"Bearer {REVIEWER_TOKEN}")]
WORKED_EXAMPLE = {
    "server": "a", "revision": "r1", "tools": [
        {"tool": "read", "description": "[[tool:elders/read]]", "parameters": ["target", "mode"],
         "read_only": True, "scopes": ["read", "audit"]},
        {"tool": "paint", "description": "Kleur kaart.", "parameters": ["target", "color"],
         "read_only": False, "scopes": ["paint"]},
    ],
}
WORKED_EXAMPLE_FINGERPRINT = "57c402536871ebb9cb2093abe956200d0e8b124ccd75959aad08503ceba6a5d1"
MCP_FIELDS = ("title", "inputSchema", "outputSchema", "annotations")


def reference_fingerprint(manifest: dict) -> str:
    """The reference algorithm: sort tools by `tool`, each tool's parameters
    and scopes, nothing else; SHA-256 of the canonical JSON (SPEC §1)."""
    record = copy.deepcopy(manifest)
    for tool in record["tools"]:
        tool["parameters"] = sorted(tool["parameters"])
        tool["scopes"] = sorted(tool["scopes"])
    record["tools"] = sorted(record["tools"], key=lambda tool: tool["tool"])
    canonical = json.dumps(record, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


def to_message(pb2, manifest: dict):
    """The reference record as the gRPC message (MCP fields only when present)."""
    tools = []
    for tool in manifest["tools"]:
        fields = dict(name=tool["tool"], description=tool["description"],
                      parameters=tool["parameters"], read_only=tool["read_only"],
                      scopes=tool["scopes"])
        if "title" in tool:
            fields["title"] = tool["title"]
        for key, field in (("inputSchema", "input_schema_json"),
                           ("outputSchema", "output_schema_json"),
                           ("annotations", "annotations_json")):
            if key in tool:
                fields[field] = json.dumps(tool[key])
        tools.append(pb2.ManifestTool(**fields))
    return pb2.Manifest(server_id=manifest["server"], revision=manifest["revision"], tools=tools)


# ----- random manifests ------------------------------------------------------

ALPHABET = (
    list("abcdefghijklmnopqrstuvwxyz_-.:/ ") + list("ÄéñßøЖжйкоп中文字ひらがな")
    + ["\u0301", "e\u0301", "\u00e9", "\U0001F600", "\U0001D11E", "\"", "\\", "\n", "\t", "\x7f",
       "\u2028", "\ufeff"]
)


def text(rng: random.Random, longest: int = 12) -> str:
    if rng.random() < 0.05:
        return ""
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, longest)))


def json_value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(8 if depth < 3 else 5)
    if kind == 0:
        return text(rng)
    if kind == 1:
        return rng.randint(-2**63, 2**63 - 1) if rng.random() < 0.2 else rng.randint(-1000, 1000)
    if kind == 2:
        return rng.choice([0.5, -0.0, 1e-7, 15000.0, 1e16, 3.141592653589793, rng.uniform(-1e6, 1e6)])
    if kind == 3:
        return rng.choice([True, False])
    if kind == 4:
        return None
    if kind == 5:
        return [json_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {text(rng, 6): json_value(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def random_schema(rng: random.Random) -> dict:
    properties = {text(rng, 6): {"type": rng.choice(["string", "integer", "number"])}
                  for _ in range(rng.randint(0, 4))}
    schema = {"type": "object", "properties": properties}
    if rng.random() < 0.5:
        schema["extra"] = json_value(rng)
    return schema


def random_tool(rng: random.Random, names: list[str]) -> dict:
    tool = {
        "tool": rng.choice(names),
        "description": text(rng, 40),
        "parameters": [text(rng) for _ in range(rng.randint(0, 5))],
        "read_only": rng.random() < 0.5,
        "scopes": [text(rng) for _ in range(rng.randint(0, 4))],
    }
    if rng.random() < 0.1:
        tool["scopes"].append("s" * rng.randint(100, 1024))
    if rng.random() < 0.3:
        tool["title"] = text(rng)
    if rng.random() < 0.3:
        tool["inputSchema"] = random_schema(rng)
    if rng.random() < 0.2:
        tool["outputSchema"] = random_schema(rng)
    if rng.random() < 0.2:
        tool["annotations"] = {"readOnlyHint": rng.random() < 0.5, "title": text(rng)}
    return tool


def random_manifest(rng: random.Random) -> dict:
    names = [text(rng) for _ in range(rng.randint(1, 8))]
    return {
        "server": text(rng, 20),
        "revision": text(rng, 20),
        "tools": [random_tool(rng, names) for _ in range(rng.randint(0, 6))],
    }


def shuffled(rng: random.Random, manifest: dict) -> dict:
    """The same manifest with tools, parameters, scopes and keys reordered."""
    def mixed(mapping: dict) -> dict:
        items = list(mapping.items())
        rng.shuffle(items)
        return dict(items)

    tools = [mixed({**tool, "parameters": rng.sample(tool["parameters"], len(tool["parameters"])),
                    "scopes": rng.sample(tool["scopes"], len(tool["scopes"]))})
             for tool in manifest["tools"]]
    # Only tools of distinct names may move: the reference keeps the input
    # order of tools that share a name (a stable sort), and so does toolgate.
    order = list(range(len(tools)))
    rng.shuffle(order)
    by_name: dict[str, list[dict]] = {}
    for tool in tools:
        by_name.setdefault(tool["tool"], []).append(tool)
    moved = []
    for index in order:
        name = tools[index]["tool"]
        if by_name[name]:
            moved.append(by_name[name].pop(0))
    return mixed({**manifest, "tools": moved})


def has_unsafe_names(manifest: dict) -> bool:
    names = [tool["tool"] for tool in manifest["tools"]]
    return "" in names or len(set(names)) != len(names)


# ----- tests -------------------------------------------------------------------

def policy_with_reviewer(extra: str = "") -> str:
    digest = hashlib.sha256(REVIEWER_TOKEN.encode()).hexdigest()
    return (
        f'[tools.noop]\nmode = "forbidden"\n[server]\nopen_host_api = true\n'
        f'[reviewers.alice]\nroles = ["manifest-reviewer"]\nworkspaces = ["*"]\n'
        f'[[credentials]]\nkind = "reviewer"\nidentity = "alice"\nsha256 = "{digest}"\n{extra}'
    )


def test_worked_example_through_assess_pin_and_cli(pb, start_server, tmp_path):
    pb2, pb2_grpc = pb
    assert reference_fingerprint(WORKED_EXAMPLE) == WORKED_EXAMPLE_FINGERPRINT
    path = tmp_path / "worked.json"
    path.write_text(json.dumps(WORKED_EXAMPLE))
    cli = subprocess.run([toolgate_bin(), "manifest", "fingerprint", str(path)],
                         capture_output=True, text=True, check=True)
    assert cli.stdout == WORKED_EXAMPLE_FINGERPRINT + "\n"
    assert "as a reference manifest" in cli.stderr

    server = start_server(policy_with_reviewer())
    with grpc.insecure_channel(server.address) as channel:
        pdp = pb2_grpc.PolicyDecisionPointStub(channel)
        pins = pb2_grpc.ManifestPinsStub(channel)
        message = to_message(pb2, WORKED_EXAMPLE)
        unpinned = pdp.AssessManifest(pb2.AssessManifestRequest(manifest=message))
        assert (unpinned.fingerprint, unpinned.reason) == (
            WORKED_EXAMPLE_FINGERPRINT, pb2.ASSESS_REASON_UNPINNED)
        pin = pins.PinManifest(pb2.PinManifestRequest(
            manifest=message, expected_fingerprint=WORKED_EXAMPLE_FINGERPRINT), metadata=REVIEWER)
        assert pin.fingerprint == WORKED_EXAMPLE_FINGERPRINT
        matched = pdp.AssessManifest(pb2.AssessManifestRequest(manifest=message))
        assert (matched.accepted, matched.reason) == (True, pb2.ASSESS_REASON_MATCHED)


def test_the_default_policy_pins_the_example_manifest():
    """The README's lines reproduce the embedded default's pin from the file."""
    pins = tomllib.loads(DEFAULT_POLICY.read_text())["pins"]
    manifest = json.loads(EXAMPLE.read_text())
    assert [(pin["server"], pin["fingerprint"]) for pin in pins] == [
        (manifest["server"], reference_fingerprint(manifest))]


def test_random_manifests_match_the_reference_over_grpc(pb, start_server):
    pb2, pb2_grpc = pb
    rng = random.Random(20261201)
    server = start_server(policy_with_reviewer())
    compared = unsafe = with_mcp = 0
    with grpc.insecure_channel(server.address) as channel:
        pdp = pb2_grpc.PolicyDecisionPointStub(channel)
        for _ in range(3000):
            manifest = random_manifest(rng)
            expected = reference_fingerprint(manifest)
            for variant in (manifest, shuffled(rng, manifest)):
                answer = pdp.AssessManifest(
                    pb2.AssessManifestRequest(manifest=to_message(pb2, variant)))
                assert answer.fingerprint == expected, json.dumps(variant)
                assert not answer.accepted
                problems = [diff for diff in answer.diffs
                            if diff.change == pb2.TOOL_CHANGE_UNSAFE]
                assert bool(problems) == has_unsafe_names(variant), answer
                compared += 1
            unsafe += has_unsafe_names(manifest)
            with_mcp += any(key in tool for tool in manifest["tools"] for key in MCP_FIELDS)
    assert compared == 6000
    assert unsafe > 300 and with_mcp > 1000, (unsafe, with_mcp)


def test_random_manifests_match_the_reference_through_the_cli(tmp_path):
    rng = random.Random(7)
    for index in range(150):
        manifest = shuffled(rng, random_manifest(rng))
        path = tmp_path / f"m{index}.json"
        # Any JSON spelling: indentation, escapes or raw UTF-8.
        path.write_text(json.dumps(manifest, ensure_ascii=rng.random() < 0.5,
                                   indent=rng.choice([None, 2])), encoding="utf-8")
        cli = subprocess.run([toolgate_bin(), "manifest", "fingerprint", str(path)],
                             capture_output=True, text=True)
        assert (cli.returncode, cli.stdout) == (0, reference_fingerprint(manifest) + "\n"), cli


def mcp_as_reference(tools_list: dict, server: str, revision: str) -> dict:
    """How an MCP tools/list result maps onto the reference record."""
    tools = []
    for tool in tools_list["tools"]:
        record = {
            "tool": tool["name"],
            "description": tool.get("description", ""),
            "parameters": list(tool.get("inputSchema", {}).get("properties", {})),
            "read_only": tool.get("annotations", {}).get("readOnlyHint", False),
            "scopes": [],
        }
        record.update({key: tool[key] for key in MCP_FIELDS if key in tool})
        tools.append(record)
    return {"server": server, "revision": revision, "tools": tools}


def test_mcp_tools_list_results_through_the_cli(tmp_path):
    rng = random.Random(11)
    for index in range(100):
        manifest = random_manifest(rng)
        tools = []
        for tool in manifest["tools"]:
            mcp = {"name": tool["tool"], "inputSchema": random_schema(rng)}
            if rng.random() < 0.8:
                mcp["description"] = tool["description"]
            for key in ("title", "outputSchema", "annotations"):
                if key in tool:
                    mcp[key] = tool[key]
            if rng.random() < 0.2:
                mcp["_meta"] = {"ignored": True}
            tools.append(mcp)
        listed = {"tools": tools}
        if rng.random() < 0.5:
            listed = {"jsonrpc": "2.0", "id": index, "result": listed}
        path = tmp_path / f"tools{index}.json"
        path.write_text(json.dumps(listed))
        server, revision = text(rng) or "s", text(rng)
        cli = subprocess.run([toolgate_bin(), "manifest", "fingerprint", str(path),
                              f"--server={server}", f"--revision={revision}"],
                             capture_output=True, text=True)
        expected = reference_fingerprint(mcp_as_reference({"tools": tools}, server, revision))
        assert (cli.returncode, cli.stdout) == (0, expected + "\n"), cli
        assert "as an MCP tools/list result" in cli.stderr


def test_unsafe_manifests_are_fingerprinted_but_never_pinned(pb, start_server):
    pb2, pb2_grpc = pb
    duplicate = copy.deepcopy(WORKED_EXAMPLE)
    duplicate["tools"].append({**WORKED_EXAMPLE["tools"][0], "description": "another read"})
    empty = copy.deepcopy(WORKED_EXAMPLE)
    empty["tools"][1]["tool"] = ""
    server = start_server(policy_with_reviewer())
    with grpc.insecure_channel(server.address) as channel:
        pdp = pb2_grpc.PolicyDecisionPointStub(channel)
        pins = pb2_grpc.ManifestPinsStub(channel)
        for manifest, tool, problem in ((duplicate, "read", "duplicate-tool-name"),
                                        (empty, "", "empty-tool-name")):
            message = to_message(pb2, manifest)
            answer = pdp.AssessManifest(pb2.AssessManifestRequest(manifest=message))
            assert answer.fingerprint == reference_fingerprint(manifest)
            assert not answer.accepted
            assert [(d.tool, d.change, d.problem) for d in answer.diffs] == [
                (tool, pb2.TOOL_CHANGE_UNSAFE, problem)]
            try:
                pins.PinManifest(pb2.PinManifestRequest(manifest=message), metadata=REVIEWER)
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert error.details().startswith("an unsafe manifest cannot be pinned: ")
                if tool:
                    assert f'named "{tool}"' in error.details(), error.details()
                else:
                    assert "a tool has an empty name" in error.details(), error.details()
            else:
                raise AssertionError("an unsafe manifest was pinned")
        assert list(pins.ListPins(pb2.ListPinsRequest(), metadata=REVIEWER).pins) == []


def test_example_manifest_against_its_pin(pb, start_server):
    """The example manifest pinned by file: reordering keeps MATCHED, a
    changed description is CHANGED with a diff, an unknown server UNPINNED."""
    pb2, pb2_grpc = pb
    manifest = json.loads(EXAMPLE.read_text())
    server = start_server(policy_with_reviewer(
        f'[[pins]]\nserver = "docs-search"\nmanifest = "{EXAMPLE}"\n'))
    with grpc.insecure_channel(server.address) as channel:
        pdp = pb2_grpc.PolicyDecisionPointStub(channel)
        assess = lambda m: pdp.AssessManifest(  # noqa: E731
            pb2.AssessManifestRequest(manifest=to_message(pb2, m)))
        matched = assess(shuffled(random.Random(3), manifest))
        assert (matched.accepted, matched.reason) == (True, pb2.ASSESS_REASON_MATCHED)
        assert matched.fingerprint == matched.pinned_fingerprint == reference_fingerprint(manifest)

        changed = copy.deepcopy(manifest)
        changed["tools"][0]["description"] = "now also deletes pages"
        answer = assess(changed)
        assert (answer.accepted, answer.reason) == (False, pb2.ASSESS_REASON_CHANGED)
        assert [(d.tool, d.change, d.description_changed) for d in answer.diffs] == [
            (changed["tools"][0]["tool"], pb2.TOOL_CHANGE_MODIFIED, True)]

        unknown = {**manifest, "server": "not-reviewed"}
        answer = assess(unknown)
        assert (answer.accepted, answer.reason, answer.pinned_fingerprint) == (
            False, pb2.ASSESS_REASON_UNPINNED, "")


def test_malformed_shape_is_invalid_argument(pb, start_server):
    pb2, pb2_grpc = pb
    server = start_server(None)
    message = to_message(pb2, WORKED_EXAMPLE)
    message.tools[1].annotations_json = "[1]"
    with grpc.insecure_channel(server.address) as channel:
        pdp = pb2_grpc.PolicyDecisionPointStub(channel)
        try:
            pdp.AssessManifest(pb2.AssessManifestRequest(manifest=message))
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert error.details() == "manifest.tools[1].annotations_json: must be a JSON object"
        else:
            raise AssertionError("a non-object annotations field was accepted")


def test_manifest_unverified_says_never_assessed_or_differed(pb, start_server):
    """On the embedded default: search_docs is gated on the example manifest."""
    pb2, pb2_grpc = pb
    server = start_server(None)
    session = pb2.Session(actor="support-agent", session_id="s1", workspace="w")

    def search(call_id):
        proposal = pb2.Proposal(call_id=call_id, actor="support-agent", name="search_docs",
                                arguments_json='{"query": "refunds"}')
        return pdp.Decide(pb2.DecideRequest(session=session, proposal=proposal))

    manifest = json.loads(EXAMPLE.read_text())
    with grpc.insecure_channel(server.address) as channel:
        pdp = pb2_grpc.PolicyDecisionPointStub(channel)
        never = search("c1")
        assert (never.outcome, never.reason) == (pb2.OUTCOME_DENY, "manifest-unverified")
        assert "was never assessed" in never.message, never.message

        changed = copy.deepcopy(manifest)
        changed["tools"][1]["scopes"].append("docs:write")
        answer = pdp.AssessManifest(pb2.AssessManifestRequest(manifest=to_message(pb2, changed)))
        assert (answer.accepted, answer.reason) == (False, pb2.ASSESS_REASON_CHANGED)
        differed = search("c2")
        assert differed.reason == "manifest-unverified"
        assert "differed from its pin" in differed.message, differed.message

        answer = pdp.AssessManifest(pb2.AssessManifestRequest(manifest=to_message(pb2, manifest)))
        assert (answer.accepted, answer.reason) == (True, pb2.ASSESS_REASON_MATCHED)
        assert (search("c3").outcome, search("c4").reason) == (pb2.OUTCOME_ALLOW, "allowed")
