#!/usr/bin/env python3
"""Regenerates the committed gRPC stubs of the toolgate_client package.

    python clients/python/generate_stubs.py            # rewrite src/toolgate_client/toolgate_pb2*.py{,i}
    python clients/python/generate_stubs.py --check    # exit 1 if the committed stubs are out of date

Run it after every change to proto/toolgate/v1/toolgate.proto, with the
grpcio-tools pinned in tests/python/requirements.txt (its bundled protoc
decides the generated text). protoc writes `toolgate/v1/toolgate_pb2*.py`;
the stubs are moved into the `toolgate_client` package and the one absolute
import between them (`from toolgate.v1 import toolgate_pb2`) is rewritten to
`from toolgate_client import toolgate_pb2`, and the module the message
classes name (`toolgate.v1.toolgate_pb2`, which pickle would import) to
`toolgate_client.toolgate_pb2`, so that the package owns no top-level
`toolgate` name. The descriptor keeps its file name
`toolgate/v1/toolgate.proto`, the name the server's reflection serves.
"""

import argparse
import pathlib
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
PROTO_ROOT = REPO / "proto"
PROTO_FILE = "toolgate/v1/toolgate.proto"
PACKAGE = HERE / "src" / "toolgate_client"
STUBS = ("toolgate_pb2.py", "toolgate_pb2.pyi", "toolgate_pb2_grpc.py")
GENERATED_IMPORT = "from toolgate.v1 import toolgate_pb2 as"
PACKAGE_IMPORT = "from toolgate_client import toolgate_pb2 as"
# The module the message classes say they live in (pickle imports it).
GENERATED_MODULE = "(DESCRIPTOR, 'toolgate.v1.toolgate_pb2', _globals)"
PACKAGE_MODULE = "(DESCRIPTOR, 'toolgate_client.toolgate_pb2', _globals)"


def generate() -> dict[str, str]:
    """The stubs as protoc makes them today, import rewritten: {file name: text}."""
    import grpc_tools
    from grpc_tools import protoc

    well_known = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory(prefix="toolgate-stubs-") as out:
        code = protoc.main([
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"-I{well_known}",
            f"--python_out={out}",
            f"--pyi_out={out}",
            f"--grpc_python_out={out}",
            PROTO_FILE,
        ])
        if code != 0:
            raise SystemExit(f"generate_stubs: grpc_tools.protoc failed with exit code {code}")
        generated = pathlib.Path(out) / "toolgate" / "v1"
        stubs = {name: (generated / name).read_text(encoding="utf-8") for name in STUBS}
    grpc_stub = stubs["toolgate_pb2_grpc.py"]
    if GENERATED_IMPORT not in grpc_stub:
        raise SystemExit(f"generate_stubs: {GENERATED_IMPORT!r} not found in toolgate_pb2_grpc.py")
    stubs["toolgate_pb2_grpc.py"] = grpc_stub.replace(GENERATED_IMPORT, PACKAGE_IMPORT)
    messages = stubs["toolgate_pb2.py"]
    if GENERATED_MODULE not in messages:
        raise SystemExit(f"generate_stubs: {GENERATED_MODULE!r} not found in toolgate_pb2.py")
    stubs["toolgate_pb2.py"] = messages.replace(GENERATED_MODULE, PACKAGE_MODULE)
    return stubs


def stale(stubs: dict[str, str]) -> list[str]:
    """The committed stub files that differ from `stubs` (or are missing)."""
    return [name for name, text in stubs.items()
            if not (PACKAGE / name).is_file()
            or (PACKAGE / name).read_text(encoding="utf-8") != text]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="only compare: exit 1 when a committed stub is out of date")
    args = parser.parse_args(argv)
    stubs = generate()
    if args.check:
        out_of_date = stale(stubs)
        if out_of_date:
            print(f"generate_stubs: out of date: {', '.join(out_of_date)}; "
                  "run `python clients/python/generate_stubs.py`", file=sys.stderr)
            return 1
        return 0
    for name, text in stubs.items():
        (PACKAGE / name).write_text(text, encoding="utf-8")
        print(f"wrote {(PACKAGE / name).relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
