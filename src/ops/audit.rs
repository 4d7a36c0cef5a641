//! Audit events (SPEC §8): structured `tracing` events on the
//! `toolgate::audit` target with a stable `event` name, ids and fingerprints,
//! never secrets or argument values.
//!
//! Every decision emits one, so they are written by [`AuditLayer`], a
//! formatter made for them: one line per event, built in a reused buffer from
//! the fields as they are recorded (strings copied, numbers and booleans as
//! such), without the general-purpose `fmt` machinery. Other log events go
//! through `tracing_subscriber::fmt` as usual.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::io::Write as _;

use tracing::field::{Field, Visit};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::Context;

use crate::domain::canonical;

/// The tracing target every audit event is emitted on.
pub const TARGET: &str = "toolgate::audit";

/// Emits an audit event: `audit!("manifest_assessed", server_id = %id, ...)`.
#[macro_export]
macro_rules! audit {
    ($event:expr $(, $($fields:tt)*)?) => {
        ::tracing::info!(target: "toolgate::audit", event = $event $(, $($fields)*)?)
    };
}

/// Emits an audit event at WARN: something an operator should look at
/// (`policy_reload_failed`).
#[macro_export]
macro_rules! audit_warn {
    ($event:expr $(, $($fields:tt)*)?) => {
        ::tracing::warn!(target: "toolgate::audit", event = $event $(, $($fields)*)?)
    };
}

/// The audit events a client can cause at will, as often as it likes:
/// refusals of malformed, unauthorised or unauthenticated calls. Their
/// lines go through a [`Coalescer`], so that a flood of them cannot fill the
/// log writer (whose callers wait when it is full) and stall the decisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// `request_rejected`: an INVALID_ARGUMENT (method, field path, rule).
    RequestRejected,
    /// `review_refused`: a grant, deny or revoke that was refused.
    ReviewRefused,
    /// `auth_failed`: a call refused by authentication.
    AuthFailed,
}

impl Rejection {
    pub const ALL: [Rejection; 3] = [
        Rejection::RequestRejected,
        Rejection::ReviewRefused,
        Rejection::AuthFailed,
    ];

    /// The stable event name (SPEC §8).
    pub fn event_name(self) -> &'static str {
        match self {
            Rejection::RequestRejected => "request_rejected",
            Rejection::ReviewRefused => "review_refused",
            Rejection::AuthFailed => "auth_failed",
        }
    }

    fn index(self) -> usize {
        match self {
            Rejection::RequestRejected => 0,
            Rejection::ReviewRefused => 1,
            Rejection::AuthFailed => 2,
        }
    }
}

/// Lines of one [`Rejection`] kind written at once before coalescing starts.
pub const REJECTION_BURST: u64 = 100;
/// Lines of one [`Rejection`] kind written per second, on average, beyond
/// the burst.
pub const REJECTION_LINES_PER_SECOND: u64 = 20;

/// A token bucket per [`Rejection`] kind, on the engine's clock. A line
/// over the budget is not written but counted, never waited for; the count
/// is reported in the `coalesced` field of the next line of that kind (or
/// of an `audit_coalesced` line, see [`Coalescer::take_pending`]), so every
/// rejection is accounted for: lines plus the coalesced counts they report
/// equal the rejections.
#[derive(Debug)]
pub struct Coalescer {
    buckets: [std::sync::Mutex<Bucket>; 3],
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// Thousandths of a line.
    allowance: u64,
    refilled_at: Option<crate::domain::clock::Timestamp>,
    /// Lines coalesced since the last line of this kind.
    pending: u64,
}

const LINE_COST: u64 = 1000;

impl Default for Coalescer {
    fn default() -> Self {
        let full = Bucket {
            allowance: REJECTION_BURST * LINE_COST,
            refilled_at: None,
            pending: 0,
        };
        Coalescer {
            buckets: [full; 3].map(std::sync::Mutex::new),
        }
    }
}

impl Coalescer {
    fn bucket(&self, kind: Rejection) -> std::sync::MutexGuard<'_, Bucket> {
        // A bucket is two numbers: a panic cannot leave it inconsistent.
        self.buckets[kind.index()]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether a line of `kind` may be written now: `Some(coalesced)`, the
    /// count of lines of this kind coalesced since the last one (to report
    /// in it), or `None` when this line is coalesced (counted, not written).
    pub fn admit(&self, kind: Rejection, now: crate::domain::clock::Timestamp) -> Option<u64> {
        let mut bucket = self.bucket(kind);
        if let Some(refilled_at) = bucket.refilled_at {
            let earned = now
                .millis_since(refilled_at)
                .saturating_mul(REJECTION_LINES_PER_SECOND);
            bucket.allowance = bucket
                .allowance
                .saturating_add(earned)
                .min(REJECTION_BURST * LINE_COST);
        }
        bucket.refilled_at = Some(now);
        if bucket.allowance < LINE_COST {
            bucket.pending = bucket.pending.saturating_add(1);
            return None;
        }
        bucket.allowance -= LINE_COST;
        Some(std::mem::take(&mut bucket.pending))
    }

    /// Counts a line of `kind` not written, without spending the budget:
    /// reported with the next one written ([`Coalescer::admit`]) or by the
    /// next `audit_coalesced` line ([`Coalescer::take_pending`]).
    pub fn count(&self, kind: Rejection) {
        let mut bucket = self.bucket(kind);
        bucket.pending = bucket.pending.saturating_add(1);
    }

    /// Takes the count of lines of `kind` coalesced since the last one, for
    /// a periodic `audit_coalesced` line once a flood has stopped.
    pub fn take_pending(&self, kind: Rejection) -> u64 {
        std::mem::take(&mut self.bucket(kind).pending)
    }
}

/// How audit lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditFormat {
    /// `2026-11-29T18:22:03.123456Z  INFO toolgate::audit: event="decision" outcome="allow" …`,
    /// the shape of `tracing_subscriber::fmt`'s lines.
    Text,
    /// One JSON object per line: `{"timestamp":…,"level":"INFO","target":"toolgate::audit","event":"decision",…}`.
    Json,
}

/// Writes the `toolgate::audit` events (and nothing else) to `writer`.
#[derive(Debug)]
pub struct AuditLayer<W> {
    writer: W,
    format: AuditFormat,
}

impl<W> AuditLayer<W> {
    pub fn new(writer: W, format: AuditFormat) -> Self {
        AuditLayer { writer, format }
    }
}

thread_local! {
    /// The line being built, reused across events on this thread.
    static LINE: RefCell<String> = const { RefCell::new(String::new()) };
}

impl<S, W> tracing_subscriber::Layer<S> for AuditLayer<W>
where
    S: tracing::Subscriber,
    W: for<'writer> MakeWriter<'writer> + 'static,
{
    fn on_event(&self, event: &tracing::Event<'_>, _context: Context<'_, S>) {
        let metadata = event.metadata();
        if metadata.target() != TARGET {
            return;
        }
        let write = |line: &mut String| {
            line.clear();
            format_line(line, self.format, metadata.level(), event);
            // The writer is toolgate's background writer: it does not drop
            // lines (callers wait when it is full) and reports its own errors.
            let _ = self.writer.make_writer().write_all(line.as_bytes());
        };
        // A nested event on this thread (none today) gets its own buffer.
        let reused = LINE.try_with(|line| match line.try_borrow_mut() {
            Ok(mut line) => {
                write(&mut line);
                true
            }
            Err(_) => false,
        });
        if reused != Ok(true) {
            write(&mut String::new());
        }
    }
}

fn format_line(
    line: &mut String,
    format: AuditFormat,
    level: &tracing::Level,
    event: &tracing::Event<'_>,
) {
    let now = time::OffsetDateTime::now_utc();
    match format {
        AuditFormat::Json => {
            line.push_str("{\"timestamp\":\"");
            push_timestamp(line, now);
            line.push_str("\",\"level\":\"");
            line.push_str(level.as_str());
            line.push_str("\",\"target\":\"");
            line.push_str(TARGET);
            line.push('"');
        }
        AuditFormat::Text => {
            push_timestamp(line, now);
            // fmt right-aligns the level in five columns.
            line.push(' ');
            for _ in level.as_str().len()..5 {
                line.push(' ');
            }
            line.push_str(level.as_str());
            line.push(' ');
            line.push_str(TARGET);
            line.push(':');
        }
    }
    let mut fields = Fields {
        line,
        format,
        scratch: String::new(),
        declared: event.metadata().fields(),
        next: 0,
    };
    event.record(&mut fields);
    fields.absent_before(usize::MAX);
    let line = fields.line;
    if format == AuditFormat::Json {
        line.push('}');
    }
    line.push('\n');
}

/// RFC 3339 in UTC with microseconds: `2026-11-29T18:22:03.123456Z`.
fn push_timestamp(line: &mut String, now: time::OffsetDateTime) {
    push_digits(line, u32::try_from(now.year()).unwrap_or(0), 4);
    line.push('-');
    push_digits(line, u32::from(u8::from(now.month())), 2);
    line.push('-');
    push_digits(line, u32::from(now.day()), 2);
    line.push('T');
    push_digits(line, u32::from(now.hour()), 2);
    line.push(':');
    push_digits(line, u32::from(now.minute()), 2);
    line.push(':');
    push_digits(line, u32::from(now.second()), 2);
    line.push('.');
    push_digits(line, now.microsecond(), 6);
    line.push('Z');
}

/// `value` in decimal, zero-padded to `width` digits (wider values are cut
/// to their last `width` digits, which no date field reaches).
fn push_digits(line: &mut String, mut value: u32, width: usize) {
    let mut digits = [b'0'; 10];
    let width = width.min(digits.len());
    for digit in digits[..width].iter_mut().rev() {
        *digit = b'0' + (value % 10) as u8;
        value /= 10;
    }
    line.extend(digits[..width].iter().map(|&digit| char::from(digit)));
}

/// Records an event's fields into the line.
struct Fields<'a> {
    line: &'a mut String,
    format: AuditFormat,
    /// Values given as `%display` or `?debug` are formatted here first.
    scratch: String,
    /// The event's fields as declared: a declared field that records no
    /// value (an absent `Option`) is written as absent, in its place.
    declared: &'static tracing::field::FieldSet,
    /// Index of the next declared field not yet written.
    next: usize,
}

impl Fields<'_> {
    /// Writes the declared fields before index `until` that recorded nothing.
    fn absent_before(&mut self, until: usize) {
        // Fields are recorded in their declared order, so nearly always
        // the next one comes, with none absent before it.
        if self.next >= until {
            return;
        }
        let declared = self.declared;
        for field in declared.iter().skip(self.next) {
            if field.index() >= until {
                break;
            }
            self.write_name(&field);
            match self.format {
                AuditFormat::Json => self.line.push_str("null"),
                AuditFormat::Text => self.line.push_str("\"\""),
            }
            self.next = field.index() + 1;
        }
    }

    fn name(&mut self, field: &Field) {
        self.absent_before(field.index());
        self.next = field.index() + 1;
        self.write_name(field);
    }

    fn write_name(&mut self, field: &Field) {
        match self.format {
            AuditFormat::Json => {
                self.line.push(',');
                push_quoted(self.line, field.name());
                self.line.push(':');
            }
            AuditFormat::Text => {
                self.line.push(' ');
                self.line.push_str(field.name());
                self.line.push('=');
            }
        }
    }

    /// A number or boolean: the same in both formats.
    fn plain(&mut self, field: &Field, value: impl std::fmt::Display) {
        self.name(field);
        let _ = write!(self.line, "{value}");
    }
}

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.name(field);
        push_quoted(self.line, value);
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.scratch.clear();
        let _ = write!(self.scratch, "{value:?}");
        self.name(field);
        push_quoted(self.line, &self.scratch);
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.plain(field, value);
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.plain(field, value);
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.plain(field, value);
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        if value.is_finite() {
            self.plain(field, value);
        } else {
            // JSON has no NaN or infinity; keep the line parseable.
            self.record_str(field, &value.to_string());
        }
    }
}

/// A JSON string literal (also the text format's quoting): quotes,
/// backslashes and control characters escaped — C1 controls and the
/// Unicode line and paragraph separators too, which some log readers take
/// for line breaks (U+0085) or terminal commands (U+009B) — so that no
/// value can break the line or forge another field.
fn push_quoted(line: &mut String, value: &str) {
    line.push('"');
    let bytes = value.as_bytes();
    let mut plain_from = 0;
    let mut at = 0;
    loop {
        // Runs of printable ASCII are copied whole; beyond ASCII, character
        // by character.
        at += canonical::plain_prefix_len(&bytes[at..]);
        let Some(&byte) = bytes.get(at) else {
            break;
        };
        let escaped = match byte {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x00..=0x1f | 0x7f => "",
            0x80.. => {
                // `at` is a char boundary: every step before was a whole
                // ASCII byte or a whole character.
                let Some(character) = value[at..].chars().next() else {
                    break;
                };
                if matches!(character, '\u{80}'..='\u{9f}' | '\u{2028}' | '\u{2029}') {
                    line.push_str(&value[plain_from..at]);
                    let _ = write!(line, "\\u{:04x}", u32::from(character));
                    plain_from = at + character.len_utf8();
                }
                at += character.len_utf8();
                continue;
            }
            _ => {
                at += 1;
                continue;
            }
        };
        // `at` is a char boundary: the byte there is ASCII.
        line.push_str(&value[plain_from..at]);
        if escaped.is_empty() {
            let _ = write!(line, "\\u{byte:04x}");
        } else {
            line.push_str(escaped);
        }
        at += 1;
        plain_from = at;
    }
    line.push_str(&value[plain_from..]);
    line.push('"');
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Captured {
        type Writer = Captured;
        fn make_writer(&'a self) -> Captured {
            self.clone()
        }
    }

    fn lines(format: AuditFormat, emit: impl FnOnce()) -> Vec<String> {
        let captured = Captured::default();
        let subscriber =
            tracing_subscriber::registry().with(AuditLayer::new(captured.clone(), format));
        tracing::subscriber::with_default(subscriber, emit);
        let bytes = captured.0.lock().unwrap().clone();
        String::from_utf8(bytes)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    fn emit_sample() {
        let fingerprint = crate::domain::canonical::Fingerprint([0xab; 32]);
        crate::audit!(
            "tool_call_dispatched",
            actor = "mallory\"} \n{\"forged\":1",
            fingerprint = %fingerprint,
            replayed = true,
            version = 7u64,
            delta = -3i64,
            note = ?"dbg",
            ratio = f64::NAN,
            text = "caf\u{e9}\u{1}",
            absent = None::<u32>,
            present = Some(5u32),
            last = None::<&str>,
        );
        tracing::info!(target: "toolgate::other", "not an audit event");
    }

    proptest::proptest! {
        /// Any text, quoted, is one JSON string on one line that reads back
        /// as the text: no control character (nor DEL, a C1 control or a
        /// line or paragraph separator) left raw.
        #[test]
        fn any_text_is_quoted_into_one_line(
            text in "\\PC*|[\\x00-\\x7f\\u{80}-\\u{9f}\\u{e9}\\u{2028}\\u{2029}\\u{1f600}]{0,40}",
        ) {
            let mut line = String::new();
            push_quoted(&mut line, &text);
            proptest::prop_assert!(
                !line.chars().any(|character| character < ' '
                    || matches!(character, '\u{7f}'..='\u{9f}' | '\u{2028}' | '\u{2029}')),
                "{line:?}"
            );
            let read: String = serde_json::from_str(&line).unwrap();
            proptest::prop_assert_eq!(read, text);
        }
    }

    #[test]
    fn json_lines_keep_types_and_escape_everything() {
        let lines = lines(AuditFormat::Json, emit_sample);
        assert_eq!(lines.len(), 1, "{lines:?}");
        let event: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
        assert_eq!(event["event"], "tool_call_dispatched");
        assert_eq!(event["level"], "INFO");
        assert_eq!(event["target"], TARGET);
        assert_eq!(event["actor"], "mallory\"} \n{\"forged\":1");
        assert_eq!(event["fingerprint"], "ab".repeat(32));
        assert_eq!(event["replayed"], true);
        assert_eq!(event["version"], 7);
        assert_eq!(event["delta"], -3);
        assert_eq!(event["note"], "\"dbg\"");
        assert_eq!(event["ratio"], "NaN");
        assert_eq!(event["text"], "caf\u{e9}\u{1}");
        assert!(event.get("forged").is_none());
        assert_eq!(event["absent"], serde_json::Value::Null);
        assert_eq!(event["present"], 5);
        assert_eq!(event["last"], serde_json::Value::Null);
        assert!(!lines[0].contains("None"), "{}", lines[0]);
        let timestamp = event["timestamp"].as_str().unwrap();
        assert_eq!(
            timestamp.len(),
            "2026-11-29T18:22:03.123456Z".len(),
            "{timestamp}"
        );
        let parsed =
            time::OffsetDateTime::parse(timestamp, &time::format_description::well_known::Rfc3339)
                .unwrap();
        let age = time::OffsetDateTime::now_utc() - parsed;
        assert!(
            age >= time::Duration::ZERO && age < time::Duration::minutes(5),
            "{age}"
        );
    }

    #[test]
    fn text_lines_quote_values_so_none_can_break_the_line() {
        let lines = lines(AuditFormat::Text, emit_sample);
        assert_eq!(lines.len(), 1, "{lines:?}");
        let line = &lines[0];
        assert!(
            line.ends_with(" text=\"caf\u{e9}\\u0001\" absent=\"\" present=5 last=\"\""),
            "{line}"
        );
        assert!(
            line.contains(
                "  INFO toolgate::audit: event=\"tool_call_dispatched\" actor=\"mallory\\\"} \\n{\\\"forged\\\":1\" fingerprint=\"abab"
            ),
            "{line}"
        );
        assert!(
            line.contains(" replayed=true version=7 delta=-3 "),
            "{line}"
        );
    }

    #[test]
    fn the_coalescer_writes_a_burst_then_counts_and_reports_the_rest() {
        use crate::domain::clock::Timestamp;
        let coalescer = Coalescer::default();
        let start = Timestamp(1_000_000);
        let kind = Rejection::RequestRejected;
        for _ in 0..REJECTION_BURST {
            assert_eq!(coalescer.admit(kind, start), Some(0));
        }
        for _ in 0..7 {
            assert_eq!(coalescer.admit(kind, start), None);
        }
        // Other kinds have their own budget.
        assert_eq!(coalescer.admit(Rejection::AuthFailed, start), Some(0));
        // Time earns lines back: the first reports what was coalesced.
        let later = Timestamp(start.0 + 1000 / REJECTION_LINES_PER_SECOND);
        assert_eq!(coalescer.admit(kind, later), Some(7));
        assert_eq!(coalescer.admit(kind, later), None);
        assert_eq!(coalescer.take_pending(kind), 1);
        assert_eq!(coalescer.take_pending(kind), 0);
        // A long pause refills no more than the burst.
        let much_later = Timestamp(start.0 + 3_600_000);
        for _ in 0..REJECTION_BURST {
            assert_eq!(coalescer.admit(kind, much_later), Some(0));
        }
        assert_eq!(coalescer.admit(kind, much_later), None);
    }

    #[test]
    fn timestamps_and_digits() {
        let mut line = String::new();
        let date = time::Date::from_calendar_date(2026, time::Month::January, 2).unwrap();
        let at = date.with_hms_micro(3, 4, 5, 678).unwrap().assume_utc();
        push_timestamp(&mut line, at);
        assert_eq!(line, "2026-01-02T03:04:05.000678Z");
    }
}
