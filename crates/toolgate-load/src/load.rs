//! The two load models over real gRPC, and what one round of either
//! measures.
//!
//! - Closed loop: `concurrency` callers, each sends, waits for the answer,
//!   sends again. Maximum throughput; latency from each send.
//! - Open loop: request `i` is scheduled at `t0 + i / rate` by a dedicated
//!   OS thread, whatever the answers do. Latency is measured from the
//!   scheduled time, so a late send (the scheduler or the driver woke late,
//!   or every in-flight slot was taken) counts its wait: no coordinated
//!   omission.
//!
//! Requests are spread over several HTTP/2 connections, and each call goes
//! through the lean client of `grpc` (straight on h2), so that the load
//! generator costs less CPU per call than the server it measures.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use hdrhistogram::Histogram;
use http::HeaderValue;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;

use envoy_types::pb::envoy::service::auth::v3::{CheckRequest, CheckResponse};
use toolgate::pb;
use toolgate::pb::policy_decision_point_client::PolicyDecisionPointClient;

use crate::callgrind::Instructions;
use crate::grpc::{self, Caller, Connection, Method};
use crate::servers::{DatabaseCounters, ServerProcess, StoreCounters, machine_busy, own_cpu_time};

/// toolgate's host API through tonic, for the setup calls (not measured).
pub type PdpClient = PolicyDecisionPointClient<Channel>;

/// How long one call may take before the load generator gives up on it.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Most requests in flight in the open loop; later ones wait (and their
/// wait counts, as it is measured from the schedule).
pub const OPEN_LOOP_MAX_IN_FLIGHT: usize = 4096;

/// What a well-behaved toolgate answers (checked only against toolgate; the
/// baseline's fixed answer is not checked).
#[derive(Debug, Clone)]
pub enum Expect {
    Decide {
        outcome: pb::Outcome,
        reason: &'static str,
    },
    /// `DISPATCH_STATUS_OK` with `replayed`.
    Replayed,
    /// `DISPATCH_STATUS_OK`, not replayed; the new version of the slot's
    /// resource is written back so the next proposal for it is current.
    Committed {
        versions: Arc<Vec<AtomicU64>>,
        slot: usize,
    },
    /// `DISPATCH_STATUS_OK`, committed once (the first answer not
    /// replayed, counted in `commits[position]`, its new version written
    /// back as for `Committed`) and replayed otherwise.
    Once {
        commits: Arc<Vec<AtomicU64>>,
        position: usize,
        versions: Arc<Vec<AtomicU64>>,
        slot: usize,
    },
    /// Accepted, `ASSESS_REASON_MATCHED`.
    Matched,
    /// An ext_authz Check let through with this reason.
    CheckAllowed { reason: &'static str },
}

/// One request of a scenario.
#[derive(Debug, Clone)]
pub enum Call {
    Decide(pb::DecideRequest, Expect),
    Dispatch(pb::DispatchRequest, Expect),
    Assess(pb::AssessManifestRequest, Expect),
    /// Boxed: a Check is most of the enum's size.
    Check(Box<CheckRequest>, Expect),
}

/// Makes request `index` of a round; `None` ends the round (a finite pool).
pub type Generator = Arc<dyn Fn(u64) -> Option<Call> + Send + Sync>;

/// A call ready for the wire: its method, its request as one gRPC frame,
/// and what its answer is checked against.
struct Encoded {
    method: Method,
    frame: Bytes,
    expect: Expect,
}

impl Encoded {
    /// Encodes `call`'s request straight from the generator's message
    /// into `buffer` (no copy of the message).
    fn new(call: Call, buffer: &mut BytesMut) -> Encoded {
        let (method, frame, expect) = match call {
            Call::Decide(request, expect) => {
                (Method::Decide, grpc::frame(&request, buffer), expect)
            }
            Call::Dispatch(request, expect) => {
                (Method::Dispatch, grpc::frame(&request, buffer), expect)
            }
            Call::Assess(request, expect) => (
                Method::AssessManifest,
                grpc::frame(&request, buffer),
                expect,
            ),
            Call::Check(request, expect) => (Method::Check, grpc::frame(&*request, buffer), expect),
        };
        Encoded {
            method,
            frame,
            expect,
        }
    }
}

/// How one call ended.
enum Answer {
    Ok,
    Wrong(String),
    Error(tonic::Code, String),
}

/// `message` with the bearer token in its metadata.
pub fn with_token<T>(
    message: T,
    token: &MetadataValue<tonic::metadata::Ascii>,
) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("authorization", token.clone());
    request
}

/// Makes one measured call and checks its answer (when `check`).
async fn execute(caller: &mut Caller, call: Encoded, check: bool) -> Answer {
    let Encoded {
        method,
        frame,
        expect,
    } = call;
    let answered = tokio::time::timeout(CALL_TIMEOUT, async {
        match method {
            Method::Decide => {
                let answer = caller.unary::<pb::DecideResponse>(method, frame).await?;
                Ok(check.then(|| check_decide(&answer, &expect)).flatten())
            }
            Method::Dispatch => {
                let answer = caller.unary::<pb::DispatchResponse>(method, frame).await?;
                Ok(check.then(|| check_dispatch(&answer, &expect)).flatten())
            }
            Method::AssessManifest => {
                let answer = caller
                    .unary::<pb::AssessManifestResponse>(method, frame)
                    .await?;
                Ok(check.then(|| check_assess(&answer, &expect)).flatten())
            }
            Method::Check => {
                let answer = caller.unary::<CheckResponse>(method, frame).await?;
                Ok(check.then(|| check_authz(&answer, &expect)).flatten())
            }
        }
    })
    .await;
    match answered {
        Err(_) => Answer::Error(
            tonic::Code::DeadlineExceeded,
            "no answer within the load generator's timeout".into(),
        ),
        Ok(Err::<_, tonic::Status>(status)) => {
            Answer::Error(status.code(), status.message().to_string())
        }
        Ok(Ok(None)) => Answer::Ok,
        Ok(Ok(Some(wrong))) => Answer::Wrong(wrong),
    }
}

fn check_decide(answer: &pb::DecideResponse, expect: &Expect) -> Option<String> {
    let Expect::Decide { outcome, reason } = expect else {
        return Some("decide with a non-decide expectation".into());
    };
    (answer.outcome != i32::from(*outcome) || answer.reason != *reason).then(|| {
        format!(
            "decide: expected {outcome:?} {reason}, got {:?} {} ({})",
            pb::Outcome::try_from(answer.outcome).unwrap_or(pb::Outcome::Unspecified),
            answer.reason,
            answer.message
        )
    })
}

fn check_dispatch(answer: &pb::DispatchResponse, expect: &Expect) -> Option<String> {
    let ok = answer.status == i32::from(pb::DispatchStatus::Ok);
    let wrong = || {
        format!(
            "dispatch: expected {expect_name}, got {:?} {} replayed={} ({})",
            pb::DispatchStatus::try_from(answer.status).unwrap_or(pb::DispatchStatus::Unspecified),
            answer.reason,
            answer.replayed,
            answer.message,
            expect_name = match expect {
                Expect::Replayed => "OK replayed",
                Expect::Once { .. } => "OK committed once, replayed otherwise",
                _ => "OK committed",
            }
        )
    };
    match expect {
        Expect::Replayed => (!(ok && answer.replayed)).then(wrong),
        Expect::Committed { versions, slot } => {
            if ok && !answer.replayed {
                if let Some(version) = versions.get(*slot) {
                    version.store(answer.version, Ordering::Relaxed);
                }
                None
            } else {
                Some(wrong())
            }
        }
        Expect::Once {
            commits,
            position,
            versions,
            slot,
        } => {
            if !ok {
                return Some(wrong());
            }
            if answer.replayed {
                return None;
            }
            if let Some(version) = versions.get(*slot) {
                version.store(answer.version, Ordering::Relaxed);
            }
            let committed_before = commits
                .get(*position)
                .map_or(0, |count| count.fetch_add(1, Ordering::Relaxed));
            (committed_before > 0).then(|| {
                format!(
                    "dispatch: the grant of proposal {position} committed {} times",
                    committed_before + 1
                )
            })
        }
        _ => Some("dispatch with a non-dispatch expectation".into()),
    }
}

fn check_assess(answer: &pb::AssessManifestResponse, _expect: &Expect) -> Option<String> {
    (!answer.accepted || answer.reason != i32::from(pb::AssessReason::Matched)).then(|| {
        format!(
            "assess: expected accepted MATCHED, got accepted={} reason={}",
            answer.accepted, answer.reason
        )
    })
}

fn check_authz(answer: &CheckResponse, expect: &Expect) -> Option<String> {
    let Expect::CheckAllowed { reason } = expect else {
        return Some("check with a non-check expectation".into());
    };
    let found = answer
        .dynamic_metadata
        .as_ref()
        .and_then(|metadata| metadata.fields.get("reason"))
        .and_then(|value| match &value.kind {
            Some(envoy_types::pb::google::protobuf::value::Kind::StringValue(text)) => {
                Some(text.as_str())
            }
            _ => None,
        });
    let code = answer.status.as_ref().map_or(-1, |status| status.code);
    (code != 0 || found != Some(*reason))
        .then(|| format!("check: expected OK {reason}, got code {code} reason {found:?}"))
}

/// Latencies in nanoseconds, 1 ns to 60 s, 3 significant digits.
pub fn new_histogram() -> Histogram<u64> {
    match Histogram::new_with_bounds(1, 60_000_000_000, 3) {
        Ok(histogram) => histogram,
        Err(error) => unreachable!("constant histogram bounds are valid: {error}"),
    }
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// What one round against one server measured.
#[derive(Debug, Clone)]
pub struct RoundStats {
    pub latency: Histogram<u64>,
    /// Open loop: how late each request was sent after its scheduled time.
    pub send_lag: Option<Histogram<u64>>,
    /// Answers received in the measured window (gRPC OK, right or wrong).
    pub completed: u64,
    pub errors: BTreeMap<String, u64>,
    pub first_error: Option<String>,
    pub wrong: u64,
    pub first_wrong: Option<String>,
    pub elapsed: Duration,
    pub server_cpu: Duration,
    /// The PostgreSQL server's CPU time (postgres stores; zero otherwise).
    pub database_cpu: Duration,
    pub client_cpu: Duration,
    /// CPU time the rest of the machine used meanwhile (other processes,
    /// steal): a round where it is large was disturbed.
    pub foreign_cpu: Duration,
    /// Rounds merged into these stats, and how many were repeated because
    /// something else used the CPUs.
    pub rounds: u32,
    pub repeated: u32,
    /// The p99 of each round, to tell one stall from a steady tail.
    pub round_p99s: Vec<Duration>,
    /// The answers per second of each round, in the order they ran (a
    /// server runs one round per alternation): for a ratio per alternation.
    pub round_rates: Vec<f64>,
    /// The generator ran out of requests before the round's end.
    pub exhausted: bool,
    /// What the store's group commit did during the round (toolgate's
    /// `/metrics`, read before and after it; zero for the baseline).
    pub store: StoreCounters,
    /// What `pg_stat_statements` counted meanwhile (postgres servers).
    pub database: Option<DatabaseCounters>,
    /// The server's instructions in the measured window (`--callgrind`).
    pub instructions: Option<Instructions>,
}

impl RoundStats {
    pub(crate) fn empty() -> Self {
        RoundStats {
            latency: new_histogram(),
            send_lag: None,
            completed: 0,
            errors: BTreeMap::new(),
            first_error: None,
            wrong: 0,
            first_wrong: None,
            elapsed: Duration::ZERO,
            server_cpu: Duration::ZERO,
            database_cpu: Duration::ZERO,
            client_cpu: Duration::ZERO,
            foreign_cpu: Duration::ZERO,
            rounds: 0,
            repeated: 0,
            round_p99s: Vec::new(),
            round_rates: Vec::new(),
            exhausted: false,
            store: StoreCounters::default(),
            database: None,
            instructions: None,
        }
    }

    fn record(&mut self, latency: Duration, answer: Answer) {
        match answer {
            Answer::Ok => {
                self.completed += 1;
                self.latency.saturating_record(nanos(latency).max(1));
            }
            Answer::Wrong(message) => {
                self.completed += 1;
                self.wrong += 1;
                self.latency.saturating_record(nanos(latency).max(1));
                self.first_wrong.get_or_insert(message);
            }
            Answer::Error(code, message) => {
                *self.errors.entry(format!("{code:?}")).or_insert(0) += 1;
                self.first_error
                    .get_or_insert_with(|| format!("{code:?}: {message}"));
            }
        }
    }

    /// Adds another round of the same server and scenario.
    pub fn merge(&mut self, other: &RoundStats) {
        let _ = self.latency.add(&other.latency);
        match (&mut self.send_lag, &other.send_lag) {
            (Some(mine), Some(theirs)) => {
                let _ = mine.add(theirs);
            }
            (None, Some(theirs)) => self.send_lag = Some(theirs.clone()),
            _ => {}
        }
        self.completed += other.completed;
        for (code, count) in &other.errors {
            *self.errors.entry(code.clone()).or_insert(0) += count;
        }
        if self.first_error.is_none() {
            self.first_error.clone_from(&other.first_error);
        }
        self.wrong += other.wrong;
        if self.first_wrong.is_none() {
            self.first_wrong.clone_from(&other.first_wrong);
        }
        self.elapsed += other.elapsed;
        self.server_cpu += other.server_cpu;
        self.database_cpu += other.database_cpu;
        self.client_cpu += other.client_cpu;
        self.foreign_cpu += other.foreign_cpu;
        self.rounds += other.rounds;
        self.repeated += other.repeated;
        self.round_p99s.extend_from_slice(&other.round_p99s);
        self.round_rates.extend_from_slice(&other.round_rates);
        self.exhausted |= other.exhausted;
        self.store.add(&other.store);
        match (&mut self.database, &other.database) {
            (Some(mine), Some(theirs)) => mine.add(theirs),
            (None, Some(theirs)) => self.database = Some(*theirs),
            _ => {}
        }
        match (&mut self.instructions, &other.instructions) {
            (Some(mine), Some(theirs)) => mine.add(theirs),
            (None, Some(theirs)) => self.instructions = Some(*theirs),
            _ => {}
        }
    }

    pub fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }

    /// Answers per second in the measured window.
    pub fn throughput(&self) -> f64 {
        let seconds = self.elapsed.as_secs_f64();
        if seconds <= 0.0 {
            return 0.0;
        }
        self.completed as f64 / seconds
    }

    pub fn percentile(&self, quantile: f64) -> Duration {
        Duration::from_nanos(self.latency.value_at_quantile(quantile))
    }

    pub fn max(&self) -> Duration {
        Duration::from_nanos(self.latency.max())
    }

    /// The median of the rounds' p99s (robust to one stalled round).
    pub fn median_round_p99(&self) -> Duration {
        let mut p99s = self.round_p99s.clone();
        p99s.sort();
        p99s.get(p99s.len() / 2).copied().unwrap_or_default()
    }

    /// Server CPU time per answered request.
    pub fn server_cpu_per_request(&self) -> Duration {
        match self.completed {
            0 => Duration::ZERO,
            count => self.server_cpu / u32::try_from(count).unwrap_or(u32::MAX),
        }
    }

    /// The PostgreSQL server's CPU time per answered request.
    pub fn database_cpu_per_request(&self) -> Duration {
        match self.completed {
            0 => Duration::ZERO,
            count => self.database_cpu / u32::try_from(count).unwrap_or(u32::MAX),
        }
    }

    /// Cores' worth of CPU that other processes used during the rounds.
    pub fn foreign_load(&self) -> f64 {
        let seconds = self.elapsed.as_secs_f64();
        if seconds <= 0.0 {
            return 0.0;
        }
        self.foreign_cpu.as_secs_f64() / seconds
    }

    pub fn client_cpu_per_request(&self) -> Duration {
        match self.completed {
            0 => Duration::ZERO,
            count => self.client_cpu / u32::try_from(count).unwrap_or(u32::MAX),
        }
    }
}

/// The server a round runs against, with its connections.
pub struct Target<'a> {
    pub server: &'a ServerProcess,
    /// The measured calls' connections (`grpc`'s, not tonic's).
    pub connections: &'a [Connection],
    /// The `authorization` header of every call.
    pub token: HeaderValue,
    /// Check every answer (toolgate) or not (the baseline's fixed answer).
    pub check: bool,
}

/// One timing window: warm-up (not recorded), then the measured part.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    pub warmup: Duration,
    pub duration: Duration,
}

/// Closed loop: `concurrency` callers over the target's connections.
pub async fn closed_loop(
    target: &Target<'_>,
    generator: Generator,
    concurrency: usize,
    window: Window,
) -> RoundStats {
    // Every caller's stats are made before the round starts: a histogram
    // is a few hundred kilobytes to allocate and zero, which, made by the
    // callers themselves, a round without warm-up (a commit round) would
    // count as load; made while callers already run, it would delay the
    // window's start.
    let concurrency = concurrency.max(1);
    let caller_stats: Vec<RoundStats> = (0..concurrency).map(|_| RoundStats::empty()).collect();
    let start = Instant::now();
    let measure_from = start + window.warmup;
    let end = measure_from + window.duration;
    let next_index = Arc::new(AtomicU64::new(0));
    let exhausted = Arc::new(AtomicUsize::new(0));
    let mut callers = Vec::with_capacity(concurrency);
    for (caller, mut stats) in caller_stats.into_iter().enumerate() {
        let connection = &target.connections[caller % target.connections.len()];
        let mut client = Caller::new(connection, &target.token);
        let generator = Arc::clone(&generator);
        let next_index = Arc::clone(&next_index);
        let exhausted = Arc::clone(&exhausted);
        let check = target.check;
        callers.push(tokio::spawn(async move {
            // Reused for every request: its frame is sent (and dropped)
            // before the next one is encoded.
            let mut buffer = BytesMut::new();
            loop {
                let sent = Instant::now();
                if sent >= end {
                    break;
                }
                let index = next_index.fetch_add(1, Ordering::Relaxed);
                let Some(call) = generator(index) else {
                    exhausted.fetch_add(1, Ordering::Relaxed);
                    break;
                };
                let call = Encoded::new(call, &mut buffer);
                let answer = execute(&mut client, call, check).await;
                if sent >= measure_from {
                    stats.record(sent.elapsed(), answer);
                }
            }
            stats
        }));
    }
    // The CPU counters at the start of the measured window.
    tokio::time::sleep_until(measure_from.into()).await;
    let cpu_start = CpuCounters::read(target.server);
    let mut finished_callers = Vec::with_capacity(callers.len());
    for caller in callers {
        if let Ok(stats) = caller.await {
            finished_callers.push(stats);
        }
    }
    // The window ends with the last answer; merging the callers' stats
    // (hundreds of histograms) is bookkeeping, not load, and comes after.
    let finished = Instant::now();
    let cpu = CpuCounters::read(target.server).since(&cpu_start);
    let mut total = RoundStats::empty();
    for stats in &finished_callers {
        total.merge(stats);
    }
    total.elapsed = finished.min(end).saturating_duration_since(measure_from);
    cpu.charge(&mut total);
    total.exhausted = exhausted.load(Ordering::Relaxed) > 0;
    total.rounds = 1;
    total.round_p99s = vec![total.percentile(0.99)];
    total.round_rates = vec![total.throughput()];
    total
}

/// The CPU counters a round's measured window is charged with: the
/// server's, its database's, this process's, and the whole machine's.
struct CpuCounters {
    server: Duration,
    database: Duration,
    client: Duration,
    machine: Duration,
}

impl CpuCounters {
    fn read(server: &ServerProcess) -> CpuCounters {
        CpuCounters {
            server: server.cpu_time(),
            database: server.database_cpu_time(),
            client: own_cpu_time(),
            machine: machine_busy(),
        }
    }

    /// What each counter added since `start`.
    fn since(&self, start: &CpuCounters) -> CpuCounters {
        CpuCounters {
            server: self.server.saturating_sub(start.server),
            database: self.database.saturating_sub(start.database),
            client: self.client.saturating_sub(start.client),
            machine: self.machine.saturating_sub(start.machine),
        }
    }

    /// Puts a window's counts into its stats; what the machine used beyond
    /// the three is foreign.
    fn charge(&self, total: &mut RoundStats) {
        total.server_cpu = self.server;
        total.database_cpu = self.database;
        total.client_cpu = self.client;
        total.foreign_cpu = self
            .machine
            .saturating_sub(self.server + self.database + self.client);
    }
}

/// One scheduled request handed from the scheduler to a connection's driver.
struct Scheduled {
    index: u64,
    at: Instant,
    call: Call,
}

/// Open loop at `rate` requests per second.
///
/// An OS thread keeps the schedule (tokio's timer has millisecond
/// granularity, `thread::sleep` wakes within tens of microseconds) and
/// hands each request, when it is due, to the driver task of one
/// connection; the driver sends it at once (or, past its share of
/// `OPEN_LOOP_MAX_IN_FLIGHT`, as soon as a slot frees) and records its
/// latency from the scheduled time. Each wake-up of the thread hands
/// everything then due to one connection (which sends it in one write),
/// the next wake-up's to the next. With a `tick` the thread sleeps at least
/// that long between two wake-ups (`--open-tick`): a sleep, a wake-up and
/// a driver's wake-up per request cost the load generator more CPU than
/// the server it measures, on the cores they share. A request handed over
/// late is measured from its scheduled time, so the tick shows in the
/// latencies (up to its length), never hides.
pub async fn open_loop(
    target: &Target<'_>,
    generator: Generator,
    rate: f64,
    tick: Duration,
    window: Window,
) -> RoundStats {
    let rate = rate.max(1.0);
    let interval = Duration::from_secs_f64(1.0 / rate);
    let total_requests = ((window.warmup + window.duration).as_secs_f64() * rate).ceil() as u64;
    let warmup_requests = (window.warmup.as_secs_f64() * rate).ceil() as u64;
    let connections = target.connections.len().max(1);
    let in_flight_per_driver = (OPEN_LOOP_MAX_IN_FLIGHT / connections).max(1);
    let mut senders = Vec::with_capacity(connections);
    let mut drivers = Vec::with_capacity(connections);
    for connection in target.connections {
        let (sender, receiver) = tokio::sync::mpsc::unbounded_channel::<Scheduled>();
        senders.push(sender);
        let client = Caller::new(connection, &target.token);
        drivers.push(tokio::spawn(drive(
            client,
            receiver,
            warmup_requests,
            target.check,
            in_flight_per_driver,
        )));
    }
    let start = Instant::now() + Duration::from_millis(5);
    let measure_from = start + interval.mul_f64(warmup_requests as f64);
    let scheduler = std::thread::spawn(move || {
        let mut index = 0;
        let mut wake_ups = 0usize;
        while index < total_requests {
            let now = Instant::now();
            let mut at = start + interval.mul_f64(index as f64);
            // Everything due goes to one connection, which sends it in one
            // write; the next wake-up's to the next connection.
            let driver = wake_ups % senders.len();
            wake_ups = wake_ups.wrapping_add(1);
            while at <= now {
                let Some(call) = generator(index) else {
                    return true;
                };
                if senders[driver].send(Scheduled { index, at, call }).is_err() {
                    return true;
                }
                index += 1;
                if index == total_requests {
                    return false;
                }
                at = start + interval.mul_f64(index as f64);
            }
            std::thread::sleep((at - now).max(tick));
        }
        false
    });
    tokio::time::sleep_until(measure_from.into()).await;
    let cpu_start = CpuCounters::read(target.server);
    let exhausted = match tokio::task::spawn_blocking(move || scheduler.join()).await {
        Ok(Ok(exhausted)) => exhausted,
        _ => true,
    };
    let mut finished_drivers = Vec::with_capacity(drivers.len());
    for driver in drivers {
        if let Ok(stats) = driver.await {
            finished_drivers.push(stats);
        }
    }
    // As in the closed loop: the counters are read at the last answer,
    // before the drivers' stats are merged.
    let drained = Instant::now();
    let cpu = CpuCounters::read(target.server).since(&cpu_start);
    let mut total = RoundStats::empty();
    total.send_lag = Some(new_histogram());
    for stats in &finished_drivers {
        total.merge(stats);
    }
    // Until the last answer: a server that falls behind the schedule shows
    // a lower achieved rate than the one offered.
    total.elapsed = drained.saturating_duration_since(measure_from);
    cpu.charge(&mut total);
    total.exhausted = exhausted;
    total.rounds = 1;
    total.round_p99s = vec![total.percentile(0.99)];
    total.round_rates = vec![total.throughput()];
    total
}

/// A connection's driver: sends what the scheduler hands it, at most
/// `max_in_flight` at once, and records each answer.
async fn drive(
    client: Caller,
    mut receiver: tokio::sync::mpsc::UnboundedReceiver<Scheduled>,
    warmup_requests: u64,
    check: bool,
    max_in_flight: usize,
) -> RoundStats {
    let mut stats = RoundStats::empty();
    let mut send_lag = new_histogram();
    let mut waiting = std::collections::VecDeque::new();
    let mut in_flight = FuturesUnordered::new();
    let mut open = true;
    // The frames of the calls in flight are split off it; its space is
    // reused as they are sent and dropped.
    let mut buffer = BytesMut::new();
    loop {
        while in_flight.len() < max_in_flight
            && let Some(Scheduled { index, at, call }) = waiting.pop_front()
        {
            // A clone per call in flight: h2's sender is a handle on the
            // connection, and the request heads are shared.
            let mut client = client.clone();
            let call = Encoded::new(call, &mut buffer);
            in_flight.push(async move {
                let sent = Instant::now();
                let answer = execute(&mut client, call, check).await;
                (index, at, sent, Instant::now(), answer)
            });
        }
        if !open && waiting.is_empty() && in_flight.is_empty() {
            break;
        }
        tokio::select! {
            biased;
            received = receiver.recv(), if open => match received {
                Some(scheduled) => waiting.push_back(scheduled),
                None => open = false,
            },
            Some((index, at, sent, answered, answer)) = in_flight.next(), if !in_flight.is_empty() => {
                if index >= warmup_requests {
                    send_lag.saturating_record(nanos(sent.saturating_duration_since(at)).max(1));
                    stats.record(answered.saturating_duration_since(at), answer);
                }
            }
        }
    }
    stats.send_lag = Some(send_lag);
    stats
}

/// Waits (up to `patience`) until the machine is idle but for us: less than
/// `max_load` cores busy over a 300 ms sample. Returns the last sample.
pub async fn wait_for_quiet(max_load: f64, patience: Duration) -> f64 {
    let deadline = Instant::now() + patience;
    let mut announced = false;
    loop {
        let busy_start = machine_busy();
        let own_start = own_cpu_time();
        let sample = Duration::from_millis(300);
        tokio::time::sleep(sample).await;
        let busy = machine_busy()
            .saturating_sub(busy_start)
            .saturating_sub(own_cpu_time().saturating_sub(own_start));
        let load = busy.as_secs_f64() / sample.as_secs_f64();
        if load < max_load || Instant::now() >= deadline {
            return load;
        }
        if !announced {
            eprintln!(
                "   waiting for the machine to be idle (other processes use {load:.2} cores)"
            );
            announced = true;
        }
    }
}
