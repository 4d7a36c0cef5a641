//! The metrics edge: the tower layer that times every RPC by method and
//! status code, and the `GET /metrics` listener.

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use tokio::net::TcpListener;
use tower::{Layer, Service};

use crate::edge::BoxFuture;
use crate::engine::Engine;
use crate::ops::methods::method_label;
use crate::ops::metrics::Metrics;

/// Serves `GET /metrics` on its own listener until `shutdown` resolves.
pub(crate) async fn serve_metrics(
    listener: TcpListener,
    engine: Engine,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let router = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let text = metrics.render(engine.stats().ok(), &engine.policy().revision);
            async move {
                (
                    [(
                        http::header::CONTENT_TYPE,
                        "text/plain; version=0.0.4; charset=utf-8",
                    )],
                    text,
                )
            }
        }),
    );
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}

/// The status code of a response: `grpc-status` in the headers (errors are
/// trailers-only responses), OK otherwise (it then comes in the trailers).
pub(crate) fn response_code<B>(response: &http::Response<B>) -> i32 {
    response
        .headers()
        .get("grpc-status")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse().ok())
        .unwrap_or(0)
}

/// Records every call's latency (to its response headers) by method and code.
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
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, context: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(context)
    }

    fn call(&mut self, request: http::Request<RequestBody>) -> Self::Future {
        let method = method_label(request.uri().path());
        let metrics = Arc::clone(&self.metrics);
        let started = Instant::now();
        let future = self.inner.call(request);
        Box::pin(async move {
            let result = future.await;
            let code = match &result {
                Ok(response) => response_code(response),
                Err(_) => 2,
            };
            metrics.rpc(method, code, started.elapsed().as_secs_f64());
            result
        })
    }
}
