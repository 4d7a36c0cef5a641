//! The connection the reviewer/operator commands (`approvals`, `pins`,
//! `resource`, `manifest assess`) share: every one builds a current-thread
//! tokio runtime, connects once and sends `authorization: Bearer <token>`
//! through an interceptor. The token is never printed.

use std::future::Future;
use std::process::ExitCode;
use std::time::Duration;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Request, Status};

use crate::args::ClientArgs;
use crate::output::{Failure, say};

/// How long to wait for the TCP + HTTP/2 connection before giving up.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// An error and its sources, `: `-separated (tonic's transport errors say
/// little at the top level).
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Runs a client command on a fresh current-thread runtime.
pub fn run<F>(future: F) -> ExitCode
where
    F: Future<Output = Result<(), Failure>>,
{
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            say(&format!("error: cannot start the runtime: {error}"));
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(future) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => failure.report(),
    }
}

/// Adds `authorization: Bearer <token>` to every request (nothing without a token).
#[derive(Clone)]
pub struct BearerAuth {
    header: Option<MetadataValue<Ascii>>,
}

impl Interceptor for BearerAuth {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(header) = &self.header {
            request
                .metadata_mut()
                .insert("authorization", header.clone());
        }
        Ok(request)
    }
}

pub type Authed = InterceptedService<Channel, BearerAuth>;

/// `--server` as a URL: `host:port` gets `http://`.
pub fn server_url(server: &str) -> Result<String, Failure> {
    let url = if server.contains("://") {
        server.to_string()
    } else {
        format!("http://{server}")
    };
    if !url.starts_with("http://") && !url.starts_with("https://") {
        return Err(Failure::Usage(format!(
            "--server {server:?}: only http:// and https:// are supported"
        )));
    }
    Ok(url)
}

/// A token is sent in plaintext only to this machine (`http://` to a
/// loopback address or `localhost`), or with `--insecure-plaintext` (a
/// mesh encrypts the hop): anyone on the path could read a reviewer's
/// token and grant with it.
fn refuse_plaintext_token(client: &ClientArgs, url: &str) -> Result<(), Failure> {
    let has_token = client
        .token
        .as_ref()
        .is_some_and(|token| !token.0.is_empty());
    if !has_token || client.insecure_plaintext || !url.starts_with("http://") {
        return Ok(());
    }
    let host = url
        .parse::<tonic::codegen::http::Uri>()
        .ok()
        .and_then(|uri| uri.host().map(str::to_owned))
        .unwrap_or_default();
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = bare.eq_ignore_ascii_case("localhost")
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|address| address.is_loopback());
    if loopback {
        return Ok(());
    }
    Err(Failure::Usage(format!(
        "--server {url}: the token would cross the network in plaintext to a host that is \
         not this machine; use https:// (with --ca), or --insecure-plaintext when a mesh \
         encrypts the connection"
    )))
}

/// A PEM file given on the command line.
fn read_pem(flag: &str, path: &std::path::Path) -> Result<Vec<u8>, Failure> {
    std::fs::read(path)
        .map_err(|error| Failure::Usage(format!("{flag} {}: {error}", path.display())))
}

/// The TLS of an `https://` server: `--ca` (else the system's roots), and
/// `--cert`/`--key` for mTLS. `--ca`, `--cert` or `--key` with `http://`
/// is refused rather than silently sent in plaintext.
fn tls_config(client: &ClientArgs, url: &str) -> Result<Option<ClientTlsConfig>, Failure> {
    let given = client.ca.is_some() || client.cert.is_some();
    if !url.starts_with("https://") {
        return match given {
            true => Err(Failure::Usage(format!(
                "--ca, --cert and --key need an https:// --server (got {url})"
            ))),
            false => Ok(None),
        };
    }
    let mut config = ClientTlsConfig::new();
    config = match &client.ca {
        Some(path) => config.ca_certificate(Certificate::from_pem(read_pem("--ca", path)?)),
        None => config.with_native_roots(),
    };
    if let (Some(cert), Some(key)) = (&client.cert, &client.key) {
        config = config.identity(Identity::from_pem(
            read_pem("--cert", cert)?,
            read_pem("--key", key)?,
        ));
    }
    Ok(Some(config))
}

/// The authorization header; the token itself never appears in an error.
pub fn bearer(client: &ClientArgs) -> Result<BearerAuth, Failure> {
    let token = match &client.token {
        Some(token) if !token.0.is_empty() => token,
        _ => return Ok(BearerAuth { header: None }),
    };
    let mut header = MetadataValue::try_from(format!("Bearer {}", token.0)).map_err(|_| {
        Failure::Usage("the token (--token or TOOLGATE_TOKEN) must be printable ASCII".into())
    })?;
    header.set_sensitive(true);
    Ok(BearerAuth {
        header: Some(header),
    })
}

/// The endpoint of `--server`, with its TLS (for `https://`), and its URL.
pub fn endpoint(client: &ClientArgs) -> Result<(Endpoint, String), Failure> {
    let url = server_url(&client.server)?;
    refuse_plaintext_token(client, &url)?;
    let mut endpoint = Endpoint::from_shared(url.clone())
        .map_err(|error| Failure::Usage(format!("--server {url:?}: {}", error_chain(&error))))?
        .connect_timeout(CONNECT_TIMEOUT);
    if let Some(tls) = tls_config(client, &url)? {
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|error| Failure::Usage(format!("tls: {}", error_chain(&error))))?;
    }
    Ok((endpoint, url))
}

/// The largest answer the commands read: a server whose
/// `max_message_bytes` is over tonic's 4 MiB default answers resource pages
/// up to that size (64 MiB at most), which `resource get` would refuse;
/// a bound still, against a server that sends without end.
pub const MAX_ANSWER_BYTES: usize = 256 * 1024 * 1024;

/// Connects eagerly so that an unreachable server is reported as such.
pub async fn connect(client: &ClientArgs) -> Result<(Channel, BearerAuth), Failure> {
    let auth = bearer(client)?;
    let (endpoint, url) = endpoint(client)?;
    let channel = endpoint.connect().await.map_err(|error| {
        Failure::Connect(format!("cannot connect to {url}: {}", error_chain(&error)))
    })?;
    Ok((channel, auth))
}
