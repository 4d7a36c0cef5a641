//! Time comes from an injectable clock so that expiry is testable and a
//! future replicated backend can share one notion of "now".

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch. Plain integer arithmetic keeps expiry
/// comparisons exact and cheap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(pub u64);

impl Timestamp {
    pub fn saturating_add(self, duration: Duration) -> Self {
        let millis = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
        Timestamp(self.0.saturating_add(millis))
    }

    pub fn millis_since(self, earlier: Timestamp) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

/// A source of the current time.
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now(&self) -> Timestamp;

    /// Moves the clock on to `earliest` if it is behind it: the latest
    /// time a recovered state holds, so that a clock set back while the
    /// process was down does not hand out times before what was already
    /// written. Only [`MonotonicClock`] keeps it; the wall clock and the
    /// clocks tests move ignore it.
    fn not_before(&self, earliest: Timestamp) {
        let _ = earliest;
    }
}

/// The wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        Timestamp(u64::try_from(since_epoch.as_millis()).unwrap_or(u64::MAX))
    }
}

/// The time a server runs on: the wall clock, never run backwards. A step
/// back of the wall clock (NTP correcting it, a VM restored) is not
/// followed: time goes on at the monotonic clock's rate from where it was
/// until the wall clock is ahead of it again, so a grant is never usable
/// longer than its TTL because the clock was set back. A step forward is
/// followed (time a suspended machine did not count passes).
#[derive(Debug)]
pub struct MonotonicClock {
    /// The least the time may be at `started`, in milliseconds since the
    /// epoch: raised by every reading of the wall clock and by
    /// [`Clock::not_before`], never lowered.
    base: AtomicU64,
    started: Instant,
}

impl MonotonicClock {
    pub fn new() -> Self {
        MonotonicClock {
            base: AtomicU64::new(0),
            started: Instant::now(),
        }
    }

    fn elapsed_millis(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Raises the base to what `at` is at `elapsed`; the base after. (The
    /// wall clock and the monotonic one run together, so the base is
    /// mostly read, not written.)
    fn raise(&self, at: u64, elapsed: u64) -> u64 {
        let base = at.saturating_sub(elapsed);
        let held = self.base.load(Ordering::Acquire);
        if base <= held {
            return held;
        }
        self.base.fetch_max(base, Ordering::AcqRel).max(base)
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        MonotonicClock::new()
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Timestamp {
        let elapsed = self.elapsed_millis();
        let base = self.raise(SystemClock.now().0, elapsed);
        Timestamp(base.saturating_add(elapsed))
    }

    fn not_before(&self, earliest: Timestamp) {
        self.raise(earliest.0, self.elapsed_millis());
    }
}

/// A clock that only moves when told to; shared by clones (tests hand one
/// clone to the server and keep the other).
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    millis: Arc<AtomicU64>,
}

impl ManualClock {
    pub fn starting_at(start: Timestamp) -> Self {
        ManualClock {
            millis: Arc::new(AtomicU64::new(start.0)),
        }
    }

    pub fn advance(&self, duration: Duration) {
        let millis = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
        self.millis.fetch_add(millis, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.millis.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The monotonic clock reads the wall clock, never runs backwards,
    /// and moves on to a later time it is told of, but not back to an
    /// earlier one (as it does not when the wall clock is set back).
    #[test]
    fn the_monotonic_clock_goes_on_from_the_latest_time_it_was_told() {
        let clock = MonotonicClock::new();
        let first = clock.now();
        assert!(first >= Timestamp(SystemClock.now().0.saturating_sub(1_000)));
        let day = Duration::from_secs(86_400);
        clock.not_before(first.saturating_add(day));
        let ahead = clock.now();
        assert!(ahead >= first.saturating_add(day), "{ahead:?} {first:?}");
        clock.not_before(first);
        let after = clock.now();
        assert!(after >= ahead, "set back from {ahead:?} to {after:?}");
    }
}
