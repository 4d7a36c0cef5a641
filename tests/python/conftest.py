"""Shared fixtures: the toolgate binary, generated gRPC stubs, and a real
`toolgate serve` process on 127.0.0.1:0 (its bound address is read from the
line it prints on stdout, so no port is guessed and nothing sleeps)."""

import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
GEN = REPO / "tests" / "python" / "gen"


def toolgate_bin() -> str:
    return os.environ.get("TOOLGATE_BIN", str(REPO / "target" / "debug" / "toolgate"))


def _generate_stubs() -> None:
    from grpc_tools import protoc
    import grpc_tools

    GEN.mkdir(parents=True, exist_ok=True)
    well_known = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    code = protoc.main([
        "grpc_tools.protoc",
        f"-I{REPO / 'proto'}",
        f"-I{well_known}",
        f"--python_out={GEN}",
        f"--grpc_python_out={GEN}",
        str(REPO / "proto" / "toolgate" / "v1" / "toolgate.proto"),
    ])
    if code != 0:
        raise RuntimeError(f"protoc failed with {code}")
    for package in (GEN / "toolgate", GEN / "toolgate" / "v1"):
        (package / "__init__.py").touch()


@pytest.fixture(scope="session")
def pb():
    """The generated modules: (toolgate_pb2, toolgate_pb2_grpc)."""
    _generate_stubs()
    if str(GEN) not in sys.path:
        sys.path.insert(0, str(GEN))
    from toolgate.v1 import toolgate_pb2, toolgate_pb2_grpc

    return toolgate_pb2, toolgate_pb2_grpc


class Server:
    def __init__(self, policy_path: pathlib.Path | None, extra_args=()):
        args = [toolgate_bin(), "serve", "--listen", "127.0.0.1:0", *extra_args]
        if policy_path is not None:
            args += ["--config", str(policy_path)]
        self.process = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        line = self.process.stdout.readline()
        if not line.startswith("toolgate listening on "):
            self.process.kill()
            _, stderr = self.process.communicate(timeout=10)
            raise RuntimeError(f"toolgate did not start: {line!r} {stderr}")
        self.address = line.rsplit(" ", 1)[1].strip()

    def stop(self) -> str:
        self.process.terminate()
        try:
            _, stderr = self.process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            _, stderr = self.process.communicate()
        return stderr


@pytest.fixture
def start_server(tmp_path):
    """start_server(policy_text) -> Server; stopped at the end of the test."""
    started = []

    def start(policy_text: str | None, extra_args=()):
        policy_path = None
        if policy_text is not None:
            policy_path = tmp_path / "policy.toml"
            policy_path.write_text(policy_text)
        server = Server(policy_path, extra_args)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
