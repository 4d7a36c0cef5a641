"""Shared fixtures: the toolgate binary, generated gRPC stubs, and a real
`toolgate serve` process on 127.0.0.1:0 (its bound address is read from the
line it prints on stdout, so no port is guessed and nothing sleeps)."""

import json
import os
import pathlib
import queue
import subprocess
import sys
import tempfile
import threading

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



def events_by_name(stderr: str) -> dict:
    """The JSON log lines on `stderr` that name an event, grouped by that name."""
    by_name = {}
    for line in stderr.splitlines():
        if line.strip():
            event = json.loads(line)
            if "event" in event:
                by_name.setdefault(event["event"], []).append(event)
    return by_name


def reap(process, watchdog) -> None:
    """Cancel `watchdog`, then kill `process` if it still runs and wait for it."""
    watchdog.cancel()
    if process.poll() is None:
        process.kill()
        process.wait()


@pytest.fixture(scope="session")
def pb():
    """The generated modules: (toolgate_pb2, toolgate_pb2_grpc)."""
    _generate_stubs()
    if str(GEN) not in sys.path:
        sys.path.insert(0, str(GEN))
    from toolgate.v1 import toolgate_pb2, toolgate_pb2_grpc

    return toolgate_pb2, toolgate_pb2_grpc


class Server:
    """A `toolgate serve` child. A thread reads its stderr (logs and audit
    lines) as it comes, so the pipe never fills: toolgate rightly stops
    taking calls when its log sink stalls."""

    def __init__(self, policy_path: pathlib.Path | None, extra_args=()):
        args = [toolgate_bin(), "serve", "--listen", "127.0.0.1:0", *extra_args]
        # The durable default, in a directory of this server's own, unless
        # the test chose a store itself.
        self._data = None
        if "--data-dir" not in extra_args and "--store" not in extra_args:
            self._data = tempfile.TemporaryDirectory(prefix="toolgate-data-")
            args += ["--data-dir", str(pathlib.Path(self._data.name) / "data")]
        if policy_path is not None:
            args += ["--config", str(policy_path)]
        self.process = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self._lines = queue.Queue()
        self._seen = []
        self._drain = threading.Thread(target=self._read_stderr, daemon=True)
        self._drain.start()
        line = self.process.stdout.readline()
        if not line.startswith("toolgate listening on "):
            self.process.kill()
            self.process.wait(timeout=10)
            self._drain.join(timeout=10)
            raise RuntimeError(f"toolgate did not start: {line!r} {''.join(self._seen)}")
        self.address = line.rsplit(" ", 1)[1].strip()

    def _read_stderr(self):
        for line in self.process.stderr:
            self._seen.append(line)
            self._lines.put(line)

    def stderr_line(self, timeout: float = 10) -> str:
        """The next line the server wrote to stderr ("" if none came in time)."""
        try:
            return self._lines.get(timeout=timeout)
        except queue.Empty:
            return ""

    def stop(self) -> str:
        """Stops the server; returns everything it wrote to stderr."""
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._drain.join(timeout=10)
        if self._data is not None:
            self._data.cleanup()
        return "".join(self._seen)


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
