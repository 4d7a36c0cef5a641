//! The measured calls' gRPC client: unary calls straight on `h2`.
//!
//! Issue 19: through tonic the load generator needed 18–21 µs of CPU per
//! Decide and about 54 µs per commit, more than the server it measures, so
//! on a small machine it, not the server, set the pace. A tonic `Channel`
//! hands every call to a worker task through a tower `Buffer` (an mpsc
//! hop), builds a `HeaderMap` and a body stream per call and encodes
//! through its codec layers. Here a call is one HTTP/2 stream opened
//! directly on the connection's `h2::client::SendRequest` (a clone per
//! caller, no task in between): a request head cloned from one made per
//! caller, the request as a single gRPC frame in one `Bytes`, the answer's
//! DATA frames reassembled and decoded, then `grpc-status` read from the
//! trailers.
//!
//! Only what a unary call to toolgate or the baseline needs: no
//! compression, streaming, retries or load balancing. Setup calls
//! (fixtures, granting approvals) still go through tonic: they are not
//! measured.

use std::future::poll_fn;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use h2::client::{ResponseFuture, SendRequest};
use http::header::{AUTHORIZATION, CONTENT_TYPE, TE};
use http::{HeaderMap, HeaderValue, Request, StatusCode, Uri};
use percent_encoding::percent_decode;
use prost::Message;
use tokio::net::TcpStream;
use tonic::{Code, Status};

use crate::BoxResult;

/// The flow-control windows hyper (under tonic) advertises by default, so
/// that the server sees the same settings as from a tonic client.
const STREAM_WINDOW: u32 = 2 * 1024 * 1024;
const CONNECTION_WINDOW: u32 = 5 * 1024 * 1024;
/// A gRPC frame's header: a compressed flag and a big-endian length.
const FRAME_HEADER: usize = 5;

/// The unary methods the load generator measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Decide,
    Dispatch,
    AssessManifest,
    /// Envoy's ext_authz `Authorization.Check`.
    Check,
}

impl Method {
    /// The HTTP/2 path, as in the generated clients.
    fn path(self) -> &'static str {
        match self {
            Method::Decide => "/toolgate.v1.PolicyDecisionPoint/Decide",
            Method::Dispatch => "/toolgate.v1.PolicyDecisionPoint/Dispatch",
            Method::AssessManifest => "/toolgate.v1.PolicyDecisionPoint/AssessManifest",
            Method::Check => "/envoy.service.auth.v3.Authorization/Check",
        }
    }
}

/// The URI of each method on one server (`http://host:port/path`: h2
/// sends `:scheme` and `:authority` from it).
#[derive(Debug, Clone)]
struct Uris {
    decide: Uri,
    dispatch: Uri,
    assess_manifest: Uri,
    check: Uri,
}

impl Uris {
    fn new(address: &str) -> BoxResult<Uris> {
        let uri = |method: Method| -> BoxResult<Uri> {
            Ok(format!("http://{address}{}", method.path()).parse()?)
        };
        Ok(Uris {
            decide: uri(Method::Decide)?,
            dispatch: uri(Method::Dispatch)?,
            assess_manifest: uri(Method::AssessManifest)?,
            check: uri(Method::Check)?,
        })
    }
}

/// One HTTP/2 connection to a server. Cheap to clone: the clones share the
/// connection, whose I/O runs in a task of its own.
#[derive(Debug, Clone)]
pub struct Connection {
    sender: SendRequest<Bytes>,
    uris: Uris,
}

impl Connection {
    /// Connects to `address` (`host:port`) with TCP_NODELAY, as tonic's
    /// `Endpoint::tcp_nodelay(true)` did, and spawns the connection's I/O.
    pub async fn open(address: &str) -> BoxResult<Connection> {
        let uris = Uris::new(address)?;
        let stream = TcpStream::connect(address).await?;
        stream.set_nodelay(true)?;
        let (sender, connection) = h2::client::Builder::new()
            .enable_push(false)
            .initial_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .handshake::<_, Bytes>(stream)
            .await?;
        // Ends when every sender is dropped (h2 then says GOAWAY) or the
        // server goes; a broken connection fails the calls on it, which
        // report it, so its own error is not reported twice.
        tokio::spawn(async move {
            let _ = connection.await;
        });
        let mut sender = sender;
        first_request(&mut sender, address).await?;
        Ok(Connection { sender, uris })
    }
}

/// One health check on a new connection: toolgate closes a connection that
/// has made no request within its handshake timeout (5 s by default), and
/// a round may begin long after its connections were opened (a commit
/// round grants its whole pool first). The answer itself does not matter
/// (the baseline serves no health service).
async fn first_request(sender: &mut SendRequest<Bytes>, address: &str) -> BoxResult<()> {
    let request = grpc_post(format!("http://{address}/grpc.health.v1.Health/Check").parse()?);
    poll_fn(|context| sender.poll_ready(context)).await?;
    let (response, mut body) = sender.send_request(request, false)?;
    // An empty HealthCheckRequest: a gRPC frame of no bytes. A server
    // without the health service (the baseline) answers UNIMPLEMENTED from
    // the head alone, and its answer may close the stream before the frame
    // is sent ("inactive stream"): that answer is all this call is for.
    let _ = body.send_data(Bytes::from_static(&[0, 0, 0, 0, 0]), true);
    let mut answer = response.await?.into_body();
    while let Some(chunk) = answer.data().await {
        let chunk = chunk?;
        answer.flow_control().release_capacity(chunk.len())?;
    }
    Ok(())
}

/// The head of a gRPC request to `uri`: POST, `application/grpc`,
/// `te: trailers`.
fn grpc_post(uri: Uri) -> Request<()> {
    let mut request = Request::new(());
    *request.method_mut() = http::Method::POST;
    *request.uri_mut() = uri;
    let headers = request.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert(TE, HeaderValue::from_static("trailers"));
    request
}

/// The request head of each method for one connection and token, made once
/// and cloned per call (cheaper than building the URI and headers anew).
#[derive(Debug)]
struct Heads {
    decide: Request<()>,
    dispatch: Request<()>,
    assess_manifest: Request<()>,
    check: Request<()>,
}

impl Heads {
    fn new(uris: &Uris, token: &HeaderValue) -> Heads {
        let head = |uri: &Uri| {
            let mut request = grpc_post(uri.clone());
            request.headers_mut().insert(AUTHORIZATION, token.clone());
            request
        };
        Heads {
            decide: head(&uris.decide),
            dispatch: head(&uris.dispatch),
            assess_manifest: head(&uris.assess_manifest),
            check: head(&uris.check),
        }
    }

    fn get(&self, method: Method) -> &Request<()> {
        match method {
            Method::Decide => &self.decide,
            Method::Dispatch => &self.dispatch,
            Method::AssessManifest => &self.assess_manifest,
            Method::Check => &self.check,
        }
    }
}

/// What calls are made with: a connection's sender and the request heads
/// carrying the caller's token. A closed-loop caller keeps one; the open
/// loop clones its connection's for every call in flight (a clone shares
/// the heads).
#[derive(Debug, Clone)]
pub struct Caller {
    sender: SendRequest<Bytes>,
    heads: Arc<Heads>,
}

impl Caller {
    pub fn new(connection: &Connection, token: &HeaderValue) -> Caller {
        Caller {
            sender: connection.sender.clone(),
            heads: Arc::new(Heads::new(&connection.uris, token)),
        }
    }

    /// One unary call: `frame` (from [`frame`]) sent to `method`, its
    /// answer decoded as `R`. Failures are reported as the gRPC status a
    /// gRPC client would give.
    pub async fn unary<R: Message + Default>(
        &mut self,
        method: Method,
        frame: Bytes,
    ) -> Result<R, Status> {
        // Waits while the connection is at the server's limit of
        // concurrent streams.
        poll_fn(|context| self.sender.poll_ready(context))
            .await
            .map_err(from_h2)?;
        let (response, mut body) = self
            .sender
            .send_request(self.heads.get(method).clone(), false)
            .map_err(from_h2)?;
        match body.send_data(frame, true) {
            Ok(()) => answer(response).await,
            // A server may answer from the head alone (a refusal) and close
            // the stream before the message is sent: its answer says why,
            // the send error ("inactive stream") does not.
            Err(error) => match answer::<R>(response).await {
                Err(status) => Err(status),
                Ok(_) => Err(from_h2(error)),
            },
        }
    }
}

/// `message` as one gRPC frame (uncompressed flag, big-endian length,
/// the encoded message), written into `buffer` and split off it, so that a
/// caller's buffer is reused once h2 has sent (and dropped) the previous
/// frame.
pub fn frame(message: &impl Message, buffer: &mut BytesMut) -> Bytes {
    let length = message.encoded_len();
    buffer.reserve(FRAME_HEADER + length);
    buffer.put_u8(0);
    // A request is a few kilobytes at most.
    buffer.put_u32(u32::try_from(length).unwrap_or(u32::MAX));
    if let Err(error) = message.encode(buffer) {
        unreachable!("a BytesMut grows as needed: {error}");
    }
    buffer.split().freeze()
}

/// The answer of one call: the head, the DATA frames, the trailers.
async fn answer<R: Message + Default>(response: ResponseFuture) -> Result<R, Status> {
    let (head, mut body) = response.await.map_err(from_h2)?.into_parts();
    if head.status != StatusCode::OK {
        return Err(Status::new(
            code_of_http(head.status),
            format!("HTTP status {} instead of a gRPC answer", head.status),
        ));
    }
    // Trailers-only: an error (or an OK without the message) in the head.
    if let Some(status) = grpc_status(&head.headers) {
        status?;
        return Err(Status::internal("an OK answer without its message"));
    }
    let mut received = Received::Nothing;
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(from_h2)?;
        // Gives the window back at once, or the connection stalls once
        // 5 MiB of answers have come in.
        body.flow_control()
            .release_capacity(chunk.len())
            .map_err(from_h2)?;
        received.push(chunk);
    }
    let trailers = body.trailers().await.map_err(from_h2)?;
    match trailers.as_ref().and_then(grpc_status) {
        Some(status) => status?,
        None => return Err(Status::internal("an answer without grpc-status")),
    }
    decode(received.bytes())
}

/// The DATA frames of an answer so far: usually the whole gRPC frame comes
/// in one, which is then decoded where it lies.
enum Received {
    Nothing,
    One(Bytes),
    Several(BytesMut),
}

impl Received {
    fn push(&mut self, chunk: Bytes) {
        if chunk.is_empty() {
            return;
        }
        *self = match std::mem::replace(self, Received::Nothing) {
            Received::Nothing => Received::One(chunk),
            Received::One(first) => {
                let mut all = BytesMut::with_capacity(first.len() + chunk.len());
                all.extend_from_slice(&first);
                all.extend_from_slice(&chunk);
                Received::Several(all)
            }
            Received::Several(mut all) => {
                all.extend_from_slice(&chunk);
                Received::Several(all)
            }
        };
    }

    fn bytes(&self) -> &[u8] {
        match self {
            Received::Nothing => &[],
            Received::One(bytes) => bytes,
            Received::Several(bytes) => bytes,
        }
    }
}

/// The one message of a unary answer's gRPC frame.
fn decode<R: Message + Default>(frame: &[u8]) -> Result<R, Status> {
    if frame.is_empty() {
        return Err(Status::internal("an OK answer without its message"));
    }
    let [flag, b0, b1, b2, b3, message @ ..] = frame else {
        return Err(Status::internal(
            "an answer shorter than a gRPC frame header",
        ));
    };
    if *flag != 0 {
        return Err(Status::internal("a compressed answer (none was asked for)"));
    }
    let length = usize::try_from(u32::from_be_bytes([*b0, *b1, *b2, *b3])).unwrap_or(usize::MAX);
    if message.len() != length {
        return Err(Status::internal(format!(
            "an answer of {} bytes after its gRPC frame header, which says {length}",
            message.len()
        )));
    }
    R::decode(message).map_err(|error| Status::internal(format!("decoding the answer: {error}")))
}

/// `grpc-status` (and `grpc-message`) of a head or trailers: `None` when
/// absent, `Some(Ok(()))` for OK.
fn grpc_status(headers: &HeaderMap) -> Option<Result<(), Status>> {
    let code = Code::from_bytes(headers.get("grpc-status")?.as_bytes());
    if code == Code::Ok {
        return Some(Ok(()));
    }
    let message = headers
        .get("grpc-message")
        .map(|message| {
            percent_decode(message.as_bytes())
                .decode_utf8_lossy()
                .into_owned()
        })
        .unwrap_or_default();
    Some(Err(Status::new(code, message)))
}

/// The gRPC code of an HTTP status that is not 200, as gRPC's
/// http-grpc-status-mapping.md says.
fn code_of_http(status: StatusCode) -> Code {
    match status.as_u16() {
        400 => Code::Internal,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::Unimplemented,
        429 | 502 | 503 | 504 => Code::Unavailable,
        _ => Code::Unknown,
    }
}

/// An HTTP/2 error as a gRPC status (gRPC's PROTOCOL-HTTP2.md, as tonic
/// maps them); a broken connection is `UNAVAILABLE`.
fn from_h2(error: h2::Error) -> Status {
    let code = match error.reason() {
        Some(h2::Reason::REFUSED_STREAM) => Code::Unavailable,
        Some(h2::Reason::CANCEL) => Code::Cancelled,
        Some(h2::Reason::ENHANCE_YOUR_CALM) => Code::ResourceExhausted,
        Some(h2::Reason::INADEQUATE_SECURITY) => Code::PermissionDenied,
        Some(_) => Code::Internal,
        None if error.is_io() || error.is_go_away() => Code::Unavailable,
        None => Code::Unknown,
    };
    Status::new(code, format!("h2: {error}"))
}
