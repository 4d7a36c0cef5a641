//! The background log writer: callers append whole lines to a shared buffer
//! and a writer thread moves everything buffered to the output in one
//! `write` every few milliseconds.
//!
//! Every decision writes an audit line, so the cost per line matters. A
//! channel with one message per line (`tracing-appender`) wakes the writer
//! thread for nearly every line: a futex wake in the caller and a context
//! switch per line, measured at ~7 % of toolgate's CPU under load. Here a
//! line costs a lock and a copy; the writer is woken only when it sleeps on
//! an empty buffer, then lets lines gather for [`BATCH_WINDOW`].
//!
//! Nothing is dropped: when [`CAPACITY`] bytes wait, callers block until the
//! writer has taken them. Dropping the [`LogGuard`] writes what is left.

use std::io::{self, Write};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use tracing_subscriber::fmt::MakeWriter;

/// How long lines gather after the writer wakes up.
pub const BATCH_WINDOW: Duration = Duration::from_millis(2);
/// Bytes buffered before callers wait for the writer.
pub const CAPACITY: usize = 8 << 20;

#[derive(Default)]
struct Buffer {
    bytes: Vec<u8>,
    writer_asleep: bool,
    callers_waiting: usize,
    closed: bool,
}

#[derive(Default)]
struct Shared {
    buffer: Mutex<Buffer>,
    /// The writer waits here for lines.
    lines: Condvar,
    /// Callers wait here for room.
    room: Condvar,
    capacity: usize,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Buffer> {
        // A panic while holding the lock leaves plain bytes behind: keep going.
        self.buffer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The caller side; cheap to clone. A `MakeWriter` for tracing layers.
#[derive(Clone)]
pub struct LogWriter {
    shared: Arc<Shared>,
}

/// Stops the writer thread when dropped, after it has written everything.
pub struct LogGuard {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// Starts the writer thread for `output`.
pub fn spawn<W: Write + Send + 'static>(output: W) -> io::Result<(LogWriter, LogGuard)> {
    spawn_with_capacity(output, CAPACITY)
}

fn spawn_with_capacity<W: Write + Send + 'static>(
    mut output: W,
    capacity: usize,
) -> io::Result<(LogWriter, LogGuard)> {
    let shared = Arc::new(Shared {
        capacity,
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

fn write_batches(shared: &Shared, output: &mut impl Write) {
    let mut batch = Vec::new();
    loop {
        let closed = {
            let mut buffer = shared.lock();
            while buffer.bytes.is_empty() && !buffer.closed {
                buffer.writer_asleep = true;
                buffer = shared
                    .lines
                    .wait(buffer)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
            buffer.writer_asleep = false;
            if buffer.bytes.is_empty() {
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
            if buffer.callers_waiting > 0 {
                shared.room.notify_all();
            }
        }
        // Where the log goes is the operator's: if it cannot be written
        // there is nowhere left to report that, and callers must not stall.
        let _ = output.write_all(&batch).and_then(|()| output.flush());
        batch.clear();
    }
}

impl Write for &LogWriter {
    fn write(&mut self, line: &[u8]) -> io::Result<usize> {
        let shared = &self.shared;
        let mut buffer = shared.lock();
        while !buffer.bytes.is_empty()
            && buffer.bytes.len() + line.len() > shared.capacity
            && !buffer.closed
        {
            buffer.callers_waiting += 1;
            buffer = shared
                .room
                .wait(buffer)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            buffer.callers_waiting -= 1;
        }
        buffer.bytes.extend_from_slice(line);
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

impl Drop for LogGuard {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.lines.notify_one();
        self.shared.room.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
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
}
