"""TLS and mTLS from Python (grpcio `ssl_channel_credentials`) against a real
`toolgate serve --tls-cert … --tls-client-ca …`, with certificates made at
test time (`cryptography`): a handshake and a call, a client without a
certificate refused, and a host credential that is the client certificate
alone (by SPIFFE URI SAN), through the `toolgate_client` package too."""

import datetime
import ipaddress
import os
import subprocess
import sys

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from conftest import REPO

POLICY = REPO / "tests" / "fixtures" / "decide.toml"
HOST_URI = "spiffe://toolgate.test/host/python"
CERT_HOST = f"""
[[credentials]]
kind = "host"
identity = "python-cert-host"
actors = ["payer"]
client_identity = "{HOST_URI}"
"""


def _name(common_name):
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _certificate(subject, issuer_name, public_key, signing_key, *, ca=False, sans=(), usage=None):
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder()
               .subject_name(subject).issuer_name(issuer_name).public_key(public_key)
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    if usage:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if ca:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False,
            encipher_only=False, decipher_only=False), critical=True)
    return builder.sign(signing_key, hashes.SHA256())


def _pem(certificate):
    return certificate.public_bytes(serialization.Encoding.PEM)


def _key_pem(key):
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


@pytest.fixture
def pki(tmp_path):
    """A CA, the server's certificate for localhost/127.0.0.1 and a client
    certificate with a SPIFFE URI SAN, written to `tmp_path`."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate(_name("python test CA"), _name("python test CA"), ca_key.public_key(),
                      ca_key, ca=True)
    files = {"ca": tmp_path / "ca.pem"}
    files["ca"].write_bytes(_pem(ca))
    for role, sans, usage in (
            ("server", [x509.DNSName("localhost"),
                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
             ExtendedKeyUsageOID.SERVER_AUTH),
            ("client", [x509.UniformResourceIdentifier(HOST_URI)],
             ExtendedKeyUsageOID.CLIENT_AUTH)):
        key = ec.generate_private_key(ec.SECP256R1())
        certificate = _certificate(_name(f"python-{role}"), ca.subject, key.public_key(), ca_key,
                                   sans=sans, usage=usage)
        files[role] = tmp_path / f"{role}.pem"
        files[role].write_bytes(_pem(certificate))
        files[f"{role}_key"] = tmp_path / f"{role}.key"
        files[f"{role}_key"].write_bytes(_key_pem(key))
    return files


@pytest.fixture
def mtls_server(start_server, pki):
    policy = POLICY.read_text().replace(
        'manifest = "../../examples/manifests/docs-search.json"',
        f'manifest = "{REPO / "examples" / "manifests" / "docs-search.json"}"')
    return start_server(policy + CERT_HOST, [
        "--store", "memory",
        "--tls-cert", str(pki["server"]), "--tls-key", str(pki["server_key"]),
        "--tls-client-ca", str(pki["ca"])])


def _channel(server, pki, *, with_certificate):
    port = server.address.rsplit(":", 1)[1]
    credentials = grpc.ssl_channel_credentials(
        root_certificates=pki["ca"].read_bytes(),
        private_key=pki["client_key"].read_bytes() if with_certificate else None,
        certificate_chain=pki["client"].read_bytes() if with_certificate else None)
    return grpc.secure_channel(f"localhost:{port}", credentials)


def _read_balance(pb2, call_id):
    return pb2.DecideRequest(
        session=pb2.Session(actor="payer", session_id="s1", workspace="acme"),
        proposal=pb2.Proposal(call_id=call_id, actor="payer", name="read_balance", version=0,
                              arguments_json="{}"))


def test_mtls_handshake_and_a_certificate_as_the_credential(pb, mtls_server, pki):
    pb2, pb2_grpc = pb
    with _channel(mtls_server, pki, with_certificate=True) as channel:
        pdp = pb2_grpc.PolicyDecisionPointStub(channel)
        # No token: the client certificate (its URI SAN) is the credential.
        answer = pdp.Decide(_read_balance(pb2, "c1"), timeout=10)
        assert answer.reason == "allowed"
        # A token the policy does not know is still refused.
        with pytest.raises(grpc.RpcError) as refused:
            pdp.Decide(_read_balance(pb2, "c2"), timeout=10,
                       metadata=[("authorization", "Bearer unknown-token")])
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_mtls_refuses_a_client_without_a_certificate(pb, mtls_server, pki):
    pb2, pb2_grpc = pb
    with _channel(mtls_server, pki, with_certificate=False) as channel:
        pdp = pb2_grpc.PolicyDecisionPointStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            pdp.Decide(_read_balance(pb2, "c1"), timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


def test_the_client_package_speaks_https(mtls_server, pki):
    sys.path.insert(0, str(REPO / "clients" / "python" / "src"))
    import toolgate_client

    port = mtls_server.address.rsplit(":", 1)[1]
    with toolgate_client.Host(f"https://localhost:{port}", actor="payer", workspace="acme",
                              ca=str(pki["ca"]), cert=str(pki["client"]),
                              key=str(pki["client_key"])) as host:
        proposal = host.propose("read_balance", {}, version=0)
        assert host.decide(proposal).reason == "allowed"
    with pytest.raises(ValueError):
        toolgate_client.open_channel(f"localhost:{port}", ca=str(pki["ca"]))


@pytest.mark.parametrize("example", ["python", "node"])
def test_the_host_examples_over_mtls(pb, start_server, pki, tmp_path, example):
    """examples/python/host.py and examples/node/host.mjs --server https://…
    --ca --cert --key: the client certificate is the host credential (no
    token); the reviewer grants with the CLI over https."""
    from test_examples import PYTHON_HOST, REVIEWER_TOKEN, TICKETS, node_host, parse, script_env
    from conftest import toolgate_bin

    host = PYTHON_HOST if example == "python" else node_host()

    cert_host = CERT_HOST.replace('actors = ["payer"]', 'actors = ["learner"]')
    server = start_server(
        TICKETS.read_text().replace("open_host_api = true", "open_host_api = false") + cert_host,
        ["--store", "memory",
         "--tls-cert", str(pki["server"]), "--tls-key", str(pki["server_key"]),
         "--tls-client-ca", str(pki["ca"])])
    url = f"https://localhost:{server.address.rsplit(':', 1)[1]}"

    def grant(approval_id):
        done = subprocess.run(
            [toolgate_bin(), "approvals", "grant", approval_id, "--server", url,
             "--ca", str(pki["ca"]), "--cert", str(pki["client"]), "--key", str(pki["client_key"])],
            env={**os.environ, "TOOLGATE_TOKEN": REVIEWER_TOKEN},
            capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stdout + done.stderr

    process = subprocess.Popen(
        [str(host), "--server", url, "--timeout", "20", "--ca", str(pki["ca"]),
         "--cert", str(pki["client"]), "--key", str(pki["client_key"])],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=script_env())
    words = []
    try:
        for line in process.stdout:
            word, fields = parse(line.rstrip("\n"))
            words.append(word)
            if word == "waiting":
                grant(fields["approval_id"])
        code = process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert code == 0, f"{host.name} over mTLS exited {code}: {words} {process.stderr.read()}"
    # host.py works both tickets; host.mjs the lamp's only.
    receipts = {"python": 2, "node": 1}[example]
    assert words[-1] == "done" and words.count("receipt") == receipts, words
