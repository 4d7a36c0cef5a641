//! The transport's own bounds, driven by raw HTTP/2 and raw TCP clients
//! against a real server: connections that never speak are closed and the
//! connection caps make room by closing silent connections (health still
//! answers); a call's permit waits for its whole message, and a message that
//! does not arrive in time is DEADLINE_EXCEEDED; a response that cannot be
//! sent is cancelled after the write timeout, the bytes waiting are
//! bounded, and a peer that stops reading its socket is disconnected;
//! requests that are not one well-formed gRPC message are INVALID_ARGUMENT
//! (HTTP 415 for a foreign content type).
//!
//! Nothing here is timed: every wait is for a condition (a close, a counter
//! in `/metrics`), with a generous guard so that a regression fails instead
//! of hanging.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use prost::Message;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;

use crate::support::policies::decide_policy;
use crate::support::raw::{
    self, GUARD, HeldCall, RawAnswer, closed_by_server, framed, grpc_request, grpc_status,
    read_answer,
};
use crate::support::tokens::HOST;
use crate::support::{TestServer, authed, pb, read_balance};

const DECIDE: &str = "/toolgate.v1.PolicyDecisionPoint/Decide";
const GET_RESOURCE: &str = "/toolgate.v1.Resources/GetResource";
/// The size of the `big` resource: a GetResource answer of ~800 KB.
const BIG: usize = 800_000;

/// `tests/fixtures/decide.toml` with a `[server]` section and a `big`
/// resource of [`BIG`] bytes.
async fn start(server_section: &str) -> TestServer {
    let big = "x".repeat(BIG);
    let policy = decide_policy(&format!(
        "[server]\n{server_section}\n[state.resources]\nbig = \"{big}\"\nsmall = \"s\"\n"
    ));
    TestServer::start_with_options(policy, true).await
}

fn sample(samples: &HashMap<String, f64>, series: &str) -> f64 {
    samples.get(series).copied().unwrap_or(0.0)
}

/// Waits until the metric `series` reaches `value`.
async fn wait_for_metric(server: &TestServer, series: &str, value: f64) {
    let waited = tokio::time::timeout(GUARD, async {
        loop {
            if sample(&server.metrics().await, series) >= value {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "{series} never reached {value}");
}

fn closed(reason: &str) -> String {
    format!(r#"toolgate_connections_closed_total{{reason="{reason}"}}"#)
}

fn refused(reason: &str) -> String {
    format!(r#"toolgate_transport_refused_total{{reason="{reason}"}}"#)
}

fn decide_message(call_id: &str) -> Vec<u8> {
    read_balance(call_id).encode_to_vec()
}

fn resource_message(name: &str) -> Vec<u8> {
    pb::GetResourceRequest {
        name: name.into(),
        ..Default::default()
    }
    .encode_to_vec()
}

/// One call on its own connection: headers, then `body` in one DATA frame.
async fn raw_call(addr: SocketAddr, path: &str, content_type: &str, body: Bytes) -> RawAnswer {
    let (_client, _driver, response, mut stream) = open(addr, path, content_type).await;
    stream.send_data(body, true).expect("send body");
    read_answer(response).await
}

/// The call ended with gRPC status `code` and exactly `message`.
fn assert_status(answer: &RawAnswer, code: Code, message: &str) {
    assert_eq!(answer.code, Some(code as i32), "{answer:?}");
    assert_eq!(answer.message, message, "{answer:?}");
}

/// A connection (open while its client and driver live), the answer to
/// come of one call on it and the stream the call's body goes on.
type OpenCall = (
    h2::client::SendRequest<Bytes>,
    tokio::task::JoinHandle<Result<(), h2::Error>>,
    h2::client::ResponseFuture,
    h2::SendStream<Bytes>,
);

/// A connection of its own and the headers of one call by HOST.
async fn open(addr: SocketAddr, path: &str, content_type: &str) -> OpenCall {
    let (mut client, driver) = raw::connect(addr, &h2::client::Builder::new()).await;
    let (response, stream) = client
        .send_request(grpc_request(addr, path, content_type, HOST), false)
        .expect("send headers");
    (client, driver, response, stream)
}

// ---------------------------------------------------------------------------
// 13.2: connections that never speak; connection caps.
// ---------------------------------------------------------------------------

#[tokio::test]
async fn connections_that_never_speak_are_closed() {
    let server = start("handshake_timeout_ms = 300").await;
    // The harness's connection makes its first request in time.
    assert_eq!(server.health().await, ServingStatus::Serving);
    // A TCP connection that sends nothing at all.
    let mut silent = TcpStream::connect(server.addr).await.expect("connect");
    // A connection that completes the HTTP/2 handshake and makes no request.
    let (client, driver) = raw::connect(server.addr, &h2::client::Builder::new()).await;
    assert!(closed_by_server(&mut silent).await, "silent TCP stays open");
    let ended = tokio::time::timeout(GUARD, driver).await;
    assert!(
        ended.is_ok(),
        "an HTTP/2 connection without requests stays open"
    );
    drop(client);
    let samples = server.metrics().await;
    assert_eq!(sample(&samples, &closed("handshake-timeout")), 2.0);
    assert_eq!(server.health().await, ServingStatus::Serving);
    server.stop().await;
}

#[tokio::test]
async fn at_the_caps_silent_connections_make_room_and_health_answers() {
    let server =
        start("max_connections = 20\nmax_connections_per_peer = 10\nhandshake_timeout_ms = 600000")
            .await;
    // The harness's connection speaks first: it is not a candidate.
    assert_eq!(server.health().await, ServingStatus::Serving);
    let mut silent = Vec::new();
    for _ in 0..50 {
        silent.push(TcpStream::connect(server.addr).await.expect("connect"));
    }
    // Loopback is one peer: its share is 10, the harness's included, so 41
    // of the 50 silent connections were closed, oldest first.
    wait_for_metric(&server, &closed("evicted"), 41.0).await;
    for stream in &mut silent[..41] {
        assert!(closed_by_server(stream).await);
    }
    // A new health probe gets in, closing one more silent connection.
    let probe = tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect at the cap");
    let mut probe = tonic_health::pb::health_client::HealthClient::new(probe);
    let status = probe
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("health at the cap")
        .into_inner()
        .status();
    assert_eq!(status, ServingStatus::Serving);
    let samples = server.metrics().await;
    assert_eq!(sample(&samples, &closed("evicted")), 42.0);
    assert_eq!(sample(&samples, &closed("refused")), 0.0);
    assert_eq!(sample(&samples, "toolgate_connections_open"), 10.0);
    // The harness's connection was never closed.
    assert_eq!(server.health().await, ServingStatus::Serving);
    server.stop().await;
}

#[tokio::test]
async fn at_the_cap_a_connection_is_refused_when_every_other_is_busy() {
    let server = start("max_connections_per_peer = 2\nread_timeout_ms = 600000").await;
    // The harness's connection has spoken and is idle.
    assert_eq!(server.health().await, ServingStatus::Serving);
    let first = HeldCall::start(server.addr, DECIDE, HOST).await;
    // At the cap of two: the idle harness connection makes room.
    let second = HeldCall::start(server.addr, DECIDE, HOST).await;
    // Both open connections are busy: a new one is refused.
    let mut third = TcpStream::connect(server.addr).await.expect("connect");
    assert!(closed_by_server(&mut third).await);
    let samples = server.metrics().await;
    assert_eq!(sample(&samples, &closed("evicted")), 1.0);
    assert_eq!(sample(&samples, &closed("refused")), 1.0);
    assert_eq!(sample(&samples, "toolgate_connections_open"), 2.0);
    // The busy calls were never disturbed: they finish normally.
    for (index, held) in [first, second].into_iter().enumerate() {
        let answer = held.finish(&decide_message(&format!("busy{index}"))).await;
        assert_eq!(answer.code, Some(0), "{answer:?}");
    }
    server.stop().await;
}

// ---------------------------------------------------------------------------
// 13.3: permits wait for the whole message; per-connection streams.
// ---------------------------------------------------------------------------

#[tokio::test]
async fn one_connection_of_bodiless_calls_cannot_take_every_permit() {
    let server = start("max_concurrent_requests = 64\nread_timeout_ms = 600000").await;
    let tcp = TcpStream::connect(server.addr).await.expect("connect");
    let (client, mut connection) = h2::client::handshake(tcp).await.expect("handshake");
    let mut ping_pong = connection.ping_pong().expect("ping pong");
    let _driver = tokio::spawn(connection);
    let mut client = client.ready().await.expect("ready");
    // The server's SETTINGS (answered PING: they have arrived): at most 100
    // streams per connection.
    ping_pong.ping(h2::Ping::opaque()).await.expect("ping");
    assert_eq!(client.current_max_send_streams(), 100);
    let mut held = Vec::new();
    for _ in 0..100 {
        let (response, stream) = client
            .send_request(
                grpc_request(server.addr, DECIDE, "application/grpc", HOST),
                false,
            )
            .expect("send headers");
        held.push((response, stream));
    }
    // A PING answered after the HEADERS: the server has seen all 100.
    ping_pong.ping(h2::Ping::opaque()).await.expect("ping");
    // Every other caller is still served: none of the 100 holds a permit.
    server.reads_are_allowed(HOST, 10).await;
    assert_eq!(
        sample(&server.metrics().await, "toolgate_load_shed_total"),
        0.0
    );
    server.stop().await;
}

#[tokio::test]
async fn a_message_that_does_not_arrive_in_time_is_deadline_exceeded() {
    let server = start("read_timeout_ms = 200").await;
    let (_client, _driver, response, mut stream) =
        open(server.addr, DECIDE, "application/grpc").await;
    // Half a message, then nothing.
    let whole = framed(0, &decide_message("late"));
    stream
        .send_data(whole.slice(..whole.len() / 2), false)
        .expect("send half");
    let answer = read_answer(response).await;
    assert_status(
        &answer,
        Code::DeadlineExceeded,
        "the request message did not arrive within the server's 200 ms read timeout",
    );
    assert_eq!(
        sample(&server.metrics().await, &refused("read-timeout")),
        1.0
    );
    server.stop().await;
}

#[tokio::test]
async fn a_message_over_the_limit_is_refused_from_its_length_prefix() {
    let server = start("").await;
    let (_client, _driver, response, mut stream) =
        open(server.addr, DECIDE, "application/grpc").await;
    // Only the header of a 2 MiB message: the answer needs no more.
    let mut header = vec![0u8];
    header.extend_from_slice(&(2u32 << 20).to_be_bytes());
    stream.send_data(Bytes::from(header), false).expect("send");
    let answer = read_answer(response).await;
    assert_status(
        &answer,
        Code::ResourceExhausted,
        "the request message is too large: 2097152 bytes, the limit is 1048576",
    );
    server.stop().await;
}

// ---------------------------------------------------------------------------
// 13.4: responses that cannot be sent.
// ---------------------------------------------------------------------------

/// A connection whose streams have no flow-control window: the server can
/// send headers, never data.
fn closed_windows() -> h2::client::Builder {
    let mut builder = h2::client::Builder::new();
    builder.initial_window_size(0);
    builder
}

#[tokio::test]
async fn a_response_that_cannot_be_sent_is_cancelled_after_the_write_timeout() {
    let server = start("write_timeout_ms = 300").await;
    let tcp = TcpStream::connect(server.addr).await.expect("connect");
    let (client, mut connection) = closed_windows().handshake(tcp).await.expect("handshake");
    let mut client = client.ready().await.expect("ready");
    let (response, mut stream) = client
        .send_request(
            grpc_request(server.addr, GET_RESOURCE, "application/grpc", HOST),
            false,
        )
        .expect("send headers");
    stream
        .send_data(framed(0, &resource_message("big")), true)
        .expect("send body");
    let response = tokio::select! {
        response = response => response.expect("headers"),
        _ = &mut connection => panic!("connection ended"),
    };
    assert_eq!(response.status(), 200);
    // The 800 KB answer waits for a window that never opens: after the
    // write timeout it is dropped.
    wait_for_metric(&server, &refused("write-timeout"), 1.0).await;
    // Opening the window now gets a reset, not the answer.
    connection
        .set_initial_window_size(1 << 20)
        .expect("open the window");
    let _driver = tokio::spawn(connection);
    let mut body = response.into_body();
    let mut received = 0;
    let reset = loop {
        match body.data().await {
            Some(Ok(chunk)) => received += chunk.len(),
            Some(Err(error)) => break error,
            None => panic!("the answer ended normally after {received} bytes"),
        }
    };
    assert_eq!(reset.reason(), Some(h2::Reason::INTERNAL_ERROR), "{reset}");
    assert_eq!(received, 0);
    drop(client);
    server.stop().await;
}

/// A health check takes no token, and its answer is small enough to go
/// out whole: hyper takes it before it waits for the stream's window. When
/// the peer never opens that window, the answer is held where no poll of
/// the body sees it; after the write timeout the connection is closed.
#[tokio::test]
async fn a_probe_answer_that_cannot_be_sent_closes_its_connection() {
    let server = start("write_timeout_ms = 300").await;
    let tcp = TcpStream::connect(server.addr).await.expect("connect");
    let (client, mut connection) = closed_windows().handshake(tcp).await.expect("handshake");
    let mut client = client.ready().await.expect("ready");
    let mut request = grpc_request(
        server.addr,
        "/grpc.health.v1.Health/Check",
        "application/grpc",
        "",
    );
    request.headers_mut().remove("authorization");
    let (response, mut stream) = client.send_request(request, false).expect("send headers");
    stream.send_data(framed(0, &[]), true).expect("send body");
    let response = tokio::select! {
        response = response => response.expect("headers"),
        _ = &mut connection => panic!("connection ended before the headers"),
    };
    assert_eq!(response.status(), 200);
    let ended = tokio::time::timeout(GUARD, connection).await;
    assert!(ended.is_ok(), "the connection outlived the write timeout");
    wait_for_metric(&server, &refused("write-timeout"), 1.0).await;
    drop(client);
    server.stop().await;
}

#[tokio::test]
async fn bytes_waiting_to_be_sent_are_bounded() {
    // Room for two ~800 KB answers waiting, not three.
    let server = start("max_buffered_response_bytes = 1700000\nwrite_timeout_ms = 600000").await;
    let (mut client, driver) = raw::connect(server.addr, &closed_windows()).await;
    let mut calls = Vec::new();
    for _ in 0..4 {
        let (response, mut stream) = client
            .send_request(
                grpc_request(server.addr, GET_RESOURCE, "application/grpc", HOST),
                false,
            )
            .expect("send headers");
        stream
            .send_data(framed(0, &resource_message("big")), true)
            .expect("send body");
        calls.push(response);
    }
    wait_for_metric(&server, &refused("response-buffer-full"), 2.0).await;
    // The refused answers come as trailers: RESOURCE_EXHAUSTED.
    let mut refused_answers = 0;
    for response in calls {
        let response = tokio::time::timeout(GUARD, response)
            .await
            .expect("headers in time")
            .expect("headers");
        let (code, message) = grpc_status(response.headers());
        if code.is_some() {
            assert_eq!(code, Some(Code::ResourceExhausted as i32));
            assert_eq!(
                message,
                "toolgate's response buffer is full; retry with backoff"
            );
            refused_answers += 1;
            continue;
        }
        // Pending ones: their body waits for a window; check trailers-less
        // data never came.
        drop(response);
    }
    assert_eq!(refused_answers, 2);
    // Other callers are unaffected, and the bytes come back with the
    // connection: then a big answer fits again.
    drop(client);
    driver.abort();
    let waited = tokio::time::timeout(GUARD, async {
        loop {
            let read = server
                .resources()
                .get_resource(authed(
                    pb::GetResourceRequest {
                        name: "big".into(),
                        ..Default::default()
                    },
                    HOST,
                ))
                .await;
            match read {
                Ok(resource) => return resource.into_inner(),
                Err(status) => {
                    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    })
    .await
    .expect("the budget comes back when the connection closes");
    assert_eq!(waited.value_json.len(), BIG + 2);
    server.stop().await;
}

/// The HTTP/2 frames of a client with huge windows that sends `streams`
/// GetResource calls for `big` and then never reads its socket.
fn never_reading_client(streams: u32) -> Vec<u8> {
    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let length = u32::try_from(payload.len()).expect("small").to_be_bytes();
        let mut out = vec![length[1], length[2], length[3], kind, flags];
        out.extend_from_slice(&stream.to_be_bytes());
        out.extend_from_slice(payload);
        out
    }
    fn literal(name: &str, value: &str, out: &mut Vec<u8>) {
        // Literal header field without indexing, new name, no Huffman.
        out.push(0x00);
        out.push(u8::try_from(name.len()).expect("short"));
        out.extend_from_slice(name.as_bytes());
        out.push(u8::try_from(value.len()).expect("short"));
        out.extend_from_slice(value.as_bytes());
    }
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    let mut settings = vec![0x00, 0x04];
    settings.extend_from_slice(&0x7fff_ffffu32.to_be_bytes());
    out.extend(frame(0x4, 0, 0, &settings));
    out.extend(frame(0x4, 0x1, 0, &[]));
    out.extend(frame(0x8, 0, 0, &(0x7fff_ffffu32 - 65_535).to_be_bytes()));
    let message = framed(0, &resource_message("big"));
    for index in 0..streams {
        let stream = 1 + 2 * index;
        let mut block = Vec::new();
        literal(":method", "POST", &mut block);
        literal(":scheme", "http", &mut block);
        literal(":path", GET_RESOURCE, &mut block);
        literal(":authority", "localhost", &mut block);
        literal("content-type", "application/grpc", &mut block);
        literal("te", "trailers", &mut block);
        literal("authorization", &format!("Bearer {HOST}"), &mut block);
        out.extend(frame(0x1, 0x4, stream, &block));
        out.extend(frame(0x0, 0x1, stream, &message));
    }
    out
}

#[tokio::test]
async fn a_peer_that_stops_reading_its_socket_is_disconnected() {
    let server = start("write_timeout_ms = 300").await;
    let mut tcp = TcpStream::connect(server.addr).await.expect("connect");
    // 40 answers of 800 KB (32 MB): far more than the socket buffers take.
    tcp.write_all(&never_reading_client(40))
        .await
        .expect("write");
    wait_for_metric(&server, &closed("write-timeout"), 1.0).await;
    // Everything held for it is freed: a big answer fits in the budget.
    let resource = server.resource(HOST, "big").await;
    assert_eq!(resource.value_json.len(), BIG + 2);
    assert_eq!(server.health().await, ServingStatus::Serving);
    drop(tcp);
    server.stop().await;
}

// ---------------------------------------------------------------------------
// 13.11: requests that are not one well-formed gRPC message.
// ---------------------------------------------------------------------------

#[tokio::test]
async fn requests_that_are_not_one_grpc_message_are_invalid_argument() {
    let server = start("").await;
    let addr = server.addr;
    let message = decide_message("c1");
    let cases: Vec<(&str, &str, Bytes, u16, i32, &str)> = vec![
        (
            "a JSON content type",
            "application/json",
            framed(0, &message),
            415,
            3,
            "content-type: must be application/grpc (optionally +proto or ;parameters)",
        ),
        (
            "a look-alike content type",
            "application/grpcx",
            framed(0, &message),
            415,
            3,
            "content-type: must be application/grpc (optionally +proto or ;parameters)",
        ),
        (
            "two messages in a unary call",
            "application/grpc",
            [framed(0, &message), framed(0, &message)].concat().into(),
            200,
            3,
            "request: the call carries 2 request messages; it takes exactly one",
        ),
        (
            "no message",
            "application/grpc",
            Bytes::new(),
            200,
            3,
            "request: the call carries no request message",
        ),
        (
            "the compressed flag without grpc-encoding",
            "application/grpc",
            framed(1, &message),
            200,
            3,
            "request: the message is marked compressed but the request names no grpc-encoding",
        ),
        (
            "a compressed flag of 2",
            "application/grpc+proto",
            framed(2, &message),
            200,
            3,
            "request: the message's compressed flag must be 0 or 1, not 2",
        ),
        (
            "a body that ends inside the message",
            "application/grpc",
            framed(0, &message).slice(..8),
            200,
            3,
            "request: the body ends inside a message: 3 of 50 bytes",
        ),
        (
            "invalid UTF-8 in the session's actor",
            "application/grpc",
            framed(0, &{
                let mut bytes = message.clone();
                let at = bytes
                    .windows(5)
                    .position(|window| window == b"payer")
                    .expect("actor");
                bytes[at] = 0xff;
                bytes
            }),
            200,
            3,
            "session.actor: invalid string value: data is not UTF-8 encoded (not valid protobuf)",
        ),
    ];
    // Every one is refused before any handler: counted as malformed (the
    // undecodable protobuf too).
    let malformed = cases.len() as f64;
    for (name, content_type, body, http, code, text) in cases {
        let answer = raw_call(addr, DECIDE, content_type, body).await;
        assert_eq!(
            (answer.http, answer.code, answer.message.as_str()),
            (http, Some(code), text),
            "{name}"
        );
    }
    // None of them decided anything; a well-formed call still does.
    let answer = raw_call(addr, DECIDE, "application/grpc", framed(0, &message)).await;
    assert_eq!(answer.code, Some(0), "{answer:?}");
    assert!(answer.received > 0);
    let samples = server.metrics().await;
    assert_eq!(
        sample(
            &samples,
            r#"toolgate_decisions_total{outcome="allow",reason="allowed"}"#
        ),
        1.0
    );
    assert_eq!(
        sample(
            &samples,
            r#"toolgate_transport_refused_total{reason="malformed"}"#
        ),
        malformed
    );
    server.stop().await;
}
