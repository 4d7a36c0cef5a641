//! Overload and abuse protection in front of the services:
//!
//! - a global concurrency limit with load shedding: a call beyond the limit
//!   fails at once with `RESOURCE_EXHAUSTED` instead of queueing;
//! - a per-request timeout answering `DEADLINE_EXCEEDED`;
//! - a message over the decoding limit answers `RESOURCE_EXHAUSTED` (gRPC's
//!   convention, as grpc-go and grpc-core do) rather than tonic's
//!   `OUT_OF_RANGE`.
//!
//! Health and reflection are exempt from the limit so that probes still
//! answer under load.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::Semaphore;
use tonic::Status;
use tonic::body::Body;
use tower::{Layer, Service};

use crate::metrics::Metrics;

/// Overload settings (the policy's `[server]` section).
#[derive(Debug, Clone)]
pub struct OverloadLayer {
    permits: Arc<Semaphore>,
    timeout: Duration,
    metrics: Arc<Metrics>,
}

impl OverloadLayer {
    pub fn new(max_concurrent_requests: usize, timeout: Duration, metrics: Arc<Metrics>) -> Self {
        OverloadLayer {
            permits: Arc::new(Semaphore::new(max_concurrent_requests)),
            timeout,
            metrics,
        }
    }
}

impl<S> Layer<S> for OverloadLayer {
    type Service = OverloadService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        OverloadService {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct OverloadService<S> {
    inner: S,
    layer: OverloadLayer,
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

fn exempt(path: &str) -> bool {
    path.starts_with("/grpc.health.") || path.starts_with("/grpc.reflection.")
}

/// Tonic's message for a request over the decoding limit.
const TOO_LARGE: &str = "Error, decoded message length too large";

impl<S, RequestBody> Service<http::Request<RequestBody>> for OverloadService<S>
where
    S: Service<http::Request<RequestBody>, Response = http::Response<Body>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, context: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(context)
    }

    fn call(&mut self, request: http::Request<RequestBody>) -> Self::Future {
        if exempt(request.uri().path()) {
            return Box::pin(self.inner.call(request));
        }
        let Ok(permit) = Arc::clone(&self.layer.permits).try_acquire_owned() else {
            self.layer.metrics.load_shed();
            let response = Status::resource_exhausted(
                "toolgate is at its concurrency limit; retry with backoff",
            )
            .into_http::<Body>();
            return Box::pin(async move { Ok(response) });
        };
        let timeout = self.layer.timeout;
        let future = self.inner.call(request);
        Box::pin(async move {
            let result = match tokio::time::timeout(timeout, future).await {
                Ok(result) => result,
                Err(_) => {
                    return Ok(Status::deadline_exceeded(format!(
                        "the request took longer than the server's {} ms limit",
                        timeout.as_millis()
                    ))
                    .into_http::<Body>());
                }
            };
            drop(permit);
            result.map(too_large_is_resource_exhausted)
        })
    }
}

/// True for tonic's OUT_OF_RANGE answer to a message over the decoding limit.
fn is_too_large(headers: &http::HeaderMap) -> bool {
    let out_of_range = headers
        .get("grpc-status")
        .is_some_and(|status| status.as_bytes() == b"11");
    // grpc-message is percent-encoded on the wire.
    out_of_range
        && headers.get("grpc-message").is_some_and(|message| {
            percent_encoding::percent_decode(message.as_bytes())
                .decode_utf8_lossy()
                .starts_with(TOO_LARGE)
        })
}

/// RESOURCE_EXHAUSTED, as a header value.
const RESOURCE_EXHAUSTED: http::HeaderValue = http::HeaderValue::from_static("8");

/// Rewrites tonic's OUT_OF_RANGE for an oversize message to
/// RESOURCE_EXHAUSTED, whether it comes as a trailers-only response (in the
/// headers) or in the trailers.
fn too_large_is_resource_exhausted(response: http::Response<Body>) -> http::Response<Body> {
    let (mut parts, body) = response.into_parts();
    if is_too_large(&parts.headers) {
        parts.headers.insert("grpc-status", RESOURCE_EXHAUSTED);
    }
    http::Response::from_parts(parts, Body::new(TooLargeTrailers { inner: body }))
}

/// A response body whose trailers get the same rewrite.
struct TooLargeTrailers {
    inner: Body,
}

impl http_body::Body for TooLargeTrailers {
    type Data = bytes::Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(context);
        match polled {
            Poll::Ready(Some(Ok(frame))) if frame.is_trailers() => {
                let frame = match frame.into_trailers() {
                    Ok(mut trailers) => {
                        if is_too_large(&trailers) {
                            trailers.insert("grpc-status", RESOURCE_EXHAUSTED);
                        }
                        http_body::Frame::trailers(trailers)
                    }
                    Err(frame) => frame,
                };
                Poll::Ready(Some(Ok(frame)))
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
