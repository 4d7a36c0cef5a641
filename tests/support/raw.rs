//! Raw HTTP/2 gRPC calls, for what no generated client can do (hold a
//! call's message back, send broken framing, read the bare answer), and
//! the guarded waits around them.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// How long a wait for a condition (a close, a counter) may take before the
/// test fails: a guard against a hang, never a timed assertion.
pub const GUARD: Duration = Duration::from_secs(120);

/// Waits until `condition` holds, checking every 50 ms; fails the test
/// after [`GUARD`].
pub async fn until<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let waited = tokio::time::timeout(GUARD, async {
        while !condition().await {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "never: {what}");
}

/// Waits until the peer closes `stream`; true for a close (EOF or reset).
pub async fn closed_by_server(stream: &mut TcpStream) -> bool {
    let mut buffer = [0u8; 1024];
    tokio::time::timeout(GUARD, async {
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return true,
                Ok(_) => {}
            }
        }
    })
    .await
    .unwrap_or(false)
}

/// A gRPC message frame: the compressed flag, the length, the message.
pub fn framed(flag: u8, message: &[u8]) -> Bytes {
    let mut out = vec![flag];
    out.extend_from_slice(&u32::try_from(message.len()).expect("small").to_be_bytes());
    out.extend_from_slice(message);
    Bytes::from(out)
}

/// The headers of a gRPC call to `path` as `token`.
pub fn grpc_request(
    addr: SocketAddr,
    path: &str,
    content_type: &str,
    token: &str,
) -> http::Request<()> {
    http::Request::post(format!("http://{addr}{path}"))
        .header("content-type", content_type)
        .header("te", "trailers")
        .header("authorization", format!("Bearer {token}"))
        .body(())
        .expect("request")
}

/// An HTTP/2 connection made with `builder`, driven in the background.
pub async fn connect(
    addr: SocketAddr,
    builder: &h2::client::Builder,
) -> (
    h2::client::SendRequest<Bytes>,
    tokio::task::JoinHandle<Result<(), h2::Error>>,
) {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let (client, connection) = builder.handshake(tcp).await.expect("h2 handshake");
    let driver = tokio::spawn(connection);
    (client.ready().await.expect("ready"), driver)
}

/// What a raw call answered: the HTTP status, grpc-status and grpc-message
/// (from the headers of a trailers-only answer, else from the trailers),
/// and the message bytes received.
#[derive(Debug)]
pub struct RawAnswer {
    pub http: u16,
    pub code: Option<i32>,
    pub message: String,
    pub received: usize,
}

/// grpc-status and (percent-decoded) grpc-message of headers or trailers.
pub fn grpc_status(headers: &http::HeaderMap) -> (Option<i32>, String) {
    let code = headers
        .get("grpc-status")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse().ok());
    let message = headers
        .get("grpc-message")
        .map(|value| {
            percent_encoding::percent_decode(value.as_bytes())
                .decode_utf8_lossy()
                .into_owned()
        })
        .unwrap_or_default();
    (code, message)
}

/// Reads a call's answer to the end.
pub async fn read_answer(response: h2::client::ResponseFuture) -> RawAnswer {
    let response = response.await.expect("response headers");
    let http = response.status().as_u16();
    let (code, message) = grpc_status(response.headers());
    if code.is_some() {
        return RawAnswer {
            http,
            code,
            message,
            received: 0,
        };
    }
    let mut body = response.into_body();
    let mut received = 0;
    while let Some(chunk) = body.data().await {
        let chunk = chunk.expect("data");
        received += chunk.len();
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    let trailers = body.trailers().await.expect("trailers").unwrap_or_default();
    let (code, message) = grpc_status(&trailers);
    RawAnswer {
        http,
        code,
        message,
        received,
    }
}

/// A call in flight on a connection of its own: headers sent, message held
/// back. The PING answered after the HEADERS means the server has seen the
/// call.
pub struct HeldCall {
    pub response: h2::client::ResponseFuture,
    pub stream: h2::SendStream<Bytes>,
    _client: h2::client::SendRequest<Bytes>,
    _driver: tokio::task::JoinHandle<Result<(), h2::Error>>,
}

impl HeldCall {
    pub async fn start(addr: SocketAddr, path: &str, token: &str) -> HeldCall {
        let tcp = TcpStream::connect(addr).await.expect("connect");
        let (client, mut connection) = h2::client::handshake(tcp).await.expect("handshake");
        let mut ping_pong = connection.ping_pong().expect("ping pong");
        let driver = tokio::spawn(connection);
        let mut client = client.ready().await.expect("ready");
        let (response, stream) = client
            .send_request(grpc_request(addr, path, "application/grpc", token), false)
            .expect("send headers");
        ping_pong.ping(h2::Ping::opaque()).await.expect("ping");
        HeldCall {
            response,
            stream,
            _client: client,
            _driver: driver,
        }
    }

    /// Sends `message` (one frame, ending the stream) and reads the answer.
    pub async fn finish(mut self, message: &[u8]) -> RawAnswer {
        self.stream
            .send_data(framed(0, message), true)
            .expect("send body");
        read_answer(self.response).await
    }
}
