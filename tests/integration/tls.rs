//! TLS and mTLS on the gRPC listener (issue 18, item 1): handshakes from a
//! Rust client and the CLI, a client without a certificate refused,
//! credentials bound to a client certificate, reload on SIGHUP without
//! dropping connections, and plaintext off loopback refused. Every
//! certificate is made at test time (rcgen).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use envoy_types::pb::envoy::service::auth::v3::attribute_context::{
    HttpRequest, Request as AttributeRequest,
};
use envoy_types::pb::envoy::service::auth::v3::authorization_client::AuthorizationClient;
use envoy_types::pb::envoy::service::auth::v3::{AttributeContext, CheckRequest};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, SanType,
};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tonic::Code;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::support::pb;
use crate::support::pb::approvals_client::ApprovalsClient;
use crate::support::pb::policy_decision_point_client::PolicyDecisionPointClient;
use crate::support::policies::decide_text;
use crate::support::tokens::{HOST, digest};
use crate::support::{
    EPOCH, Engine, Listeners, ManualClock, Policy, ServeOptions, ServerTls, authed, read_balance,
    reload, serve_with_options, spawn,
};
use toolgate::domain::policy::Serving;

/// A certificate authority made for one test.
struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its key, as PEM.
struct Leaf {
    cert: String,
    key: String,
}

impl TestCa {
    fn new(name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().expect("ca key");
        TestCa {
            issuer: CertifiedIssuer::self_signed(params, key).expect("ca certificate"),
        }
    }

    fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// The server's certificate: `localhost` and 127.0.0.1.
    fn server(&self) -> Leaf {
        let mut params = CertificateParams::new(vec!["localhost".to_string()]).expect("params");
        params
            .subject_alt_names
            .push(SanType::IpAddress("127.0.0.1".parse().expect("ip")));
        params
            .distinguished_name
            .push(DnType::CommonName, "toolgate");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(params)
    }

    /// A client certificate with subject `O=Toolgate Tests,CN=<common_name>`
    /// (RFC 4514, as `openssl x509 -subject -nameopt RFC2253` prints it)
    /// and, when given, a URI SAN.
    fn client(&self, common_name: &str, uri: Option<&str>) -> Leaf {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params
            .distinguished_name
            .push(DnType::OrganizationName, "Toolgate Tests");
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        if let Some(uri) = uri {
            params
                .subject_alt_names
                .push(SanType::URI(uri.try_into().expect("ia5 uri")));
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params)
    }

    fn sign(&self, params: CertificateParams) -> Leaf {
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.issuer).expect("sign");
        Leaf {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }
}

const HOST_CERT_URI: &str = "spiffe://toolgate.test/host/cert-only";
const REVIEWER_CERT_URI: &str = "spiffe://toolgate.test/reviewer/bob";

/// decide.toml with two more host credentials: `cert-host`, a client
/// certificate alone (by URI SAN), and `bound-host`, a token bound to a
/// certificate by subject; a reviewer credential for `bob` that is a
/// client certificate alone; then `tls_section` (decide.toml has no
/// `[server]`, so `[server.tls]` may come last).
fn mtls_policy_text(tls_section: &str) -> String {
    decide_text(&format!(
        "[[credentials]]\nkind = \"host\"\nidentity = \"cert-host\"\nactors = [\"payer\"]\n\
         client_identity = \"{HOST_CERT_URI}\"\n\n\
         [[credentials]]\nkind = \"host\"\nidentity = \"bound-host\"\nactors = [\"payer\"]\n\
         sha256 = \"{bound}\"\nclient_identity = \"O=Toolgate Tests,CN=bound-host\"\n\n\
         [[credentials]]\nkind = \"reviewer\"\nidentity = \"bob\"\n\
         client_identity = \"{REVIEWER_CERT_URI}\"\n\n\
         {tls_section}",
        bound = digest("bound-host-secret"),
    ))
}

/// The files of one TLS test: certificates in a temporary directory, the
/// policy file beside them naming them by relative paths.
struct Files {
    directory: tempfile::TempDir,
}

impl Files {
    fn new() -> Files {
        Files {
            directory: tempfile::tempdir().expect("temp dir"),
        }
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.directory.path().join(name);
        std::fs::write(&path, text).expect("write");
        path
    }

    fn path(&self, name: &str) -> PathBuf {
        self.directory.path().join(name)
    }

    fn dir(&self) -> &Path {
        self.directory.path()
    }
}

/// A server in this process on 127.0.0.1:0 serving the policy file at
/// `policy_path` (its `[server.tls]` loaded by the library).
struct TlsServer {
    addr: SocketAddr,
    /// `--ext-authz-listen`'s address, when it was started with one.
    ext_authz: Option<SocketAddr>,
    engine: Engine,
    tls: ServerTls,
    shutdown: Option<oneshot::Sender<()>>,
}

/// How `server` serves, as `serve` would tell a reload.
fn serving(server: &TlsServer) -> Serving {
    Serving {
        listen: server.addr,
        ext_authz_listener: server.ext_authz.is_some(),
        mutual_tls: server.tls.mutual(),
    }
}

impl TlsServer {
    async fn start(policy_path: &Path) -> TlsServer {
        TlsServer::start_with(policy_path, false).await
    }

    /// [`TlsServer::start`], with an ext_authz listener when asked.
    async fn start_with(policy_path: &Path, ext_authz: bool) -> TlsServer {
        let policy = Policy::load(policy_path).expect("policy loads");
        let files = policy.server.tls.clone().expect("[server.tls]");
        let tls = ServerTls::load(files).expect("tls loads");
        let engine =
            Engine::new(policy, Arc::new(ManualClock::starting_at(EPOCH))).expect("engine");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let ext_authz_listener = match ext_authz {
            true => Some(TcpListener::bind("127.0.0.1:0").await.expect("bind")),
            false => None,
        };
        let ext_authz =
            (ext_authz_listener.as_ref()).map(|listener| listener.local_addr().expect("addr"));
        let (shutdown, stopped) = oneshot::channel::<()>();
        let options = ServeOptions {
            tls: Some(tls.clone()),
            ..ServeOptions::default()
        };
        let served_engine = engine.clone();
        tokio::spawn(async move {
            serve_with_options(
                Listeners {
                    grpc: listener,
                    metrics: None,
                    ext_authz: ext_authz_listener,
                },
                served_engine,
                options,
                async {
                    let _ = stopped.await;
                },
            )
            .await
            .expect("server runs");
        });
        TlsServer {
            addr,
            ext_authz,
            engine,
            tls,
            shutdown: Some(shutdown),
        }
    }

    /// A connected channel over TLS trusting `ca`, with a client
    /// certificate when given.
    async fn connect(&self, ca: &str, client: Option<&Leaf>) -> Result<Channel, String> {
        connect_to(self.addr, ca, client).await
    }
}

/// A connected channel to `addr` over TLS trusting `ca`, with a client
/// certificate when given.
async fn connect_to(addr: SocketAddr, ca: &str, client: Option<&Leaf>) -> Result<Channel, String> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("localhost");
    if let Some(client) = client {
        tls = tls.identity(Identity::from_pem(&client.cert, &client.key));
    }
    Endpoint::from_shared(format!("https://{addr}"))
        .expect("endpoint")
        .tls_config(tls)
        .expect("tls config")
        .connect()
        .await
        .map_err(|error| format!("{error:?}"))
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
    }
}

/// Decide `read_balance` for payer with `token` ("" for none).
async fn decide(channel: &Channel, token: &str, call_id: &str) -> Result<String, tonic::Status> {
    PolicyDecisionPointClient::new(channel.clone())
        .decide(authed(read_balance(call_id), token))
        .await
        .map(|answer| answer.into_inner().reason)
}

/// A server with TLS (no client CA); its files and CA.
async fn tls_only() -> (Files, TestCa, TlsServer) {
    let files = Files::new();
    let ca = TestCa::new("toolgate test CA");
    let server = ca.server();
    files.write("server.pem", &server.cert);
    files.write("server.key", &server.key);
    let policy = files.write(
        "policy.toml",
        &decide_text("[server.tls]\ncert = \"server.pem\"\nkey = \"server.key\"\n"),
    );
    let served = TlsServer::start(&policy).await;
    (files, ca, served)
}

/// A server with mTLS: client certificates must chain to `clients`.
async fn mtls() -> (Files, TestCa, TestCa, TlsServer) {
    mtls_with("", false).await
}

/// [`mtls`], with `extra` in the policy before `[server.tls]`, and an
/// ext_authz listener when asked.
async fn mtls_with(extra: &str, ext_authz: bool) -> (Files, TestCa, TestCa, TlsServer) {
    let files = Files::new();
    let ca = TestCa::new("toolgate test CA");
    let clients = TestCa::new("toolgate client CA");
    let server = ca.server();
    files.write("server.pem", &server.cert);
    files.write("server.key", &server.key);
    files.write("clients.pem", &clients.pem());
    let policy = files.write(
        "policy.toml",
        &mtls_policy_text(&format!(
            "{extra}[server.tls]\ncert = \"server.pem\"\nkey = \"server.key\"\nclient_ca = \"clients.pem\"\n",
        )),
    );
    let served = TlsServer::start_with(&policy, ext_authz).await;
    (files, ca, clients, served)
}

#[tokio::test]
async fn a_tls_handshake_serves_calls_and_plaintext_is_not_spoken() {
    let (_files, ca, server) = tls_only().await;
    let channel = server.connect(&ca.pem(), None).await.expect("tls connect");
    assert_eq!(
        decide(&channel, HOST, "c1").await.expect("allowed"),
        "allowed"
    );

    // A plaintext HTTP/2 client gets no answer from the TLS listener.
    let plaintext = Endpoint::from_shared(format!("http://{}", server.addr))
        .expect("endpoint")
        .connect()
        .await;
    if let Ok(channel) = plaintext {
        let status = decide(&channel, HOST, "c2").await.expect_err("refused");
        assert_ne!(status.code(), Code::Ok, "{status:?}");
    }
    // A client that does not trust the server's CA refuses it.
    let stranger = TestCa::new("another CA");
    let refused = server.connect(&stranger.pem(), None).await;
    assert!(
        refused.is_err(),
        "a server signed by an unknown CA is refused"
    );
}

#[tokio::test]
async fn mtls_refuses_a_client_without_a_certificate_or_with_an_unknown_ca() {
    let (_files, ca, clients, server) = mtls().await;
    // Without a certificate: the handshake fails (TLS 1.3 reports it on
    // the first read, so the call fails, if the connect did not).
    match server.connect(&ca.pem(), None).await {
        Err(error) => assert!(error.contains("CertificateRequired"), "{error}"),
        Ok(channel) => {
            let status = decide(&channel, HOST, "c1").await.expect_err("refused");
            assert!(
                format!("{status:?}").contains("CertificateRequired"),
                "{status:?}"
            );
        }
    }
    // A certificate from another CA is refused the same way.
    let stranger = TestCa::new("stranger CA").client("cert-host", Some(HOST_CERT_URI));
    match server.connect(&ca.pem(), Some(&stranger)).await {
        Err(error) => assert!(error.contains("UnknownCA"), "{error}"),
        Ok(channel) => {
            let status = decide(&channel, HOST, "c2").await.expect_err("refused");
            assert!(format!("{status:?}").contains("UnknownCA"), "{status:?}");
        }
    }
    // With a certificate of the client CA, the plain token works as before.
    let anyone = clients.client("anyone", None);
    let channel = server
        .connect(&ca.pem(), Some(&anyone))
        .await
        .expect("mtls");
    assert_eq!(
        decide(&channel, HOST, "c3").await.expect("allowed"),
        "allowed"
    );
}

#[tokio::test]
async fn a_credential_bound_to_a_client_certificate() {
    let (_files, ca, clients, server) = mtls().await;

    // The certificate alone is cert-host's credential (URI SAN).
    let cert_host = clients.client("cert-host", Some(HOST_CERT_URI));
    let channel = server
        .connect(&ca.pem(), Some(&cert_host))
        .await
        .expect("mtls");
    assert_eq!(
        decide(&channel, "", "c1").await.expect("allowed"),
        "allowed"
    );

    // A certificate that names no credential, without a token: refused.
    let nobody = clients.client("nobody", Some("spiffe://toolgate.test/host/nobody"));
    let channel = server
        .connect(&ca.pem(), Some(&nobody))
        .await
        .expect("mtls");
    let status = decide(&channel, "", "c2").await.expect_err("refused");
    assert_eq!(status.code(), Code::Unauthenticated);

    // bound-host's token needs bound-host's certificate (by subject).
    let status = decide(&channel, "bound-host-secret", "c3")
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::Unauthenticated);
    assert_eq!(
        status.message(),
        "this token is bound to a client certificate the connection did not present (mTLS)"
    );
    let bound = clients.client("bound-host", None);
    let channel = server.connect(&ca.pem(), Some(&bound)).await.expect("mtls");
    assert_eq!(
        decide(&channel, "bound-host-secret", "c4")
            .await
            .expect("allowed"),
        "allowed"
    );
    // ... and bound-host's certificate without the token is not enough
    // (the credential has a token: it is not a certificate-only one).
    let status = decide(&channel, "", "c5").await.expect_err("refused");
    assert_eq!(status.code(), Code::Unauthenticated);

    // A reviewer credential may be a certificate too: bob's reaches the
    // Approvals API, and a host's certificate does not.
    let list = |channel: Channel| async move {
        ApprovalsClient::new(channel)
            .list_approvals(pb::ListApprovalsRequest::default())
            .await
            .map(|page| page.into_inner().approvals.len())
    };
    let bob = clients.client("bob", Some(REVIEWER_CERT_URI));
    let channel = server.connect(&ca.pem(), Some(&bob)).await.expect("mtls");
    assert_eq!(list(channel.clone()).await.expect("listed"), 0);
    // ... and a reviewer's certificate is no host's.
    let status = decide(&channel, "", "c6").await.expect_err("refused");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    let channel = server
        .connect(&ca.pem(), Some(&cert_host))
        .await
        .expect("mtls");
    let status = list(channel).await.expect_err("refused");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
}

/// The ext_authz listener takes no token: when the host it acts as is
/// bound to a client certificate, only a connection that presented it is
/// that host (any pod that reached the port was).
#[tokio::test]
async fn the_ext_authz_listener_needs_its_hosts_client_certificate() {
    let (_files, ca, clients, served) = mtls_with(
        "[ext_authz]\nactor_header = \"x-agent\"\nsession_header = \"mcp-session-id\"\n\
         workspace = \"acme\"\nhost_credential = \"bound-host\"\n\n",
        true,
    )
    .await;
    let address = served.ext_authz.expect("the ext_authz listener");
    let check = |channel: Channel| async move {
        let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "read_balance", "arguments": {}}});
        let headers = [
            (":method", "POST"),
            (":path", "/mcp"),
            ("content-type", "application/json"),
            ("x-agent", "payer"),
            ("mcp-session-id", "s1"),
        ];
        let http = HttpRequest {
            method: "POST".into(),
            path: "/mcp".into(),
            headers: (headers.iter())
                .map(|(key, value)| (key.to_string(), value.to_string()))
                .collect(),
            body: body.to_string(),
            ..HttpRequest::default()
        };
        let request = CheckRequest {
            attributes: Some(AttributeContext {
                request: Some(AttributeRequest {
                    http: Some(http),
                    ..AttributeRequest::default()
                }),
                ..AttributeContext::default()
            }),
        };
        AuthorizationClient::new(channel)
            .check(request)
            .await
            .map(|answer| answer.into_inner().status.map(|status| status.code))
    };
    let nobody = clients.client("nobody", Some("spiffe://toolgate.test/host/nobody"));
    let channel = connect_to(address, &ca.pem(), Some(&nobody))
        .await
        .expect("mtls");
    let refused = check(channel).await.expect_err("refused");
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    assert!(
        refused.message().contains("client certificate"),
        "{refused:?}"
    );
    let bound = clients.client("bound-host", None);
    let channel = connect_to(address, &ca.pem(), Some(&bound))
        .await
        .expect("mtls");
    assert_eq!(check(channel).await.expect("answered"), Some(0), "OK");
}

#[tokio::test]
async fn a_bound_credential_is_refused_without_mtls_at_load() {
    let files = Files::new();
    let policy = files.write(
        "policy.toml",
        &mtls_policy_text("[server.tls]\ncert = \"server.pem\"\nkey = \"server.key\"\n"),
    );
    let error = Policy::load(&policy).expect_err("refused");
    assert_eq!(error.key, "server.tls.client_ca");
    assert!(error.message.contains("need mTLS"), "{}", error.message);
}

#[tokio::test]
async fn sighup_reload_swaps_the_certificate_without_dropping_connections() {
    let (files, first_ca, server) = tls_only().await;
    let old = server
        .connect(&first_ca.pem(), None)
        .await
        .expect("connect");
    assert_eq!(decide(&old, HOST, "c1").await.expect("allowed"), "allowed");

    // A key that does not load: the reload fails, everything is kept.
    files.write(
        "server.key",
        "-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n",
    );
    let policy_path = files.path("policy.toml");
    let failed = reload::reload_with_tls(
        &server.engine,
        Some(&policy_path),
        serving(&server),
        Some(&server.tls),
    )
    .await
    .expect_err("a bad key fails the reload");
    assert!(failed.contains("server.key"), "{failed}");
    let kept = server
        .connect(&first_ca.pem(), None)
        .await
        .expect("old certificate kept");
    assert_eq!(decide(&kept, HOST, "c2").await.expect("allowed"), "allowed");

    // A new certificate from another CA: new connections get it.
    let second_ca = TestCa::new("rotated CA");
    let rotated = second_ca.server();
    files.write("server.pem", &rotated.cert);
    files.write("server.key", &rotated.key);
    reload::reload_with_tls(
        &server.engine,
        Some(&policy_path),
        serving(&server),
        Some(&server.tls),
    )
    .await
    .expect("reloaded");
    let new = server
        .connect(&second_ca.pem(), None)
        .await
        .expect("new certificate");
    assert_eq!(decide(&new, HOST, "c3").await.expect("allowed"), "allowed");
    assert!(
        server.connect(&first_ca.pem(), None).await.is_err(),
        "the old certificate is no longer served"
    );
    // The connections opened before the reload still work.
    assert_eq!(decide(&old, HOST, "c4").await.expect("allowed"), "allowed");
    assert_eq!(decide(&kept, HOST, "c5").await.expect("allowed"), "allowed");
    drop(files);
}

/// `toolgate serve --tls-cert … --tls-client-ca …` as a process, and the
/// CLI over https with `--ca`, `--cert`, `--key`: the certificate alone
/// (cert-host) reads a resource; without `--cert` the call is refused.
#[tokio::test]
async fn the_cli_speaks_https_and_mtls_to_a_served_process() {
    let files = Files::new();
    let ca = TestCa::new("toolgate test CA");
    let clients = TestCa::new("toolgate client CA");
    let server = ca.server();
    let cert = files.write("server.pem", &server.cert);
    let key = files.write("server.key", &server.key);
    let client_ca = files.write("clients.pem", &clients.pem());
    let ca_path = files.write("ca.pem", &ca.pem());
    let cert_host = clients.client("cert-host", Some(HOST_CERT_URI));
    let client_cert = files.write("client.pem", &cert_host.cert);
    let client_key = files.write("client.key", &cert_host.key);
    let served = spawn::Serve::new(&mtls_policy_text(""))
        .args(&["--tls-cert"])
        .args(&[cert.to_str().expect("utf-8")])
        .args(&["--tls-key", key.to_str().expect("utf-8")])
        .args(&["--tls-client-ca", client_ca.to_str().expect("utf-8")])
        .start();
    let url = format!("https://localhost:{}", served.addr.port());
    let run = move |with_certificate: bool| {
        let mut command = spawn::command();
        command
            .args([
                "resource", "list", "--output", "json", "--server", &url, "--ca",
            ])
            .arg(&ca_path);
        if with_certificate {
            command
                .arg("--cert")
                .arg(&client_cert)
                .arg("--key")
                .arg(&client_key);
        }
        command.output().expect("run toolgate")
    };
    let (with, without) = tokio::task::spawn_blocking(move || (run(true), run(false)))
        .await
        .expect("join");
    assert_eq!(
        with.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&with.stderr)
    );
    // decide.toml declares no resources: an empty list, in JSON.
    assert_eq!(String::from_utf8_lossy(&with.stdout).trim(), "{}");
    assert_ne!(
        without.status.code(),
        Some(0),
        "no client certificate: refused"
    );
    let _ = served.stop();
    assert!(files.dir().exists());
}

#[tokio::test]
async fn plaintext_off_loopback_needs_tls_or_the_mesh_acknowledgement() {
    let policy_dir = Files::new();
    let policy = policy_dir.write("policy.toml", &decide_text(""));
    let output = tokio::task::spawn_blocking(move || {
        spawn::command()
            .args([
                "serve",
                "--store",
                "memory",
                "--listen",
                "0.0.0.0:0",
                "--config",
            ])
            .arg(&policy)
            .output()
            .expect("run toolgate")
    })
    .await
    .expect("join");
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("refusing to serve plaintext on the non-loopback address 0.0.0.0:0"),
        "{stderr}"
    );

    // Acknowledged: it serves (the address it prints is the proof).
    let mut acknowledged = spawn::Serve::new(&decide_text(""))
        .listen("0.0.0.0:0")
        .args(&["--insecure-plaintext-behind-mesh"])
        .start();
    assert_ne!(acknowledged.addr.port(), 0);
    acknowledged.kill();
}

/// `serve` with these arguments after `--config POLICY`, expected to exit
/// 1 before it listens: its stderr.
async fn refused_start(policy_text: &str, args: &[&str]) -> String {
    let policy_dir = Files::new();
    let policy = policy_dir.write("policy.toml", policy_text);
    let args: Vec<String> = args.iter().map(|arg| arg.to_string()).collect();
    let output = tokio::task::spawn_blocking(move || {
        spawn::command()
            .args(["serve", "--store", "memory", "--config"])
            .arg(&policy)
            .args(&args)
            .output()
            .expect("run toolgate")
    })
    .await
    .expect("join");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    stderr
}

/// The ext_authz listener takes Checks with no token, acting as the host
/// credential: off loopback it needs TLS or the mesh's acknowledgement as
/// much as the gRPC listener does (it used to serve plaintext on any
/// address).
#[tokio::test]
async fn an_ext_authz_listener_off_loopback_needs_tls_or_the_mesh_acknowledgement() {
    let policy =
        decide_text("[ext_authz]\nactor_header = \"x-agent\"\nhost_credential = \"agent-host\"\n");
    let stderr = refused_start(
        &policy,
        &["--listen", "127.0.0.1:0", "--ext-authz-listen", "0.0.0.0:0"],
    )
    .await;
    assert!(
        stderr.contains(
            "refusing to serve plaintext on the non-loopback address 0.0.0.0:0 (--ext-authz-listen)"
        ),
        "{stderr}"
    );
    let mut acknowledged = spawn::Serve::new(&policy)
        .args(&[
            "--ext-authz-listen",
            "0.0.0.0:0",
            "--insecure-plaintext-behind-mesh",
        ])
        .start();
    assert_ne!(acknowledged.addr.port(), 0);
    acknowledged.kill();
}

/// `--tls-cert`/`--tls-key` replace `[server.tls]`: without
/// `--tls-client-ca` they would drop the policy's client CA, and with it
/// the requirement of client certificates, so they are refused.
#[tokio::test]
async fn tls_flags_do_not_drop_the_policys_client_ca() {
    let policy = decide_text(
        "[server.tls]\ncert = \"server.pem\"\nkey = \"server.key\"\nclient_ca = \"clients.pem\"\n",
    );
    let stderr = refused_start(
        &policy,
        &["--tls-cert", "other.pem", "--tls-key", "other.key"],
    )
    .await;
    assert!(stderr.contains("give --tls-client-ca too"), "{stderr}");
}

#[test]
fn client_identity_and_server_tls_are_validated_naming_the_key() {
    let refused = |extra: &str| {
        let error = Policy::parse(
            &decide_text(extra),
            "policy.toml",
            Some(Path::new("/etc/toolgate")),
        )
        .expect_err("refused");
        (error.key, error.message)
    };
    let (key, message) = refused(
        "[[credentials]]\nkind = \"host\"\nidentity = \"h\"\nactors = [\"payer\"]\n\
         client_identity = \"CN=h, O=Example\"\n",
    );
    assert_eq!(key, "credentials[6].client_identity");
    assert!(message.contains("no spaces around `,`"), "{message}");
    let (key, _) = refused(
        "[[credentials]]\nkind = \"host\"\nidentity = \"h\"\nactors = [\"payer\"]\n\
         client_identity = \"spiffe://a/b\"\n\n\
         [[credentials]]\nkind = \"host\"\nidentity = \"i\"\nactors = [\"payer\"]\n\
         client_identity = \"spiffe://a/b\"\n",
    );
    assert_eq!(key, "credentials[7].client_identity");
    let (key, _) = refused("[server.tls]\ncert = \"server.pem\"\n");
    assert_eq!(key, "server.tls");
    let (key, message) = refused("[server.tls]\ncert = \"\"\nkey = \"k.pem\"\n");
    assert_eq!(
        (key.as_str(), message.as_str()),
        ("server.tls.cert", "must be a file path")
    );
    // Relative paths resolve against the policy file's folder.
    let policy = Policy::parse(
        &decide_text("[server.tls]\ncert = \"a/server.pem\"\nkey = \"/abs/server.key\"\n"),
        "policy.toml",
        Some(Path::new("/etc/toolgate")),
    )
    .expect("valid");
    let tls = policy.server.tls.expect("[server.tls]");
    assert_eq!(tls.cert, Path::new("/etc/toolgate/a/server.pem"));
    assert_eq!(tls.key, Path::new("/abs/server.key"));
    assert_eq!(tls.client_ca, None);
}
