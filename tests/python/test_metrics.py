"""The /metrics exposition read by Prometheus's own Python parser
(prometheus_client.parser), as a scraper would: every family has HELP and
TYPE, the conventional gRPC server families appear once a call was made,
an idle scrape stays under 50 KB, and gzip is served when asked."""

import gzip
import urllib.request

import grpc
from prometheus_client.parser import text_string_to_metric_families


def scrape(address: str, accept_gzip: bool = False) -> tuple[str, bytes, dict]:
    request = urllib.request.Request(f"http://{address}/metrics")
    if accept_gzip:
        request.add_header("Accept-Encoding", "gzip")
    with urllib.request.urlopen(request, timeout=10) as response:
        headers = {name.lower(): value for name, value in response.headers.items()}
        return response.status, response.read(), headers


def families(text: str) -> dict:
    parsed = {family.name: family for family in text_string_to_metric_families(text)}
    for name, family in parsed.items():
        assert family.documentation, f"{name} has no HELP"
        assert family.type != "unknown", f"{name} has no TYPE"
    return parsed


def test_metrics_parse_with_prometheus_client(start_server):
    server = start_server(None, ["--metrics-listen", "127.0.0.1:0"])
    line = server.process.stdout.readline()
    assert line.startswith("toolgate metrics on "), line
    metrics_address = line.rsplit(" ", 1)[1].strip()

    status, body, _ = scrape(metrics_address)
    assert status == 200
    assert len(body) <= 50 * 1024, len(body)
    idle = families(body.decode())
    # prometheus_client names a counter family without its `_total`.
    for name in [
        "toolgate_build_info",
        "toolgate_config_last_reload_successful",
        "toolgate_config_last_reload_success_timestamp_seconds",
        "toolgate_decisions",
        "process_cpu_seconds",
        "process_resident_memory_bytes",
        "process_open_fds",
    ]:
        assert name in idle, name
    build = idle["toolgate_build_info"].samples[0]
    assert set(build.labels) == {"version", "commit"}
    assert "grpc_server_handled" not in idle

    # One health check (open to every caller), then the gRPC families.
    with grpc.insecure_channel(server.address) as channel:
        check = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=lambda message: message,
            response_deserializer=lambda message: message,
        )
        check(b"", timeout=10)
    _, body, _ = scrape(metrics_address)
    busy = families(body.decode())
    assert busy["grpc_server_handling_seconds"].type == "histogram"
    handled = [
        sample
        for sample in busy["grpc_server_handled"].samples
        if sample.name == "grpc_server_handled_total"
    ]
    assert [sample.labels for sample in handled] == [
        {
            "grpc_service": "grpc.health.v1.Health",
            "grpc_method": "Check",
            "grpc_type": "unary",
            "grpc_code": "OK",
        }
    ]
    assert handled[0].value == 1.0

    status, compressed, headers = scrape(metrics_address, accept_gzip=True)
    assert status == 200
    assert headers.get("content-encoding") == "gzip", headers
    assert set(families(gzip.decompress(compressed).decode())) == set(busy)
