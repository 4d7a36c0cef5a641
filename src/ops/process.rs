//! The conventional `process_*` metrics (the names Prometheus client
//! libraries export), read from `/proc/self` at scrape time: CPU seconds,
//! resident and virtual memory, open and maximum file descriptors, threads
//! and the start time. Off Linux, or when `/proc` cannot be read, the
//! figures that could not be read are left out. And the one process-wide
//! memory setting `serve` makes: [`disable_transparent_huge_pages`]; and
//! [`join_within`], how its exit waits for the threads that write.

use std::fmt::Write as _;

/// Joins `thread` if it ends within `wait`: whether it ended without a
/// panic. One still running (blocked in a write to a sink that takes
/// nothing, a hung disk) is left behind, to end with the process.
pub fn join_within(thread: std::thread::JoinHandle<()>, wait: std::time::Duration) -> bool {
    let deadline = std::time::Instant::now().checked_add(wait);
    while !thread.is_finished() {
        if deadline.is_some_and(|deadline| std::time::Instant::now() >= deadline) {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    thread.join().is_ok()
}

/// Turns transparent huge pages off for this process (Linux's
/// `PR_SET_THP_DISABLE`, which overrides the allocator's `MADV_HUGEPAGE` and
/// the system's `always`), before the state is loaded.
///
/// The first touch of a huge page makes the kernel zero 2 MiB at once, on the
/// thread that touched it: while the state grows (a receipt per Dispatch,
/// the allocator asking the OS for fresh pages) a worker stalled for
/// milliseconds at a time, at times with the state lock held, and those
/// stalls were the p99 of Dispatch in open loop (BENCHMARKS.md, "Huge pages
/// off; where a Decide's CPU goes"). With 4 KiB pages the same zeroing comes
/// in pieces too small to show in any percentile. Elsewhere than Linux there
/// is nothing to do.
pub fn disable_transparent_huge_pages() -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    rustix::thread::disable_transparent_huge_pages(true)?;
    Ok(())
}

/// Clock ticks per second of `/proc/self/stat`'s times: `USER_HZ`, which
/// Linux reports as 100 on every architecture (Prometheus's own procfs
/// reader assumes the same).
const TICKS_PER_SECOND: f64 = 100.0;

/// The process figures, each one `None` when it could not be read.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ProcessFigures {
    pub cpu_seconds: Option<f64>,
    pub resident_bytes: Option<u64>,
    pub virtual_bytes: Option<u64>,
    pub open_fds: Option<u64>,
    pub max_fds: Option<u64>,
    pub threads: Option<u64>,
    pub start_time_seconds: Option<f64>,
}

impl ProcessFigures {
    /// The figures of this process now.
    pub fn read() -> ProcessFigures {
        let stat = std::fs::read_to_string("/proc/self/stat").ok();
        let fields = stat.as_deref().map(stat_fields).unwrap_or_default();
        // Field N of proc(5) is at index N - 3 (after pid and comm).
        let field = |number: usize| fields.get(number - 3).and_then(|value| value.parse().ok());
        let cpu_seconds = match (field(14), field(15)) {
            (Some(user), Some(system)) => Some((user + system) as f64 / TICKS_PER_SECOND),
            _ => None,
        };
        let boot_time = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|text| boot_time(&text));
        let start_time_seconds = match (field(22), boot_time) {
            (Some(ticks), Some(boot)) => Some(boot as f64 + ticks as f64 / TICKS_PER_SECOND),
            _ => None,
        };
        let status = std::fs::read_to_string("/proc/self/status").ok();
        let resident_bytes = status
            .as_deref()
            .and_then(|text| kilobytes(text, "VmRSS:"))
            .map(|kilobytes| kilobytes * 1024);
        let open_fds = std::fs::read_dir("/proc/self/fd")
            .ok()
            .map(|entries| entries.count() as u64);
        let max_fds = std::fs::read_to_string("/proc/self/limits")
            .ok()
            .and_then(|text| max_open_files(&text));
        ProcessFigures {
            cpu_seconds,
            resident_bytes,
            virtual_bytes: field(23),
            open_fds,
            max_fds,
            threads: field(20),
            start_time_seconds,
        }
    }

    /// The figures in the Prometheus text format, each family with HELP and TYPE.
    pub fn write_to(&self, text: &mut String) {
        let families: [(&str, &str, &str, Option<f64>); 7] = [
            (
                "process_cpu_seconds_total",
                "counter",
                "Total user and system CPU time spent in seconds.",
                self.cpu_seconds,
            ),
            (
                "process_resident_memory_bytes",
                "gauge",
                "Resident memory size in bytes.",
                self.resident_bytes.map(|value| value as f64),
            ),
            (
                "process_virtual_memory_bytes",
                "gauge",
                "Virtual memory size in bytes.",
                self.virtual_bytes.map(|value| value as f64),
            ),
            (
                "process_open_fds",
                "gauge",
                "Number of open file descriptors.",
                self.open_fds.map(|value| value as f64),
            ),
            (
                "process_max_fds",
                "gauge",
                "Maximum number of open file descriptors.",
                self.max_fds.map(|value| value as f64),
            ),
            (
                "process_threads",
                "gauge",
                "Number of OS threads in the process.",
                self.threads.map(|value| value as f64),
            ),
            (
                "process_start_time_seconds",
                "gauge",
                "Start time of the process since unix epoch in seconds.",
                self.start_time_seconds,
            ),
        ];
        for (name, kind, help, value) in families {
            if let Some(value) = value {
                let _ = writeln!(
                    text,
                    "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
                );
            }
        }
    }
}

/// The fields of `/proc/self/stat` after `pid (comm)`: the command name may
/// hold spaces and parentheses, so the split is after its last `)`.
fn stat_fields(stat: &str) -> Vec<&str> {
    stat.rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default()
}

/// `btime` of `/proc/stat`: the boot time in seconds since the epoch.
fn boot_time(proc_stat: &str) -> Option<u64> {
    proc_stat
        .lines()
        .find_map(|line| line.strip_prefix("btime "))
        .and_then(|value| value.trim().parse().ok())
}

/// A `Name:   N kB` line of `/proc/self/status`.
fn kilobytes(status: &str, name: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix(name))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|value| value.parse().ok())
}

/// The soft limit of `Max open files` in `/proc/self/limits`.
fn max_open_files(limits: &str) -> Option<u64> {
    limits
        .lines()
        .find_map(|line| line.strip_prefix("Max open files"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|value| value.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_is_joined_if_it_ends_in_time_and_left_if_not() {
        let (go, gate) = std::sync::mpsc::channel::<()>();
        let blocked = std::thread::spawn(move || {
            let _ = gate.recv();
        });
        assert!(!join_within(blocked, std::time::Duration::from_millis(100)));
        go.send(()).unwrap();
        let quick = std::thread::spawn(|| {});
        assert!(join_within(quick, std::time::Duration::MAX));
        let panicked = std::thread::spawn(|| panic!("on purpose"));
        assert!(!join_within(panicked, std::time::Duration::from_secs(30)));
    }

    #[test]
    fn the_proc_files_are_parsed_field_by_field() {
        let stat = "4242 (tool gate) (x)) S 1 2 3 4 5 6 7 8 9 10 250 150 0 0 20 0 9 0 5000 123456789 1000 18446744073709551615";
        let fields = stat_fields(stat);
        assert_eq!(fields[0], "S");
        // utime (14) and stime (15), num_threads (20), starttime (22), vsize (23).
        assert_eq!(fields[14 - 3], "250");
        assert_eq!(fields[15 - 3], "150");
        assert_eq!(fields[20 - 3], "9");
        assert_eq!(fields[22 - 3], "5000");
        assert_eq!(fields[23 - 3], "123456789");
        assert_eq!(
            boot_time("cpu  1 2 3\nbtime 1700000000\nprocesses 9\n"),
            Some(1_700_000_000)
        );
        assert_eq!(
            kilobytes("Name:\tx\nVmRSS:\t  2048 kB\n", "VmRSS:"),
            Some(2048)
        );
        let limits = "Limit                     Soft Limit           Hard Limit           Units\nMax open files            1024                 524288               files\n";
        assert_eq!(max_open_files(limits), Some(1024));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_has_every_figure() {
        let figures = ProcessFigures::read();
        assert!(figures.cpu_seconds.is_some(), "{figures:?}");
        assert!(figures.resident_bytes.unwrap_or(0) > 0, "{figures:?}");
        assert!(figures.open_fds.unwrap_or(0) > 0, "{figures:?}");
        assert!(figures.max_fds.unwrap_or(0) > 0, "{figures:?}");
        assert!(figures.threads.unwrap_or(0) > 0, "{figures:?}");
        assert!(
            figures.start_time_seconds.unwrap_or(0.0) > 1.0e9,
            "{figures:?}"
        );
        let mut text = String::new();
        figures.write_to(&mut text);
        assert!(
            text.contains("# TYPE process_cpu_seconds_total counter\n"),
            "{text}"
        );
    }
}
