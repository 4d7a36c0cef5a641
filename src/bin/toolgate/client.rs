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
use tonic::transport::{Channel, Endpoint};
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
    if !url.starts_with("http://") {
        return Err(Failure::Usage(format!(
            "--server {server:?}: only http:// is supported"
        )));
    }
    Ok(url)
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

/// Connects eagerly so that an unreachable server is reported as such.
pub async fn connect(client: &ClientArgs) -> Result<(Channel, BearerAuth), Failure> {
    let auth = bearer(client)?;
    let url = server_url(&client.server)?;
    let endpoint = Endpoint::from_shared(url.clone())
        .map_err(|error| Failure::Usage(format!("--server {url:?}: {}", error_chain(&error))))?
        .connect_timeout(CONNECT_TIMEOUT);
    let channel = endpoint.connect().await.map_err(|error| {
        Failure::Connect(format!("cannot connect to {url}: {}", error_chain(&error)))
    })?;
    Ok((channel, auth))
}
