//! The metrics edge: the tower layer that times every RPC by method and
//! status code, and the `GET /metrics` listener.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::{Layer, Service};

use crate::edge::BoxFuture;
use crate::edge::status::GRPC_STATUS;
use crate::engine::Engine;
use crate::ops::methods::method_index;
use crate::ops::metrics::Metrics;

/// Serves `GET /metrics` on its own listener until `shutdown` resolves;
/// gzip-compressed when the scraper accepts gzip (Prometheus does).
pub(crate) async fn serve_metrics(
    listener: TcpListener,
    engine: Engine,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let router = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move |headers: http::HeaderMap| {
            let (engine, metrics) = (engine.clone(), Arc::clone(&metrics));
            async move {
                // A store that does not answer (a hung disk, a turn
                // waiting on another replica's lock) must not hang the
                // scrape: the sizes are left out, and the scrape says so.
                let stats = tokio::time::timeout(STATS_WAIT, engine.durable_stats())
                    .await
                    .ok()
                    .and_then(Result::ok);
                let text = metrics.render(stats, &engine.policy().revision);
                exposition(text, accepts_gzip(&headers))
            }
        }),
    );
    let listener = Bounded {
        inner: listener,
        permits: Arc::new(Semaphore::new(MAX_METRICS_CONNECTIONS)),
    };
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}

/// How long a scrape waits for the state's sizes, which are read once
/// what they count is durable (a store turn on a shared store).
const STATS_WAIT: Duration = Duration::from_secs(2);

/// Connections the metrics listener serves at once: a scraper needs one or
/// two, and each is a descriptor the gRPC listener needs too.
const MAX_METRICS_CONNECTIONS: usize = 16;
/// How long a metrics connection may make no progress (its request's
/// headers, the next request, its answer taken) before it is closed, so
/// that silent connections cannot hold every slot.
const METRICS_IDLE: Duration = Duration::from_secs(10);

/// The metrics listener, at most [`MAX_METRICS_CONNECTIONS`] connections
/// open (the next waits in the kernel's backlog), each closed after
/// [`METRICS_IDLE`] without progress.
struct Bounded {
    inner: TcpListener,
    permits: Arc<Semaphore>,
}

impl axum::serve::Listener for Bounded {
    type Io = BoundedConnection;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (BoundedConnection, SocketAddr) {
        // The semaphore is never closed.
        let Ok(permit) = Arc::clone(&self.permits).acquire_owned().await else {
            return std::future::pending().await;
        };
        let (stream, addr) = axum::serve::Listener::accept(&mut self.inner).await;
        let connection = BoundedConnection {
            stream,
            idle: Box::pin(tokio::time::sleep(METRICS_IDLE)),
            _permit: permit,
        };
        (connection, addr)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// A metrics connection: its slot, and the deadline of its next progress.
struct BoundedConnection {
    stream: TcpStream,
    idle: Pin<Box<tokio::time::Sleep>>,
    _permit: OwnedSemaphorePermit,
}

impl BoundedConnection {
    /// Moves the deadline on after progress; fails a wait past it.
    fn progress<T>(
        &mut self,
        context: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match polled {
            Poll::Pending => match self.idle.as_mut().poll(context) {
                Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "metrics connection made no progress",
                ))),
                Poll::Pending => Poll::Pending,
            },
            ready => {
                let next = tokio::time::Instant::now() + METRICS_IDLE;
                self.idle.as_mut().reset(next);
                ready
            }
        }
    }
}

impl AsyncRead for BoundedConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.stream).poll_read(context, buf);
        self.progress(context, polled)
    }
}

impl AsyncWrite for BoundedConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write(context, buf);
        self.progress(context, polled)
    }

    fn poll_flush(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.stream).poll_flush(context);
        self.progress(context, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(context)
    }
}

/// The content type of the Prometheus text format.
const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The response for the exposition `text`, gzip-compressed when asked.
fn exposition(text: String, gzip: bool) -> http::Response<axum::body::Body> {
    let plain = |text: String| {
        http::Response::builder()
            .header(http::header::CONTENT_TYPE, TEXT_FORMAT)
            .header(http::header::VARY, "accept-encoding")
            .body(axum::body::Body::from(text))
    };
    let response = match gzip.then(|| gzip_bytes(text.as_bytes())) {
        Some(Ok(compressed)) => http::Response::builder()
            .header(http::header::CONTENT_TYPE, TEXT_FORMAT)
            .header(http::header::CONTENT_ENCODING, "gzip")
            .header(http::header::VARY, "accept-encoding")
            .body(axum::body::Body::from(compressed)),
        // Compressing into memory does not fail; were it to, plain text.
        _ => plain(text),
    };
    // The headers are constants, so the builder cannot fail.
    response.unwrap_or_default()
}

fn gzip_bytes(text: &[u8]) -> std::io::Result<Vec<u8>> {
    use std::io::Write as _;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(text)?;
    encoder.finish()
}

/// Whether `Accept-Encoding` lists gzip with a non-zero quality.
fn accepts_gzip(headers: &http::HeaderMap) -> bool {
    headers
        .get_all(http::header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|coding| {
            let mut parts = coding.split(';').map(str::trim);
            let name = parts.next().unwrap_or("");
            let refused = parts.any(|parameter| {
                parameter
                    .strip_prefix("q=")
                    .and_then(|quality| quality.parse::<f32>().ok())
                    .is_some_and(|quality| quality == 0.0)
            });
            (name.eq_ignore_ascii_case("gzip") || name == "*") && !refused
        })
}

/// The `grpc-status` of headers or trailers, OK when absent or unreadable
/// (an error is a trailers-only response, its status in the headers).
fn status_code(headers: &http::HeaderMap) -> i32 {
    headers
        .get(&GRPC_STATUS)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse().ok())
        .unwrap_or(0)
}

/// Counts every call as started, and as handled with its code and latency
/// once its status is out, by method: with the headers for a trailers-only
/// answer (an error), else when the body's trailers pass (for a stream:
/// when it ends), or CANCELLED when the body is dropped before them (the
/// client went away).
#[derive(Debug, Clone)]
pub(crate) struct MetricsLayer {
    metrics: Arc<Metrics>,
}

impl MetricsLayer {
    pub(crate) fn new(metrics: Arc<Metrics>) -> Self {
        MetricsLayer { metrics }
    }
}

impl<S> Layer<S> for MetricsLayer {
    type Service = MetricsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        MetricsService {
            inner,
            metrics: Arc::clone(&self.metrics),
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct MetricsService<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

impl<S, RequestBody, ResponseBody> Service<http::Request<RequestBody>> for MetricsService<S>
where
    S: Service<http::Request<RequestBody>, Response = http::Response<ResponseBody>>,
    S::Future: Send + 'static,
    ResponseBody: Send + 'static,
{
    type Response = http::Response<Counted<ResponseBody>>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, context: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(context)
    }

    fn call(&mut self, request: http::Request<RequestBody>) -> Self::Future {
        let method = method_index(request.uri().path());
        let metrics = Arc::clone(&self.metrics);
        metrics.rpc_started(method);
        let started = Instant::now();
        let future = self.inner.call(request);
        Box::pin(async move {
            let handled = Handled {
                metrics,
                method,
                started,
            };
            match future.await {
                Ok(response) if response.headers().contains_key(&GRPC_STATUS) => {
                    handled.record(status_code(response.headers()));
                    Ok(response.map(|body| Counted {
                        body,
                        handled: None,
                    }))
                }
                Ok(response) => Ok(response.map(|body| Counted {
                    body,
                    handled: Some(handled),
                })),
                Err(error) => {
                    handled.record(2);
                    Err(error)
                }
            }
        })
    }
}

/// A call not yet counted as handled.
#[derive(Debug)]
struct Handled {
    metrics: Arc<Metrics>,
    method: usize,
    started: Instant,
}

impl Handled {
    fn record(self, code: i32) {
        let seconds = self.started.elapsed().as_secs_f64();
        self.metrics.rpc_handled(self.method, code, seconds);
    }
}

/// CANCELLED, as gRPC numbers it.
const CANCELLED: i32 = 1;

/// A response body that counts its call as handled when its trailers pass
/// (with their `grpc-status`), when it ends without any (OK), or when it is
/// dropped before either (CANCELLED).
#[derive(Debug)]
pub(crate) struct Counted<B> {
    body: B,
    handled: Option<Handled>,
}

impl<B> http_body::Body for Counted<B>
where
    B: http_body::Body + Unpin,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let polled = std::pin::Pin::new(&mut self.body).poll_frame(context);
        let code = match &polled {
            Poll::Ready(Some(Ok(frame))) => frame.trailers_ref().map(status_code),
            Poll::Ready(Some(Err(_))) => Some(2),
            Poll::Ready(None) => Some(0),
            Poll::Pending => None,
        };
        if let Some(code) = code
            && let Some(handled) = self.handled.take()
        {
            handled.record(code);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

impl<B> Drop for Counted<B> {
    fn drop(&mut self) {
        if let Some(handled) = self.handled.take() {
            handled.record(CANCELLED);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(accept: &str) -> http::HeaderMap {
        let mut headers = http::HeaderMap::new();
        if let Ok(value) = accept.parse() {
            headers.insert(http::header::ACCEPT_ENCODING, value);
        }
        headers
    }

    #[test]
    fn gzip_only_when_the_scraper_accepts_it() {
        assert!(accepts_gzip(&headers("gzip")));
        assert!(accepts_gzip(&headers("identity, GZIP;q=0.5")));
        assert!(accepts_gzip(&headers("*")));
        assert!(!accepts_gzip(&headers("")));
        assert!(!accepts_gzip(&headers("br, deflate")));
        assert!(!accepts_gzip(&headers("gzip;q=0")));
    }
}
