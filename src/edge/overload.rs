//! Overload and abuse protection in front of the services:
//!
//! - only `application/grpc…` requests are served; others get HTTP 415;
//! - a call's whole request message is read first, within the read timeout
//!   (`DEADLINE_EXCEEDED` otherwise), into a buffer whose total over all
//!   calls is bounded (`RESOURCE_EXHAUSTED` past it); a message over the
//!   size limit is refused as soon as its length prefix arrives. Every
//!   toolgate RPC takes exactly one message: none, two, a truncated one, or
//!   one with the compressed flag and no `grpc-encoding` is
//!   `INVALID_ARGUMENT`;
//! - then, and only then, a concurrency permit is taken: a call beyond the
//!   limit fails at once with `RESOURCE_EXHAUSTED` instead of queueing, and a
//!   client that sends headers without a body holds no permit;
//! - a per-request timeout answering `DEADLINE_EXCEEDED`;
//! - while the log sink is stalled, calls fail fast with `UNAVAILABLE`
//!   (they would write audit lines nobody can take);
//! - responses are handed to HTTP/2 in chunks of [`CHUNK`] bytes, only as
//!   the peer's flow-control window takes them; the bytes waiting are
//!   bounded over all calls (`RESOURCE_EXHAUSTED` past it), and a response
//!   that cannot be sent within the write timeout is cancelled and its
//!   memory freed;
//! - answers are normalised: a message over the decoding limit is
//!   `RESOURCE_EXHAUSTED` (gRPC's convention, as grpc-go and grpc-core do)
//!   rather than tonic's `OUT_OF_RANGE`, and protobuf that cannot be decoded
//!   (including invalid UTF-8 in a string) is `INVALID_ARGUMENT` with the
//!   field path, as the proto promises, rather than tonic's `INTERNAL`.
//!
//! Health and reflection are exempt from the limit, the buffering and the
//! log gate, so that probes still answer under load. They take no token, so
//! their requests are bounded too, apart from everyone else's: each message
//! to [`PROBE_MESSAGE_BYTES`] (the services' decoding limit), the bytes of
//! all probes in flight beyond each one's first [`PROBE_FREE_BYTES`] to
//! [`PROBE_BUFFER_BYTES`], and a probe's request side to the read timeout
//! (reflection's stream included: its client sends its questions and
//! closes).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http::HeaderMap;
use http_body::Body as _;
use tokio::sync::Semaphore;
use tonic::Status;
use tonic::body::Body;
use tower::{Layer, Service};

use crate::edge::BoxFuture;
use crate::edge::connections::{CallGuard, Closer, ConnectionInfo};
use crate::edge::status::{EdgeError, GRPC_MESSAGE, GRPC_STATUS};
use crate::ops::logwriter::SinkStatus;
use crate::ops::methods;
use crate::ops::metrics::Metrics;

/// Largest piece of a response handed to HTTP/2 at once.
pub(crate) const CHUNK: usize = 16 * 1024;

/// The gRPC message header: compressed flag and big-endian length.
const HEADER: usize = 5;

/// The largest message health or reflection decodes: a service name, a
/// file name or a symbol.
pub(crate) const PROBE_MESSAGE_BYTES: usize = 16 * 1024;
/// The request bytes of all health and reflection calls in flight, beyond
/// each one's first [`PROBE_FREE_BYTES`].
const PROBE_BUFFER_BYTES: usize = 1024 * 1024;
/// The request bytes of a probe that its share of [`PROBE_BUFFER_BYTES`]
/// does not count: an orchestrator's health check (a service name) always
/// fits, so probes stalled to fill the buffer never shut it out.
pub(crate) const PROBE_FREE_BYTES: usize = 512;

/// Overload settings (the policy's `[server]` section).
#[derive(Debug, Clone)]
pub(crate) struct OverloadSettings {
    pub max_concurrent_requests: usize,
    pub request_timeout: Duration,
    pub read_timeout: Duration,
    pub write_timeout: Duration,
    pub max_message_bytes: usize,
    pub max_buffered_request_bytes: usize,
    pub max_buffered_response_bytes: usize,
}

impl From<&crate::domain::policy::ServerSettings> for OverloadSettings {
    fn from(settings: &crate::domain::policy::ServerSettings) -> Self {
        OverloadSettings {
            max_concurrent_requests: settings.max_concurrent_requests,
            request_timeout: settings.request_timeout,
            read_timeout: settings.read_timeout,
            write_timeout: settings.write_timeout,
            max_message_bytes: settings.max_message_bytes,
            max_buffered_request_bytes: settings.max_buffered_request_bytes,
            max_buffered_response_bytes: settings.max_buffered_response_bytes,
        }
    }
}

/// Bytes held at once, over all calls.
#[derive(Debug)]
struct ByteBudget {
    limit: usize,
    used: AtomicUsize,
}

impl ByteBudget {
    fn new(limit: usize) -> Arc<ByteBudget> {
        Arc::new(ByteBudget {
            limit,
            used: AtomicUsize::new(0),
        })
    }

    fn try_take(&self, bytes: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|total| *total <= self.limit)
            })
            .is_ok()
    }

    fn give_back(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// Bytes taken from a budget, given back when dropped.
#[derive(Debug)]
struct Reservation {
    budget: Arc<ByteBudget>,
    bytes: usize,
}

impl Reservation {
    fn new(budget: &Arc<ByteBudget>) -> Reservation {
        Reservation {
            budget: Arc::clone(budget),
            bytes: 0,
        }
    }

    fn grow(&mut self, bytes: usize) -> bool {
        let taken = self.budget.try_take(bytes);
        if taken {
            self.bytes += bytes;
        }
        taken
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.give_back(self.bytes);
    }
}

#[derive(Debug)]
struct Limits {
    settings: OverloadSettings,
    permits: Arc<Semaphore>,
    request_bytes: Arc<ByteBudget>,
    response_bytes: Arc<ByteBudget>,
    probe_bytes: Arc<ByteBudget>,
    metrics: Arc<Metrics>,
    log_sink: Option<SinkStatus>,
}

#[derive(Debug, Clone)]
pub(crate) struct OverloadLayer {
    limits: Arc<Limits>,
}

impl OverloadLayer {
    pub(crate) fn new(
        settings: OverloadSettings,
        metrics: Arc<Metrics>,
        log_sink: Option<SinkStatus>,
    ) -> Self {
        OverloadLayer {
            limits: Arc::new(Limits {
                permits: Arc::new(Semaphore::new(settings.max_concurrent_requests)),
                request_bytes: ByteBudget::new(settings.max_buffered_request_bytes),
                response_bytes: ByteBudget::new(settings.max_buffered_response_bytes),
                probe_bytes: ByteBudget::new(PROBE_BUFFER_BYTES),
                settings,
                metrics,
                log_sink,
            }),
        }
    }
}

impl<S> Layer<S> for OverloadLayer {
    type Service = OverloadService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        OverloadService {
            inner,
            limits: Arc::clone(&self.limits),
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct OverloadService<S> {
    inner: S,
    limits: Arc<Limits>,
}

fn exempt(path: &str) -> bool {
    methods::is_probe(methods::service_of(path))
}

/// `application/grpc`, alone or followed by `+format` or `;parameters`.
fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|value| value.as_bytes().strip_prefix(b"application/grpc"))
        .is_some_and(|rest| rest.is_empty() || rest[0] == b'+' || rest[0] == b';')
}

/// A malformed request message (`field` is `request` for the message as a
/// whole).
fn invalid(field: &str, rule: impl Into<String>) -> EdgeError {
    EdgeError::Malformed {
        field: field.to_string(),
        rule: rule.into(),
    }
}

fn ready(
    response: http::Response<Body>,
) -> BoxFuture<http::Response<Body>, std::convert::Infallible> {
    Box::pin(async move { Ok(response) })
}

impl<S> Service<http::Request<Body>> for OverloadService<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, context: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(context)
    }

    fn call(&mut self, mut request: http::Request<Body>) -> Self::Future {
        let limits = Arc::clone(&self.limits);
        let connection = request.extensions().get::<ConnectionInfo>().cloned();
        let probe = exempt(request.uri().path());
        // A call in flight; a probe's closer instead (see `outgoing`).
        let (call, closer) = match connection {
            Some(connection) => {
                request.extensions_mut().insert(connection.tcp_info());
                if probe {
                    connection.probe_started();
                    (None, Some(connection.closer()))
                } else {
                    (Some(connection.call_started()), None)
                }
            }
            None => (None, None),
        };
        if !is_grpc(request.headers()) {
            limits.metrics.transport_refused("malformed");
            // HTTP 415, with a gRPC status for clients that read one.
            return answer(ready(EdgeError::NotGrpc.into_http()));
        }
        if probe {
            let request = request.map(|body| {
                Body::new(ProbeBody {
                    inner: body,
                    held: Reservation::new(&limits.probe_bytes),
                    free: PROBE_FREE_BYTES,
                    deadline: Box::pin(tokio::time::sleep(limits.settings.read_timeout)),
                    limits: Arc::clone(&limits),
                })
            });
            let future = self.inner.call(request);
            return Box::pin(async move {
                let response = future.await?;
                Ok(limits.outgoing(response, call, closer))
            });
        }
        if limits.log_sink.as_ref().is_some_and(SinkStatus::stalled) {
            limits.metrics.log_refused();
            return answer(ready(EdgeError::LogSinkStalled.into_http()));
        }
        // The service was made ready by `poll_ready`: use it, and leave a
        // fresh clone in its place (tower's advice for services that are
        // called after an await).
        let fresh = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, fresh);
        Box::pin(async move {
            let timeout = limits.settings.request_timeout;
            let response =
                match tokio::time::timeout(timeout, limits.serve(request, &mut inner)).await {
                    Ok(Ok(response)) => response,
                    Ok(Err(error)) => return Err(error),
                    Err(_) => EdgeError::RequestTimeout(timeout).into_http(),
                };
            Ok(limits.outgoing(response, call, closer))
        })
    }
}

/// A ready answer as the service's future type.
fn answer<E: Send + 'static>(
    future: BoxFuture<http::Response<Body>, std::convert::Infallible>,
) -> BoxFuture<http::Response<Body>, E> {
    Box::pin(async move {
        match future.await {
            Ok(response) => Ok(response),
            Err(never) => match never {},
        }
    })
}

/// The request as it arrived: its one message, and its trailers if any.
struct Arrived {
    body: Bytes,
    trailers: Option<HeaderMap>,
    _held: Reservation,
}

impl Limits {
    /// Reads the request message, takes a permit, and calls the service.
    async fn serve<S>(
        &self,
        request: http::Request<Body>,
        inner: &mut S,
    ) -> Result<http::Response<Body>, S::Error>
    where
        S: Service<http::Request<Body>, Response = http::Response<Body>>,
    {
        let (parts, body) = request.into_parts();
        let read_timeout = self.settings.read_timeout;
        let arrived = match tokio::time::timeout(read_timeout, self.read(body)).await {
            Ok(Ok(arrived)) => arrived,
            Ok(Err(refused)) => return Ok(refused.into_http()),
            Err(_) => {
                self.metrics.transport_refused("read-timeout");
                return Ok(EdgeError::ReadTimeout(read_timeout).into_http());
            }
        };
        if let Err(refused) = one_message(&arrived.body, &parts.headers) {
            self.metrics.transport_refused("malformed");
            return Ok(refused.into_http());
        }
        let Ok(permit) = Arc::clone(&self.permits).try_acquire_owned() else {
            self.metrics.load_shed();
            return Ok(EdgeError::ConcurrencyLimit.into_http());
        };
        let Arrived {
            body,
            trailers,
            _held: held,
        } = arrived;
        let body = Body::new(Replayed {
            data: Some(body),
            trailers,
        });
        let result = inner.call(http::Request::from_parts(parts, body)).await;
        drop(permit);
        drop(held);
        result
    }

    /// Reads the whole request body: at most one message's worth of bytes
    /// (refused as soon as a length prefix is over the limit), taken from
    /// the request budget.
    async fn read(&self, mut body: Body) -> Result<Arrived, EdgeError> {
        let limit = self.settings.max_message_bytes;
        let mut held = Reservation::new(&self.request_bytes);
        let mut data = BytesMut::new();
        let mut trailers = None;
        loop {
            let frame =
                std::future::poll_fn(|context| Pin::new(&mut body).poll_frame(context)).await;
            let Some(frame) = frame else { break };
            let frame = frame.map_err(|error| EdgeError::BodyFailed(error.to_string()))?;
            let chunk = match frame.into_data() {
                Ok(chunk) => chunk,
                Err(frame) => {
                    if let Ok(received) = frame.into_trailers() {
                        trailers = Some(received);
                    }
                    continue;
                }
            };
            if let Some(length) = first_length(&data, &chunk)
                && length > limit
            {
                return Err(too_large(length, limit));
            }
            if data.len() + chunk.len() > limit + HEADER {
                return Err(too_large(data.len() + chunk.len() - HEADER, limit));
            }
            if !held.grow(chunk.len()) {
                self.metrics.transport_refused("request-buffer-full");
                return Err(EdgeError::RequestBufferFull);
            }
            data.extend_from_slice(&chunk);
        }
        Ok(Arrived {
            body: data.freeze(),
            trailers,
            _held: held,
        })
    }

    /// The response as it goes out: statuses normalised, data in chunks,
    /// bounded in bytes and time. A probe's (which takes no token), given
    /// its connection's `closer`, is watched as a whole: the connection is
    /// closed when the peer stops reading it ([`watch_progress`]).
    fn outgoing(
        self: &Arc<Self>,
        response: http::Response<Body>,
        call: Option<CallGuard>,
        closer: Option<Closer>,
    ) -> http::Response<Body> {
        let (mut parts, body) = response.into_parts();
        if parts.headers.contains_key(&GRPC_STATUS) {
            // Trailers-only (a status in the headers, as every error has):
            // there is no body to bound.
            if let Some(refused) = normalised(&parts.headers) {
                // Refused before any handler could audit it: counted here,
                // as the framing's refusals are.
                if matches!(refused, EdgeError::Malformed { .. }) {
                    self.metrics.transport_refused("malformed");
                }
                return refused.into_http();
            }
            return http::Response::from_parts(parts, body);
        }
        parts.headers.remove(http::header::CONTENT_LENGTH);
        let watched = closer.map(|closer| (Arc::<Progress>::default(), closer));
        let mut outgoing = Outgoing {
            inner: body,
            first: None,
            slot: None,
            limits: Arc::clone(self),
            generation: 0,
            done: false,
            progress: watched.as_ref().map(|(progress, _)| Arc::clone(progress)),
            handed: 0,
            _call: call,
        };
        // A unary answer is ready now: take it into account before hyper
        // asks for it, which it does only once the peer's window has room
        // (perhaps never).
        let mut context = Context::from_waker(std::task::Waker::noop());
        if let Poll::Ready(Some(frame)) = Pin::new(&mut outgoing.inner).poll_frame(&mut context) {
            match frame.map(|frame| outgoing.take(frame)) {
                Ok(Ok(first)) => outgoing.first = first.map(Ok),
                Ok(Err(refused)) => return refused.into_http(),
                Err(error) => outgoing.first = Some(Err(error)),
            }
        }
        if let Some((progress, closer)) = watched {
            // Until hyper first asks, the answer counts as handed out.
            outgoing.handed = 1;
            progress.handed.store(1, Ordering::Release);
            watch_progress(Arc::clone(self), Arc::downgrade(&progress), closer);
        }
        http::Response::from_parts(parts, Body::new(outgoing))
    }
}

/// The length prefix of the first message, once its header is complete.
fn first_length(data: &[u8], chunk: &[u8]) -> Option<usize> {
    if data.len() >= HEADER || data.len() + chunk.len() < HEADER {
        return None;
    }
    let mut header = [0u8; HEADER];
    let from_data = data.len();
    header[..from_data].copy_from_slice(data);
    header[from_data..].copy_from_slice(&chunk[..HEADER - from_data]);
    Some(u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize)
}

fn too_large(length: usize, limit: usize) -> EdgeError {
    EdgeError::TooLarge { length, limit }
}

/// Checks the gRPC framing: exactly one whole message, uncompressed unless
/// the request names its encoding.
fn one_message(mut body: &[u8], headers: &HeaderMap) -> Result<(), EdgeError> {
    let mut messages = 0;
    while !body.is_empty() {
        if body.len() < HEADER {
            return Err(invalid(
                "request",
                "the body ends inside a gRPC message header",
            ));
        }
        let flag = body[0];
        let length = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
        match flag {
            0 => {}
            1 if headers.contains_key("grpc-encoding") => {}
            1 => {
                return Err(invalid(
                    "request",
                    "the message is marked compressed but the request names no grpc-encoding",
                ));
            }
            other => {
                return Err(invalid(
                    "request",
                    format!("the message's compressed flag must be 0 or 1, not {other}"),
                ));
            }
        }
        body.advance(HEADER);
        if body.len() < length {
            return Err(invalid(
                "request",
                format!(
                    "the body ends inside a message: {} of {length} bytes",
                    body.len()
                ),
            ));
        }
        body.advance(length);
        messages += 1;
    }
    match messages {
        1 => Ok(()),
        0 => Err(invalid("request", "the call carries no request message")),
        count => Err(invalid(
            "request",
            format!("the call carries {count} request messages; it takes exactly one"),
        )),
    }
}

/// A buffered request body, replayed to the service.
struct Replayed {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl http_body::Body for Replayed {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _context: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Status>>> {
        if let Some(data) = self.data.take() {
            return Poll::Ready(Some(Ok(http_body::Frame::data(data))));
        }
        Poll::Ready(
            self.trailers
                .take()
                .map(|trailers| Ok(http_body::Frame::trailers(trailers))),
        )
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }
}

/// A probe's request body, passed on as it arrives (reflection's is a
/// stream) but charged to the probes' byte budget until the call ends, and
/// failed once the read timeout is over.
struct ProbeBody {
    inner: Body,
    held: Reservation,
    /// What is left of the call's [`PROBE_FREE_BYTES`].
    free: usize,
    deadline: Pin<Box<tokio::time::Sleep>>,
    limits: Arc<Limits>,
}

impl http_body::Body for ProbeBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Status>>> {
        if self.deadline.as_mut().poll(context).is_ready() {
            self.limits.metrics.transport_refused("read-timeout");
            let refused = EdgeError::ReadTimeout(self.limits.settings.read_timeout);
            return Poll::Ready(Some(Err(refused.into())));
        }
        let frame = match Pin::new(&mut self.inner).poll_frame(context) {
            Poll::Ready(Some(Ok(frame))) => frame,
            other => return other,
        };
        let length = frame.data_ref().map_or(0, Bytes::len);
        let free = self.free.min(length);
        self.free -= free;
        if !self.held.grow(length - free) {
            self.limits.metrics.transport_refused("request-buffer-full");
            return Poll::Ready(Some(Err(EdgeError::RequestBufferFull.into())));
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
}

/// Tonic's message for a request over the decoding limit.
const TOO_LARGE: &str = "Error, decoded message length too large";
/// The start of prost's message for protobuf it cannot decode.
const UNDECODABLE: &str = "failed to decode Protobuf message: ";

fn grpc_message(headers: &HeaderMap) -> Option<String> {
    // grpc-message is percent-encoded on the wire.
    headers.get(&GRPC_MESSAGE).map(|message| {
        percent_encoding::percent_decode(message.as_bytes())
            .decode_utf8_lossy()
            .into_owned()
    })
}

/// The status an answer should have had, when tonic's differs: OUT_OF_RANGE
/// for an oversize message is RESOURCE_EXHAUSTED, INTERNAL for undecodable
/// protobuf is INVALID_ARGUMENT with the field path.
fn normalised(headers: &HeaderMap) -> Option<EdgeError> {
    let code = headers.get(&GRPC_STATUS)?.as_bytes();
    if code != b"11" && code != b"13" {
        return None;
    }
    let message = grpc_message(headers)?;
    if code == b"11" && message.starts_with(TOO_LARGE) {
        return Some(EdgeError::OverDecodingLimit(message));
    }
    let undecodable = message.strip_prefix(UNDECODABLE)?;
    if code != b"13" {
        return None;
    }
    let (field, rule) = decode_error_field(undecodable);
    Some(invalid(&field, format!("{rule} (not valid protobuf)")))
}

/// Splits prost's `Inner.field: Outer.field: description` (innermost first)
/// into the field path from the request (`outer.inner`) and the description.
fn decode_error_field(text: &str) -> (String, String) {
    let mut fields = Vec::new();
    let mut rest = text;
    while let Some((segment, after)) = rest.split_once(": ") {
        let Some((message, field)) = segment.split_once('.') else {
            break;
        };
        let identifier = |part: &str| {
            !part.is_empty()
                && part
                    .chars()
                    .all(|character| character.is_ascii_alphanumeric() || character == '_')
        };
        if !identifier(message) || !identifier(field) {
            break;
        }
        fields.push(field);
        rest = after;
    }
    fields.reverse();
    let field = match fields.is_empty() {
        true => "request".to_string(),
        false => fields.join("."),
    };
    (field, rest.to_string())
}

/// What a probe's response body tells its watchdog ([`watch_progress`]).
#[derive(Debug, Default)]
struct Progress {
    /// The number of the data frame handed to HTTP/2 and not yet followed
    /// by another poll; 0 when none is (the body waits for its own data).
    handed: AtomicU64,
}

/// Closes the connection of a response whose peer stopped reading it: the
/// same data frame handed out and not followed by another poll at two
/// looks a write timeout apart. hyper takes a frame before it waits for
/// the stream's window, so a window the peer never opens holds the frame,
/// the stream and its connection where no poll of the body notices.
fn watch_progress(limits: Arc<Limits>, progress: Weak<Progress>, closer: Closer) {
    let timeout = limits.settings.write_timeout;
    tokio::spawn(async move {
        let mut seen = 0;
        loop {
            tokio::time::sleep(timeout).await;
            let Some(progress) = progress.upgrade() else {
                return;
            };
            let handed = progress.handed.load(Ordering::Acquire);
            if handed != 0 && handed == seen {
                limits.metrics.transport_refused("write-timeout");
                closer.close();
                return;
            }
            seen = handed;
        }
    });
}

/// What the write-timeout watchdog shares with a response body.
#[derive(Debug, Default)]
struct Slot {
    /// The part of the current message not yet handed to HTTP/2.
    pending: Bytes,
    held: Option<Reservation>,
    /// Which message `pending` belongs to.
    generation: u64,
    /// Set by the watchdog: the response is cancelled.
    timed_out: bool,
}

/// A response body handed to HTTP/2 in chunks (hyper asks for the next one
/// only when the stream has send capacity), with the pending bytes counted
/// against the response budget and dropped by a watchdog after the write
/// timeout.
struct Outgoing {
    inner: Body,
    /// A frame taken from `inner` before hyper asked for one.
    first: Option<Result<http_body::Frame<Bytes>, Status>>,
    /// Made for the first message too large for one chunk: a small answer
    /// (nearly every one) needs no slot, no lock and no watchdog.
    slot: Option<Arc<Mutex<Slot>>>,
    limits: Arc<Limits>,
    /// Counts messages, so that a watchdog acts on its own message only.
    generation: u64,
    done: bool,
    /// A probe's, watched as a whole ([`watch_progress`]).
    progress: Option<Arc<Progress>>,
    /// Data frames handed out (numbers [`Progress::handed`]).
    handed: u64,
    _call: Option<CallGuard>,
}

fn lock(slot: &Mutex<Slot>) -> std::sync::MutexGuard<'_, Slot> {
    // Plain bytes: a panic elsewhere leaves them usable.
    slot.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Outgoing {
    fn trailers(refused: EdgeError) -> http_body::Frame<Bytes> {
        let mut trailers = HeaderMap::new();
        let response = refused.into_http();
        for name in [&GRPC_STATUS, &GRPC_MESSAGE] {
            if let Some(value) = response.headers().get(name) {
                trailers.insert(name.clone(), value.clone());
            }
        }
        http_body::Frame::trailers(trailers)
    }

    /// Takes a frame from the inner body: a small data frame or trailers to
    /// pass on (`Some`), or a large data frame moved to the slot (`None`:
    /// its chunks follow), or the refusal when the response budget has no
    /// room for it.
    fn take(
        &mut self,
        frame: http_body::Frame<Bytes>,
    ) -> Result<Option<http_body::Frame<Bytes>>, EdgeError> {
        let data = match frame.into_data() {
            Ok(data) => data,
            Err(frame) => {
                let frame = match frame.into_trailers() {
                    Ok(mut trailers) => {
                        if let Some(refused) = normalised(&trailers) {
                            trailers.insert(
                                GRPC_STATUS.clone(),
                                http::HeaderValue::from(refused.code() as i32),
                            );
                        }
                        http_body::Frame::trailers(trailers)
                    }
                    Err(frame) => frame,
                };
                return Ok(Some(frame));
            }
        };
        if data.len() <= CHUNK {
            return Ok(Some(http_body::Frame::data(data)));
        }
        let mut held = Reservation::new(&self.limits.response_bytes);
        if !held.grow(data.len()) {
            self.limits
                .metrics
                .transport_refused("response-buffer-full");
            return Err(EdgeError::ResponseBufferFull);
        }
        self.generation += 1;
        let slot = self.slot.get_or_insert_default();
        {
            let mut slot = lock(slot);
            slot.pending = data;
            slot.held = Some(held);
            slot.generation = self.generation;
        }
        let slot = Arc::downgrade(slot);
        self.watch(slot);
        Ok(None)
    }

    /// Arms the watchdog for the message now pending in `slot`.
    fn watch(&self, slot: Weak<Mutex<Slot>>) {
        let generation = self.generation;
        let timeout = self.limits.settings.write_timeout;
        let limits = Arc::clone(&self.limits);
        tokio::spawn(async move {
            tokio::time::sleep(timeout).await;
            cancel_if_stuck(&slot, generation, &limits);
        });
    }
}

fn cancel_if_stuck(slot: &Weak<Mutex<Slot>>, generation: u64, limits: &Limits) {
    let Some(slot) = slot.upgrade() else { return };
    let mut slot = lock(&slot);
    if slot.generation != generation || slot.pending.is_empty() || slot.timed_out {
        return;
    }
    slot.pending = Bytes::new();
    slot.held = None;
    slot.timed_out = true;
    limits.metrics.transport_refused("write-timeout");
}

impl http_body::Body for Outgoing {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Status>>> {
        let Some(progress) = self.progress.clone() else {
            return self.poll_next(context);
        };
        let polled = self.poll_next(context);
        let handed = match &polled {
            Poll::Ready(Some(Ok(frame))) if frame.is_data() => {
                self.handed += 1;
                self.handed
            }
            _ => 0,
        };
        progress.handed.store(handed, Ordering::Release);
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.done
            || (self.first.is_none()
                && self
                    .slot
                    .as_ref()
                    .is_none_or(|slot| lock(slot).pending.is_empty())
                && self.inner.is_end_stream())
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::default()
    }
}

impl Outgoing {
    /// The next frame for HTTP/2: from the slot, the frame taken early, or
    /// the inner body.
    fn poll_next(
        &mut self,
        context: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Status>>> {
        loop {
            if self.done {
                return Poll::Ready(None);
            }
            if let Some(slot) = &self.slot {
                let mut slot = lock(slot);
                if slot.timed_out {
                    drop(slot);
                    self.done = true;
                    let refused = EdgeError::WriteTimeout(self.limits.settings.write_timeout);
                    return Poll::Ready(Some(Err(refused.into())));
                }
                if !slot.pending.is_empty() {
                    let take = slot.pending.len().min(CHUNK);
                    let chunk = slot.pending.split_to(take);
                    if slot.pending.is_empty() {
                        slot.held = None;
                    }
                    return Poll::Ready(Some(Ok(http_body::Frame::data(chunk))));
                }
            }
            if let Some(first) = self.first.take() {
                return Poll::Ready(Some(first));
            }
            let frame = match Pin::new(&mut self.inner).poll_frame(context) {
                Poll::Ready(Some(Ok(frame))) => frame,
                other => return other,
            };
            match self.take(frame) {
                Ok(Some(frame)) => return Poll::Ready(Some(Ok(frame))),
                Ok(None) => continue, // chunks from the slot
                Err(refused) => {
                    self.done = true;
                    return Poll::Ready(Some(Ok(Outgoing::trailers(refused))));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_errors_name_the_field_path_from_the_request() {
        assert_eq!(
            decode_error_field(
                "Session.actor: DecideRequest.session: invalid string value: data is not UTF-8 encoded"
            ),
            (
                "session.actor".to_string(),
                "invalid string value: data is not UTF-8 encoded".to_string()
            )
        );
        assert_eq!(
            decode_error_field("buffer underflow"),
            ("request".to_string(), "buffer underflow".to_string())
        );
    }

    #[test]
    fn grpc_content_types() {
        let with = |value: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static(value),
            );
            is_grpc(&headers)
        };
        assert!(with("application/grpc"));
        assert!(with("application/grpc+proto"));
        assert!(with("application/grpc;charset=utf-8"));
        assert!(!with("application/grpcx"));
        assert!(!with("application/json"));
        assert!(!with("text/plain"));
        assert!(!is_grpc(&HeaderMap::new()));
    }

    fn framed(flag: u8, message: &[u8]) -> Vec<u8> {
        let mut out = vec![flag];
        out.extend_from_slice(&(message.len() as u32).to_be_bytes());
        out.extend_from_slice(message);
        out
    }

    #[test]
    fn exactly_one_whole_uncompressed_message() {
        let headers = HeaderMap::new();
        assert!(one_message(&framed(0, b"abc"), &headers).is_ok());
        assert!(one_message(&framed(0, b""), &headers).is_ok());
        let message = |body: &[u8]| {
            Status::from(one_message(body, &headers).expect_err("refused"))
                .message()
                .to_string()
        };
        assert_eq!(message(b""), "request: the call carries no request message");
        assert_eq!(
            message(&[framed(0, b"a"), framed(0, b"b")].concat()),
            "request: the call carries 2 request messages; it takes exactly one"
        );
        assert_eq!(
            message(&framed(1, b"abc")),
            "request: the message is marked compressed but the request names no grpc-encoding"
        );
        assert_eq!(
            message(&framed(7, b"abc")),
            "request: the message's compressed flag must be 0 or 1, not 7"
        );
        assert_eq!(
            message(&framed(0, b"abc")[..6]),
            "request: the body ends inside a message: 1 of 3 bytes"
        );
        assert_eq!(
            message(&[0, 0]),
            "request: the body ends inside a gRPC message header"
        );
        let mut encoded = HeaderMap::new();
        encoded.insert("grpc-encoding", http::HeaderValue::from_static("gzip"));
        assert!(one_message(&framed(1, b"abc"), &encoded).is_ok());
    }

    #[test]
    fn budgets_never_exceed_their_limit_and_give_back_on_drop() {
        let budget = ByteBudget::new(10);
        let mut first = Reservation::new(&budget);
        assert!(first.grow(6));
        let mut second = Reservation::new(&budget);
        assert!(!second.grow(5));
        assert!(second.grow(4));
        drop(first);
        assert!(second.grow(6));
        assert_eq!(budget.used.load(Ordering::Acquire), 10);
        drop(second);
        assert_eq!(budget.used.load(Ordering::Acquire), 0);
    }

    fn settings(max_concurrent_requests: usize) -> OverloadSettings {
        OverloadSettings {
            max_concurrent_requests,
            request_timeout: Duration::from_secs(60),
            read_timeout: Duration::from_secs(60),
            write_timeout: Duration::from_secs(60),
            max_message_bytes: 1024,
            max_buffered_request_bytes: 1 << 20,
            max_buffered_response_bytes: 1 << 20,
        }
    }

    fn request() -> http::Request<Body> {
        http::Request::post("/toolgate.v1.PolicyDecisionPoint/Decide")
            .header("content-type", "application/grpc")
            .body(Body::new(Replayed {
                data: Some(Bytes::from(framed(0, b""))),
                trailers: None,
            }))
            .unwrap()
    }

    fn code(response: &http::Response<Body>) -> Option<&[u8]> {
        response
            .headers()
            .get("grpc-status")
            .map(|value| value.as_bytes())
    }

    #[tokio::test]
    async fn a_call_beyond_the_limit_is_shed_at_once_and_the_permit_comes_back() {
        let release = Arc::new(tokio::sync::Notify::new());
        let entered = Arc::new(tokio::sync::Notify::new());
        let service = {
            let release = Arc::clone(&release);
            let entered = Arc::clone(&entered);
            tower::service_fn(move |_request: http::Request<Body>| {
                let release = Arc::clone(&release);
                let entered = Arc::clone(&entered);
                async move {
                    entered.notify_one();
                    release.notified().await;
                    Ok::<_, std::convert::Infallible>(Status::ok("done").into_http::<Body>())
                }
            })
        };
        let layer = OverloadLayer::new(settings(1), Metrics::new(), None);
        let mut overload = layer.layer(service);
        let first = tokio::spawn(overload.call(request()));
        entered.notified().await;
        // The one permit is taken by a call whose message has arrived.
        let shed = overload.call(request()).await.unwrap();
        assert_eq!(code(&shed), Some(&b"8"[..]));
        assert_eq!(
            grpc_message(shed.headers()).as_deref(),
            Some("toolgate is at its concurrency limit; retry with backoff")
        );
        release.notify_one();
        let served = first.await.unwrap().unwrap();
        assert_eq!(code(&served), Some(&b"0"[..]));
        let again = tokio::spawn(overload.call(request()));
        entered.notified().await;
        release.notify_one();
        assert_eq!(code(&again.await.unwrap().unwrap()), Some(&b"0"[..]));
    }
}
