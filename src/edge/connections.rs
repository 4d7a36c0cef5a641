//! The gRPC listener's accept loop and the bookkeeping of open connections.
//!
//! tonic's own accept loop keeps every connection it accepts for as long as
//! the peer keeps the socket open, and retries a failing `accept` at once
//! (at the descriptor limit it spins). Here toolgate owns the loop:
//!
//! - a connection has [`ConnectionSettings::handshake_timeout`] to send the
//!   HTTP/2 preface and its first request, else it is closed;
//! - at most `max_connections` are open, and at most
//!   `max_connections_per_peer` from one IP address. At a cap, a new
//!   connection closes the oldest one with no call in flight (one that never
//!   made a request first); when every open connection is busy, the new one
//!   is closed at once. So silent connections can never lock out a health
//!   probe;
//! - a failing `accept` backs off (5 ms doubling to 1 s), and at the
//!   descriptor limit (`EMFILE`, `ENFILE`) also closes an idle connection to
//!   free a descriptor;
//! - a socket write that cannot make progress for `write_timeout` (a peer
//!   that stopped reading its TCP stream) closes the connection, which frees
//!   everything buffered for it.
//!
//! - with TLS, a connection is accepted here and its TLS handshake runs in
//!   the connection's own task on its first read or write (so a slow
//!   handshake holds up nobody else); it counts against the handshake
//!   timeout. Each connection takes the TLS configuration in force when it
//!   was accepted ([`ServerTls`]), so a reload never drops one.
//!
//! Each connection's [`ConnectionInfo`] rides in the request extensions: the
//! overload layer marks the connection as having made a request and counts
//! its calls in flight; auth reads the verified client certificate.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures_util::task::AtomicWaker;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Sleep;
use tonic::transport::server::{Connected, TcpConnectInfo};

use crate::domain::policy::PeerCertificate;
use crate::ops::metrics::CloseReason;
use crate::ops::metrics::Metrics;
use crate::ops::tls::{ServerTls, peer_certificate};

/// The connection limits (the policy's `[server]` section).
#[derive(Debug, Clone)]
pub(crate) struct ConnectionSettings {
    pub max_connections: usize,
    pub max_connections_per_peer: usize,
    pub handshake_timeout: Duration,
    pub write_timeout: Duration,
}

impl From<&crate::domain::policy::ServerSettings> for ConnectionSettings {
    fn from(settings: &crate::domain::policy::ServerSettings) -> Self {
        ConnectionSettings {
            max_connections: settings.max_connections,
            max_connections_per_peer: settings.max_connections_per_peer,
            handshake_timeout: settings.handshake_timeout,
            write_timeout: settings.write_timeout,
        }
    }
}

/// The first pause after a failed `accept`; it doubles up to [`MAX_BACKOFF`].
pub(crate) const MIN_BACKOFF: Duration = Duration::from_millis(5);
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// What is known about one open connection.
#[derive(Debug)]
struct ConnectionState {
    id: u64,
    peer: SocketAddr,
    local: Option<SocketAddr>,
    opened: Instant,
    /// Set by the first request on the connection.
    spoken: AtomicBool,
    /// Calls whose response has not finished.
    in_flight: AtomicUsize,
    /// Set when toolgate closes the connection; the I/O then fails.
    closing: AtomicBool,
    /// The connection task, woken to notice `closing`.
    waker: AtomicWaker,
    /// The client certificate the TLS handshake verified (mTLS), set once
    /// the handshake is done, before any request can arrive.
    peer_certificate: OnceLock<PeerCertificate>,
}

impl ConnectionState {
    fn close(&self) {
        self.closing.store(true, Ordering::Release);
        self.waker.wake();
    }
}

/// The connection a request came on, in its extensions.
#[derive(Debug, Clone)]
pub(crate) struct ConnectionInfo {
    state: Arc<ConnectionState>,
}

impl ConnectionInfo {
    /// Marks the connection as having made a request and counts the call as
    /// in flight until the returned guard is dropped.
    pub(crate) fn call_started(&self) -> CallGuard {
        self.probe_started();
        self.state.in_flight.fetch_add(1, Ordering::AcqRel);
        CallGuard {
            state: Arc::clone(&self.state),
        }
    }

    /// Marks the connection as having made a request, not counted in
    /// flight: a health or reflection call, which takes no token, never
    /// keeps its connection from eviction (a `Health/Watch` never ends).
    pub(crate) fn probe_started(&self) {
        self.state.spoken.store(true, Ordering::Release);
    }

    /// What closes this connection from outside its task.
    pub(crate) fn closer(&self) -> Closer {
        Closer(Arc::clone(&self.state))
    }

    /// The verified client certificate, on an mTLS connection.
    pub(crate) fn peer_certificate(&self) -> Option<&PeerCertificate> {
        self.state.peer_certificate.get()
    }

    pub(crate) fn tcp_info(&self) -> TcpConnectInfo {
        TcpConnectInfo {
            local_addr: self.state.local,
            remote_addr: Some(self.state.peer),
        }
    }
}

/// Closes a connection from outside its task: for a response its peer
/// stopped reading, which HTTP/2 holds where no timer of the connection's
/// own sees it (a stream window the peer never opens).
#[derive(Debug, Clone)]
pub(crate) struct Closer(Arc<ConnectionState>);

impl Closer {
    pub(crate) fn close(&self) {
        self.0.close();
    }
}

/// A call in flight on a connection (see [`ConnectionInfo::call_started`]).
#[derive(Debug)]
pub(crate) struct CallGuard {
    state: Arc<ConnectionState>,
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        self.state.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

#[derive(Debug, Default)]
struct Registry {
    next_id: u64,
    open: HashMap<u64, Arc<ConnectionState>>,
    per_peer: HashMap<IpAddr, usize>,
}

impl Registry {
    fn remove(&mut self, id: u64) -> bool {
        let Some(state) = self.open.remove(&id) else {
            return false;
        };
        let ip = state.peer.ip();
        if let Some(count) = self.per_peer.get_mut(&ip) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.per_peer.remove(&ip);
            }
        }
        true
    }

    /// Closes the oldest connection without calls in flight, one that never
    /// made a request first, from `peer` only when given. False when every
    /// candidate is busy.
    fn evict(&mut self, peer: Option<IpAddr>) -> bool {
        let victim = self
            .open
            .values()
            .filter(|state| peer.is_none_or(|ip| state.peer.ip() == ip))
            .filter(|state| state.in_flight.load(Ordering::Acquire) == 0)
            .min_by_key(|state| (state.spoken.load(Ordering::Acquire), state.opened))
            .map(Arc::clone);
        match victim {
            Some(victim) => {
                self.remove(victim.id);
                victim.close();
                true
            }
            None => false,
        }
    }
}

#[derive(Debug)]
struct Shared {
    settings: ConnectionSettings,
    tls: Option<ServerTls>,
    registry: Mutex<Registry>,
    metrics: Arc<Metrics>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Registry> {
        // The registry is plain counts and handles: a panic elsewhere leaves
        // it usable.
        self.registry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The open connections; cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Connections {
    shared: Arc<Shared>,
}

impl Connections {
    /// Plaintext connections, or TLS ones with `tls`.
    pub(crate) fn new(
        settings: ConnectionSettings,
        tls: Option<ServerTls>,
        metrics: Arc<Metrics>,
    ) -> Connections {
        Connections {
            shared: Arc::new(Shared {
                settings,
                tls,
                registry: Mutex::new(Registry::default()),
                metrics,
            }),
        }
    }

    /// The incoming stream for tonic's `serve_with_incoming_shutdown`: it
    /// never yields an error (failures are retried here, with backoff).
    pub(crate) fn incoming(
        &self,
        listener: TcpListener,
    ) -> impl futures_util::Stream<Item = Result<Connection, io::Error>> + Send + use<> {
        futures_util::stream::unfold(
            (listener, self.clone()),
            |(listener, connections)| async move {
                let connection = connections.accept(&listener).await;
                Some((Ok(connection), (listener, connections)))
            },
        )
    }

    async fn accept(&self, listener: &TcpListener) -> Connection {
        let mut backoff = MIN_BACKOFF;
        loop {
            match listener.accept().await {
                Ok((stream, peer)) => {
                    backoff = MIN_BACKOFF;
                    if let Some(connection) = self.admit(stream, peer) {
                        return connection;
                    }
                }
                Err(error) => {
                    let descriptors = matches!(error.raw_os_error(), Some(23 | 24));
                    if descriptors {
                        // EMFILE / ENFILE: the pending connection stays in
                        // the backlog; make room for it.
                        let evicted = self.shared.lock().evict(None);
                        if evicted {
                            self.shared.metrics.connection_closed(CloseReason::Evicted);
                        }
                    }
                    if backoff == MIN_BACKOFF {
                        tracing::warn!(%error, "accept failed; backing off");
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }

    fn admit(&self, stream: TcpStream, peer: SocketAddr) -> Option<Connection> {
        let settings = &self.shared.settings;
        let state = {
            let mut registry = self.shared.lock();
            let ip = peer.ip();
            let from_peer = registry.per_peer.get(&ip).copied().unwrap_or(0);
            let mut evicted = 0;
            if from_peer >= settings.max_connections_per_peer {
                if !registry.evict(Some(ip)) {
                    drop(registry);
                    self.shared.metrics.connection_closed(CloseReason::Refused);
                    return None;
                }
                evicted += 1;
            }
            if registry.open.len() >= settings.max_connections {
                if !registry.evict(None) {
                    drop(registry);
                    for _ in 0..evicted {
                        self.shared.metrics.connection_closed(CloseReason::Evicted);
                    }
                    self.shared.metrics.connection_closed(CloseReason::Refused);
                    return None;
                }
                evicted += 1;
            }
            registry.next_id += 1;
            let state = Arc::new(ConnectionState {
                id: registry.next_id,
                peer,
                local: stream.local_addr().ok(),
                opened: Instant::now(),
                spoken: AtomicBool::new(false),
                in_flight: AtomicUsize::new(0),
                closing: AtomicBool::new(false),
                waker: AtomicWaker::new(),
                peer_certificate: OnceLock::new(),
            });
            registry.open.insert(state.id, Arc::clone(&state));
            *registry.per_peer.entry(ip).or_insert(0) += 1;
            for _ in 0..evicted {
                self.shared.metrics.connection_closed(CloseReason::Evicted);
            }
            self.shared.metrics.connections_open(registry.open.len());
            state
        };
        // TCP_NODELAY: replies are small; without it Nagle's algorithm and
        // delayed ACKs hold many of them back for ~40 ms.
        let _ = stream.set_nodelay(true);
        let stream = match &self.shared.tls {
            None => Transport::Plain(stream),
            Some(tls) => Transport::Handshaking(Box::new(tls.acceptor().accept(stream))),
        };
        Some(Connection {
            stream,
            handshake: Some(Box::pin(tokio::time::sleep(settings.handshake_timeout))),
            write_stall: None,
            state,
            shared: Arc::clone(&self.shared),
        })
    }
}

/// What a connection's bytes travel over.
enum Transport {
    Plain(TcpStream),
    /// The TLS handshake, driven by the first read or write (boxed: the
    /// rustls connection state is large, a plain connection small).
    Handshaking(Box<tokio_rustls::Accept<TcpStream>>),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
    /// The handshake failed; every read and write fails.
    Failed,
}

/// An accepted TCP connection, with its deadlines.
pub(crate) struct Connection {
    stream: Transport,
    state: Arc<ConnectionState>,
    shared: Arc<Shared>,
    /// Until the first request: closes the connection when it fires.
    handshake: Option<Pin<Box<Sleep>>>,
    /// While a write is blocked: closes the connection when it fires.
    write_stall: Option<Pin<Box<Sleep>>>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Connection")
            .field("peer", &self.state.peer)
            .finish_non_exhaustive()
    }
}

impl Connection {
    fn close(&mut self, reason: CloseReason) -> io::Error {
        let removed = self.shared.lock().remove(self.state.id);
        self.state.closing.store(true, Ordering::Release);
        if removed {
            self.shared.metrics.connection_closed(reason);
        }
        let message = match reason {
            CloseReason::HandshakeTimeout => "no HTTP/2 preface and first request in time",
            CloseReason::WriteTimeout => "the peer stopped reading",
            CloseReason::Evicted | CloseReason::Refused => "closed to make room",
        };
        io::Error::new(io::ErrorKind::TimedOut, message)
    }

    /// Fails once toolgate has closed the connection or its handshake time
    /// is over.
    fn check(&mut self, context: &mut Context<'_>) -> io::Result<()> {
        self.state.waker.register(context.waker());
        if self.state.closing.load(Ordering::Acquire) {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "closed by toolgate (to make room, or its peer stopped reading)",
            ));
        }
        if let Some(handshake) = &mut self.handshake {
            if self.state.spoken.load(Ordering::Acquire) {
                self.handshake = None;
            } else if handshake.as_mut().poll(context).is_ready() {
                return Err(self.close(CloseReason::HandshakeTimeout));
            }
        }
        Ok(())
    }

    /// Drives the TLS handshake (if one is under way): ready once the
    /// bytes can flow. A failed handshake fails the connection.
    fn poll_transport(&mut self, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        let Transport::Handshaking(accept) = &mut self.stream else {
            return match self.stream {
                Transport::Failed => Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    "tls handshake failed",
                ))),
                _ => Poll::Ready(Ok(())),
            };
        };
        match Pin::new(accept.as_mut()).poll(context) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(stream)) => {
                if let Some(certificate) = stream
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|chain| chain.first())
                    .and_then(|leaf| peer_certificate(leaf))
                {
                    let _ = self.state.peer_certificate.set(certificate);
                }
                self.stream = Transport::Tls(Box::new(stream));
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(error)) => {
                // Not an audit event: scanners and misconfigured clients
                // would flood it. Never the certificate's contents.
                tracing::debug!(peer = %self.state.peer, %error, "tls handshake failed");
                self.stream = Transport::Failed;
                Poll::Ready(Err(error))
            }
        }
    }

    /// Tracks a write's progress: a write pending for longer than the write
    /// timeout closes the connection.
    fn progress<T>(
        &mut self,
        context: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match polled {
            Poll::Pending => {
                let timeout = self.shared.settings.write_timeout;
                let stall = self
                    .write_stall
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                if stall.as_mut().poll(context).is_ready() {
                    return Poll::Ready(Err(self.close(CloseReason::WriteTimeout)));
                }
                Poll::Pending
            }
            ready => {
                self.write_stall = None;
                ready
            }
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        let mut registry = self.shared.lock();
        registry.remove(self.state.id);
        self.shared.metrics.connections_open(registry.open.len());
    }
}

impl Connected for Connection {
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> ConnectionInfo {
        ConnectionInfo {
            state: Arc::clone(&self.state),
        }
    }
}

/// `$poll` on the transport's stream once the handshake is done.
macro_rules! on_stream {
    ($connection:expr, $context:expr, |$stream:ident| $poll:expr) => {{
        match $connection.poll_transport($context) {
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(error)) => return Poll::Ready(Err(error)),
            Poll::Pending => return Poll::Pending,
        }
        match &mut $connection.stream {
            Transport::Plain($stream) => $poll,
            Transport::Tls(tls) => {
                let $stream = tls.as_mut();
                $poll
            }
            Transport::Handshaking(_) | Transport::Failed => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "tls handshake not done",
            ))),
        }
    }};
}

impl AsyncRead for Connection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffer: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.check(context)?;
        on_stream!(self, context, |stream| Pin::new(stream)
            .poll_read(context, buffer))
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        bytes: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.check(context)?;
        let polled = on_stream!(self, context, |stream| Pin::new(stream)
            .poll_write(context, bytes));
        self.progress(context, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffers: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.check(context)?;
        let polled = on_stream!(self, context, |stream| Pin::new(stream)
            .poll_write_vectored(context, buffers));
        self.progress(context, polled)
    }

    fn is_write_vectored(&self) -> bool {
        match &self.stream {
            Transport::Plain(stream) => stream.is_write_vectored(),
            Transport::Tls(stream) => stream.is_write_vectored(),
            Transport::Handshaking(_) | Transport::Failed => false,
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.check(context)?;
        let polled = on_stream!(self, context, |stream| Pin::new(stream).poll_flush(context));
        self.progress(context, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.stream {
            Transport::Plain(stream) => Pin::new(stream).poll_shutdown(context),
            Transport::Tls(stream) => Pin::new(stream.as_mut()).poll_shutdown(context),
            Transport::Handshaking(_) | Transport::Failed => Poll::Ready(Ok(())),
        }
    }
}
