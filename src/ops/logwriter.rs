//! The background log writer: callers append whole lines to a shared buffer
//! and a writer thread moves everything buffered to the output in one
//! `write` every few milliseconds.
//!
//! Every decision writes an audit line, so the cost per line matters. A
//! channel with one message per line (`tracing-appender`) wakes the writer
//! thread for nearly every line: a futex wake in the caller and a context
//! switch per line, measured at ~7 % of toolgate's CPU under load. Here a
//! line costs a lock and a copy; the writer lets lines gather for
//! [`BATCH_WINDOW`] and writes them, and while lines keep coming it looks
//! again after the next window; only after a window without lines does it
//! sleep until a caller wakes it.
//!
//! Nothing is dropped, and a sink that stops reading (a stderr pipe nobody
//! drains) does not freeze the server: [`SinkStatus`] reports the sink as
//! stalled once a write has been blocked (or failing) for the stall bound, or
//! [`CAPACITY`] bytes wait; the server then turns health NOT_SERVING and
//! refuses the calls that would write audit lines, so the buffer stops
//! growing, until the sink drains. Callers wait only past
//! [`HARD_CAPACITY`], which the refusals keep the buffer far from. A failed
//! write is retried, never skipped. Dropping the [`LogGuard`] writes what is
//! left.
//!
//! [`RotatingFile`] is a file sink with size-based rotation.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tracing_subscriber::fmt::MakeWriter;

/// How long lines gather after the writer wakes up.
pub const BATCH_WINDOW: Duration = Duration::from_millis(2);
/// Bytes buffered at which the sink counts as stalled.
pub const CAPACITY: usize = 8 << 20;
/// Bytes buffered before callers wait for the writer (a last resort: calls
/// are refused long before).
pub const HARD_CAPACITY: usize = 64 << 20;
/// How long a write may block before the sink counts as stalled.
pub const STALL_AFTER: Duration = Duration::from_secs(5);
/// Pause between attempts at a write that failed.
const RETRY_AFTER: Duration = Duration::from_millis(100);

#[derive(Default)]
struct Buffer {
    bytes: Vec<u8>,
    writer_asleep: bool,
    callers_waiting: usize,
    closed: bool,
    /// Callers append past the hard capacity instead of waiting (set at
    /// shutdown: a caller waiting for room would keep the process alive).
    callers_let_through: bool,
    /// When the write in progress (or being retried) started.
    write_started: Option<Instant>,
}

#[derive(Default)]
struct Shared {
    buffer: Mutex<Buffer>,
    /// The writer waits here for lines.
    lines: Condvar,
    /// Callers wait here for room.
    room: Condvar,
    capacity: usize,
    hard_capacity: usize,
    stall_after: Duration,
    /// The last verdict of [`SinkStatus::check`] (or of a caller that found
    /// the buffer at capacity).
    stalled: AtomicBool,
    /// Times the sink went from draining to stalled.
    stalls: AtomicU64,
    /// Lines were given up on: the output failed once the guard was gone.
    lost: AtomicBool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Buffer> {
        // A panic while holding the lock leaves plain bytes behind: keep going.
        self.buffer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn set_stalled(&self, stalled: bool) {
        let was = self.stalled.swap(stalled, Ordering::AcqRel);
        if stalled && !was {
            self.stalls.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The caller side; cheap to clone. A `MakeWriter` for tracing layers.
#[derive(Clone)]
pub struct LogWriter {
    shared: Arc<Shared>,
}

impl LogWriter {
    pub fn status(&self) -> SinkStatus {
        SinkStatus {
            shared: Arc::clone(&self.shared),
        }
    }
}

/// Whether the sink keeps up; cheap to clone.
#[derive(Clone)]
pub struct SinkStatus {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for SinkStatus {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("SinkStatus")
            .field("stalled", &self.stalled())
            .finish_non_exhaustive()
    }
}

impl SinkStatus {
    /// From now on a caller never waits for room in the buffer (it
    /// appends past the hard capacity): at shutdown, so that no thread
    /// waiting for a sink that takes nothing keeps the process alive.
    pub fn let_callers_through(&self) {
        self.shared.lock().callers_let_through = true;
        self.shared.room.notify_all();
    }

    /// The last verdict: one atomic load, for every call.
    pub fn stalled(&self) -> bool {
        self.shared.stalled.load(Ordering::Acquire)
    }

    /// Looks at the sink now and updates the verdict: stalled while a write
    /// has been blocked or failing for the stall bound, or while the buffer
    /// is at capacity.
    pub fn check(&self) -> bool {
        let stalled = {
            let buffer = self.shared.lock();
            let blocked = buffer
                .write_started
                .is_some_and(|started| started.elapsed() >= self.shared.stall_after);
            blocked || buffer.bytes.len() >= self.shared.capacity
        };
        self.shared.set_stalled(stalled);
        stalled
    }

    /// Times the sink went from draining to stalled.
    pub fn stalls(&self) -> u64 {
        self.shared.stalls.load(Ordering::Relaxed)
    }

    /// Bytes waiting for the sink.
    pub fn buffered(&self) -> usize {
        self.shared.lock().bytes.len()
    }
}

/// Stops the writer thread when dropped, after it has written everything.
pub struct LogGuard {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// Starts the writer thread for `output`, with the default bounds.
pub fn spawn<W: Write + Send + 'static>(output: W) -> io::Result<(LogWriter, LogGuard)> {
    spawn_with(output, CAPACITY, HARD_CAPACITY, STALL_AFTER)
}

/// Starts the writer thread for `output`: the sink counts as stalled when
/// `capacity` bytes wait or a write blocks for `stall_after`; callers wait
/// past `hard_capacity`.
pub fn spawn_with<W: Write + Send + 'static>(
    mut output: W,
    capacity: usize,
    hard_capacity: usize,
    stall_after: Duration,
) -> io::Result<(LogWriter, LogGuard)> {
    let shared = Arc::new(Shared {
        capacity,
        hard_capacity: hard_capacity.max(capacity),
        stall_after,
        ..Shared::default()
    });
    let for_thread = Arc::clone(&shared);
    let thread = std::thread::Builder::new()
        .name("toolgate-log".into())
        .spawn(move || write_batches(&for_thread, &mut output))?;
    Ok((
        LogWriter {
            shared: Arc::clone(&shared),
        },
        LogGuard {
            shared,
            thread: Some(thread),
        },
    ))
}

#[cfg(test)]
fn spawn_with_capacity<W: Write + Send + 'static>(
    output: W,
    capacity: usize,
) -> io::Result<(LogWriter, LogGuard)> {
    spawn_with(output, capacity, capacity, STALL_AFTER)
}

fn write_batches(shared: &Shared, output: &mut impl Write) {
    let mut batch = Vec::new();
    // Whether the last window brought lines. While they keep coming the
    // writer looks again after the next window instead of sleeping on
    // `lines`, so that no caller has to wake it: a wake-up is a futex call
    // in the caller and, with the writer on another core, an interrupt
    // (about a twentieth of an ext_authz Check's own work in a profile).
    let mut busy = false;
    loop {
        let closed = {
            let mut buffer = shared.lock();
            if !busy {
                while buffer.bytes.is_empty() && !buffer.closed {
                    buffer.writer_asleep = true;
                    buffer = shared
                        .lines
                        .wait(buffer)
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                }
                buffer.writer_asleep = false;
            }
            if buffer.bytes.is_empty() && buffer.closed {
                return; // closed, and everything written
            }
            buffer.closed
        };
        if !closed {
            std::thread::sleep(BATCH_WINDOW);
        }
        {
            let mut buffer = shared.lock();
            std::mem::swap(&mut buffer.bytes, &mut batch);
            busy = !batch.is_empty();
            if !busy {
                continue; // a window without lines: sleep until one comes
            }
            buffer.write_started = Some(Instant::now());
            if buffer.callers_waiting > 0 {
                shared.room.notify_all();
            }
        }
        write_batch(shared, output, &batch);
        shared.lock().write_started = None;
        batch.clear();
    }
}

/// Writes the whole batch, retrying what fails: a line is never skipped.
/// Once the guard is dropped, a failing output gets one more attempt only.
fn write_batch(shared: &Shared, output: &mut impl Write, batch: &[u8]) {
    let mut written = 0;
    while written < batch.len() {
        match output.write(&batch[written..]) {
            Ok(0) => {}
            Ok(count) => {
                written += count;
                continue;
            }
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => {}
        }
        // Where the log goes is the operator's: if it cannot be written
        // there is nowhere left to report that. The stall verdict tells.
        if shared.lock().closed {
            shared.lost.store(true, Ordering::Relaxed);
            return;
        }
        std::thread::sleep(RETRY_AFTER);
    }
    let _ = output.flush();
}

impl Write for &LogWriter {
    fn write(&mut self, line: &[u8]) -> io::Result<usize> {
        let shared = &self.shared;
        let mut buffer = shared.lock();
        while !buffer.bytes.is_empty()
            && buffer.bytes.len() + line.len() > shared.hard_capacity
            && !buffer.closed
            && !buffer.callers_let_through
        {
            buffer.callers_waiting += 1;
            buffer = shared
                .room
                .wait(buffer)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            buffer.callers_waiting -= 1;
        }
        buffer.bytes.extend_from_slice(line);
        if buffer.bytes.len() >= shared.capacity {
            shared.set_stalled(true);
        }
        if buffer.writer_asleep {
            buffer.writer_asleep = false;
            shared.lines.notify_one();
        }
        Ok(line.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for LogWriter {
    type Writer = &'a LogWriter;

    fn make_writer(&'a self) -> Self::Writer {
        self
    }
}

impl LogGuard {
    /// Stops the writer once it has written everything, waiting at most
    /// `wait` for a sink that takes nothing (a stderr pipe nobody reads
    /// would otherwise keep the process from ever exiting): whether
    /// everything buffered was written (not when the sink failed at the
    /// end, nor when it never took them). Such lines are lost with the
    /// process, and the caller says so the only way left, its exit status.
    pub fn finish(mut self, wait: Duration) -> bool {
        self.stop(wait)
    }

    fn stop(&mut self, wait: Duration) -> bool {
        self.shared.lock().closed = true;
        self.shared.lines.notify_one();
        self.shared.room.notify_all();
        let Some(thread) = self.thread.take() else {
            return true;
        };
        if !crate::ops::process::join_within(thread, wait) {
            return false;
        }
        !self.shared.lost.load(Ordering::Relaxed)
    }
}

/// How long a guard dropped without [`LogGuard::finish`] (an early exit)
/// waits for the sink.
const DROP_WAIT: Duration = Duration::from_secs(10);

impl Drop for LogGuard {
    fn drop(&mut self) {
        self.stop(DROP_WAIT);
    }
}

/// A log file that is rotated by size: when a batch would take it past
/// `max_bytes`, `PATH` becomes `PATH.1` (`PATH.1` becomes `PATH.2`, and so
/// on; the oldest past `keep` is removed) and a new `PATH` is started.
/// Batches hold whole lines, so every file holds whole lines.
#[derive(Debug)]
pub struct RotatingFile {
    path: PathBuf,
    max_bytes: u64,
    keep: usize,
    file: File,
    written: u64,
}

impl RotatingFile {
    /// Opens (appends to) `path`; `keep` rotated files are kept (at least one).
    pub fn open(path: &Path, max_bytes: u64, keep: usize) -> io::Result<RotatingFile> {
        let file = open_log(path)?;
        let written = file.metadata()?.len();
        Ok(RotatingFile {
            path: path.to_path_buf(),
            max_bytes: max_bytes.max(1),
            keep: keep.max(1),
            file,
            written,
        })
    }

    fn rotated(&self, index: usize) -> PathBuf {
        let mut name = self.path.clone().into_os_string();
        name.push(format!(".{index}"));
        PathBuf::from(name)
    }

    fn rotate(&mut self) -> io::Result<()> {
        self.rotate_with(open_log)
    }

    /// Moves the files along and opens a new one with `open`. When the
    /// new file cannot be opened (no descriptor left, say) the writer
    /// tries again later; the current file is then already `.1`, so that
    /// attempt only opens: moving the files along again would push a
    /// rotated log out at every retry.
    fn rotate_with(&mut self, open: impl Fn(&Path) -> io::Result<File>) -> io::Result<()> {
        self.file.flush()?;
        if self.path.exists() {
            let _ = std::fs::remove_file(self.rotated(self.keep));
            for index in (1..self.keep).rev() {
                let from = self.rotated(index);
                if from.exists() {
                    std::fs::rename(&from, self.rotated(index + 1))?;
                }
            }
            std::fs::rename(&self.path, self.rotated(1))?;
        }
        self.file = open(&self.path)?;
        self.written = 0;
        Ok(())
    }
}

/// The log file, appended to; made readable by its owner only (reviewers'
/// notes and every decision are in it).
fn open_log(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
}

impl Write for RotatingFile {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        if self.written > 0 && self.written + bytes.len() as u64 > self.max_bytes {
            self.rotate()?;
        }
        let count = self.file.write(bytes)?;
        self.written += count as u64;
        Ok(count)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An output that records what reaches it, slowly if asked.
    #[derive(Clone, Default)]
    struct Recorded {
        bytes: Arc<Mutex<Vec<u8>>>,
        writes: Arc<Mutex<usize>>,
        delay: Duration,
    }

    impl Write for Recorded {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            std::thread::sleep(self.delay);
            *self.writes.lock().unwrap() += 1;
            self.bytes.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn lines_from_threads(writer: &LogWriter, threads: usize, lines: usize) {
        std::thread::scope(|scope| {
            for thread in 0..threads {
                scope.spawn(move || {
                    for line in 0..lines {
                        let text = format!("t{thread} l{line}\n");
                        (&*writer).write_all(text.as_bytes()).unwrap();
                    }
                });
            }
        });
    }

    fn check_every_line_once_in_order(bytes: &[u8], threads: usize, lines: usize) {
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        let mut next = vec![0; threads];
        for line in text.lines() {
            let (thread, number) = line.split_once(' ').unwrap();
            let thread: usize = thread[1..].parse().unwrap();
            let number: usize = number[1..].parse().unwrap();
            assert_eq!(
                number, next[thread],
                "thread {thread}: lines out of order or lost"
            );
            next[thread] += 1;
        }
        assert_eq!(next, vec![lines; threads]);
    }

    #[test]
    fn every_line_arrives_once_in_order_in_few_writes() {
        let output = Recorded::default();
        let (writer, guard) = spawn(output.clone()).unwrap();
        lines_from_threads(&writer, 4, 5_000);
        drop(guard);
        check_every_line_once_in_order(&output.bytes.lock().unwrap(), 4, 5_000);
        let writes = *output.writes.lock().unwrap();
        assert!(writes < 20_000 / 10, "{writes} writes for 20,000 lines");
    }

    #[test]
    fn a_full_buffer_makes_callers_wait_instead_of_dropping_lines() {
        let output = Recorded {
            delay: Duration::from_millis(1),
            ..Recorded::default()
        };
        // Room for a few lines only, and a slow output.
        let (writer, guard) = spawn_with_capacity(output.clone(), 64).unwrap();
        lines_from_threads(&writer, 3, 300);
        drop(guard);
        check_every_line_once_in_order(&output.bytes.lock().unwrap(), 3, 300);
    }

    #[test]
    fn the_guard_writes_what_is_left_and_stops_the_thread() {
        let output = Recorded::default();
        let (writer, guard) = spawn(output.clone()).unwrap();
        (&writer).write_all(b"last words\n").unwrap();
        drop(guard);
        assert_eq!(&output.bytes.lock().unwrap()[..], b"last words\n");
        // Writing after the guard is gone does not block (nobody reads it).
        (&writer).write_all(b"too late\n").unwrap();
    }

    /// An output whose writes block while its gate is shut.
    #[derive(Clone, Default)]
    struct Gated {
        bytes: Arc<Mutex<Vec<u8>>>,
        shut: Arc<(Mutex<bool>, Condvar)>,
    }

    impl Gated {
        fn set_shut(&self, shut: bool) {
            *self.shut.0.lock().unwrap() = shut;
            self.shut.1.notify_all();
        }
    }

    impl Write for Gated {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            let mut shut = self.shut.0.lock().unwrap();
            while *shut {
                shut = self.shut.1.wait(shut).unwrap();
            }
            self.bytes.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// Polls `check` until it says `stalled` (a wait for a condition, not a
    /// timed assertion).
    fn wait_until(status: &SinkStatus, stalled: bool) {
        for _ in 0..10_000 {
            if status.check() == stalled {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        panic!("the sink never became stalled = {stalled}");
    }

    #[test]
    fn finishing_waits_for_a_sink_that_takes_lines_not_for_one_that_never_does() {
        let output = Gated::default();
        let (writer, guard) = spawn(output.clone()).unwrap();
        (&writer).write_all(b"taken\n").unwrap();
        assert!(guard.finish(Duration::from_secs(30)));
        assert_eq!(&output.bytes.lock().unwrap()[..], b"taken\n");
        // A sink whose write never returns (a pipe nobody reads): the wait
        // ends, and says the line was not written.
        let output = Gated::default();
        output.set_shut(true);
        let (writer, guard) = spawn(output.clone()).unwrap();
        (&writer).write_all(b"never taken\n").unwrap();
        assert!(!guard.finish(Duration::from_millis(200)));
        assert!(output.bytes.lock().unwrap().is_empty());
        output.set_shut(false); // lets the detached writer end
    }

    #[test]
    fn a_stalled_sink_is_reported_callers_keep_going_and_nothing_is_lost() {
        let output = Gated::default();
        output.set_shut(true);
        let (writer, guard) =
            spawn_with(output.clone(), 1 << 20, 4 << 20, Duration::from_millis(20)).unwrap();
        let status = writer.status();
        assert!(!status.stalled());
        (&writer).write_all(b"t0 l0\n").unwrap();
        wait_until(&status, true);
        assert_eq!(status.stalls(), 1);
        // Callers are not blocked by the stalled sink (below the hard cap).
        for line in 1..2_000 {
            (&writer)
                .write_all(format!("t0 l{line}\n").as_bytes())
                .unwrap();
        }
        assert!(status.stalled());
        assert!(status.buffered() > 0);
        output.set_shut(false);
        wait_until(&status, false);
        drop(guard);
        check_every_line_once_in_order(&output.bytes.lock().unwrap(), 1, 2_000);
        assert_eq!(status.stalls(), 1);
    }

    #[test]
    fn a_full_buffer_counts_as_stalled_at_once() {
        let output = Gated::default();
        output.set_shut(true);
        let (writer, guard) = spawn_with(output.clone(), 64, 1 << 20, STALL_AFTER).unwrap();
        let status = writer.status();
        (&writer).write_all(&[b'x'; 63]).unwrap();
        (&writer).write_all(b"\n").unwrap();
        assert!(status.stalled());
        output.set_shut(false);
        wait_until(&status, false);
        drop(guard);
        assert_eq!(output.bytes.lock().unwrap().len(), 64);
    }

    /// An output that fails its first writes.
    struct Flaky {
        failures: usize,
        bytes: Arc<Mutex<Vec<u8>>>,
    }

    impl Write for Flaky {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            if self.failures > 0 {
                self.failures -= 1;
                return Err(io::Error::other("disk full"));
            }
            // Half at a time: partial writes must not repeat or skip bytes.
            let half = bytes.len().div_ceil(2);
            self.bytes.lock().unwrap().extend_from_slice(&bytes[..half]);
            Ok(half)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_a_failing_sink_never_took_make_the_finish_say_so() {
        let bytes = Arc::new(Mutex::new(Vec::new()));
        let output = Flaky {
            failures: usize::MAX,
            bytes: Arc::clone(&bytes),
        };
        let (writer, guard) = spawn(output).unwrap();
        (&writer).write_all(b"never written\n").unwrap();
        assert!(!guard.finish(Duration::from_secs(30)));
        assert!(bytes.lock().unwrap().is_empty());
    }

    #[test]
    fn callers_let_through_stop_waiting_for_room() {
        let output = Gated::default();
        output.set_shut(true);
        let (writer, guard) = spawn_with(output.clone(), 16, 16, STALL_AFTER).unwrap();
        (&writer).write_all(b"0123456789abcdef\n").unwrap();
        // The writer holds that line; the next fills the buffer; the one
        // after waits for room that never comes.
        while writer.status().buffered() > 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
        (&writer).write_all(b"second line....\n").unwrap();
        let waiting = {
            let writer = writer.clone();
            std::thread::spawn(move || (&writer).write_all(b"third line\n").unwrap())
        };
        while writer.shared.lock().callers_waiting == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
        writer.status().let_callers_through();
        waiting.join().unwrap();
        assert_eq!(writer.status().buffered(), 27);
        output.set_shut(false);
        assert!(guard.finish(Duration::from_secs(30)));
        assert_eq!(
            &output.bytes.lock().unwrap()[..],
            b"0123456789abcdef\nsecond line....\nthird line\n"
        );
    }

    #[test]
    fn failed_and_partial_writes_are_retried_never_skipped() {
        let bytes = Arc::new(Mutex::new(Vec::new()));
        let output = Flaky {
            failures: 3,
            bytes: Arc::clone(&bytes),
        };
        let (writer, guard) = spawn(output).unwrap();
        lines_from_threads(&writer, 2, 200);
        // Wait for everything before closing: a closed writer gives up.
        while writer.status().buffered() > 0 || bytes.lock().unwrap().len() < 2 * 200 * 6 {
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(guard);
        check_every_line_once_in_order(&bytes.lock().unwrap(), 2, 200);
    }

    #[test]
    fn the_file_sink_rotates_by_size_and_keeps_whole_lines() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("toolgate.log");
        let mut file = RotatingFile::open(&path, 100, 2).unwrap();
        for batch in 0..10 {
            let line = format!("{batch:039}\n");
            file.write_all(line.as_bytes()).unwrap();
        }
        file.flush().unwrap();
        let read = |suffix: &str| {
            let mut name = path.clone().into_os_string();
            name.push(suffix);
            std::fs::read_to_string(PathBuf::from(name)).ok()
        };
        // 40-byte batches, 100 bytes a file: two batches per file, the
        // newest in PATH, two rotated files kept.
        let current = read("").unwrap();
        let newer = read(".1").unwrap();
        let older = read(".2").unwrap();
        assert_eq!(read(".3"), None);
        let lines: Vec<String> = [older, newer, current]
            .iter()
            .flat_map(|text| {
                assert!(text.len() <= 100, "{} bytes", text.len());
                text.lines().map(str::to_string).collect::<Vec<_>>()
            })
            .collect();
        let expected: Vec<String> = (4..10).map(|batch| format!("{batch:039}")).collect();
        assert_eq!(lines, expected);
    }

    /// A rotation whose new file cannot be opened loses no rotated file
    /// when it is tried again (each retry used to move the files along
    /// once more, deleting the oldest, until none was left), and the file
    /// is its owner's alone.
    #[test]
    fn a_rotation_that_cannot_open_its_new_file_loses_nothing_on_retry() {
        use std::os::unix::fs::PermissionsExt;
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("toolgate.log");
        let name = |suffix: &str| {
            let mut name = path.clone().into_os_string();
            name.push(suffix);
            PathBuf::from(name)
        };
        std::fs::write(name(".1"), "one\n").unwrap();
        std::fs::write(name(".2"), "two\n").unwrap();
        let mut file = RotatingFile::open(&path, 100, 3).unwrap();
        file.write_all(b"current\n").unwrap();
        let refused = |_: &Path| Err(io::Error::from_raw_os_error(24)); // EMFILE
        for _ in 0..5 {
            assert!(file.rotate_with(refused).is_err());
        }
        file.rotate().unwrap();
        file.write_all(b"next\n").unwrap();
        file.flush().unwrap();
        let read = |suffix: &str| std::fs::read_to_string(name(suffix)).unwrap();
        assert_eq!(
            [read(""), read(".1"), read(".2"), read(".3")],
            ["next\n", "current\n", "one\n", "two\n"]
        );
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
