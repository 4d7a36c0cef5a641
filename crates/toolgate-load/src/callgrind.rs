//! `run --callgrind DIR`: the instructions each server executes per request,
//! counted by valgrind's callgrind. On a VM whose speed drifts within a run
//! (BENCHMARKS.md), the CPU time of the same request moves by up to 1.7×
//! from one minute to the next; a count of instructions does not, so a
//! change of a fraction of a percent shows.
//!
//! Every server runs under `valgrind --tool=callgrind --instr-atstart=no`:
//! nothing is counted until the closed-loop round's warm-up has passed,
//! then counting is switched on for the measured window
//! (`callgrind_control -i on`), dumped at its end (`-d`, one file
//! `DIR/LABEL.PID.N` per window) and switched off. The requests are the
//! calls of h2's `Recv::take_request` in the dump (one per request the
//! server accepted, in both binaries): a request accepted before the
//! window and one accepted just before its end are each counted in part,
//! and the two edges about balance. A build with link-time optimisation
//! may inline `Recv::take_request` into its caller `StreamRef::take_request`,
//! and that into hyper: then the calls of the first function of that chain
//! still out of line count (each is called once per request where it
//! takes the request, never two of them added).
//!
//! What the count leaves out: the kernel (system calls, the socket, the
//! sync of a durable store), and the cost of an instruction (a cache miss,
//! a contended atomic, SHA-256 in hardware: valgrind's CPU has no SHA
//! extension, so `sha2` runs its portable code, about ten times the
//! instructions). It ranks changes to the code; it is not CPU time.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::BoxResult;

/// The functions whose calls count the requests a server accepted, the
/// first one with calls in a profile: h2's chain that takes a request,
/// innermost first, each called once per request, and at least one of
/// them out of line whatever the build inlines.
const PER_REQUEST: [&str; 3] = [
    "h2::proto::streams::recv::Recv::take_request",
    "h2::proto::streams::streams::StreamRef<B>::take_request",
    "h2::proto::streams::streams::OpaqueStreamRef::new",
];
/// `sha2`'s portable block function, which valgrind's CPU (no SHA
/// extension) runs instead of the SHA instructions.
const PORTABLE_SHA: &str = "sha2::sha256::compress256";

/// Instructions executed over measured windows, and the requests they served.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Instructions {
    pub executed: u64,
    /// Of `executed`, those in [`PORTABLE_SHA`] itself.
    pub portable_sha: u64,
    pub requests: u64,
}

impl Instructions {
    pub fn add(&mut self, other: &Instructions) {
        self.executed += other.executed;
        self.portable_sha += other.portable_sha;
        self.requests += other.requests;
    }

    pub fn per_request(&self) -> Option<f64> {
        (self.requests > 0).then(|| self.executed as f64 / self.requests as f64)
    }

    pub fn portable_sha_per_request(&self) -> Option<f64> {
        (self.requests > 0).then(|| self.portable_sha as f64 / self.requests as f64)
    }
}

/// valgrind's options that run a program under callgrind, counting nothing
/// until told, its profiles written as `dir/label.PID.N`.
pub fn options(dir: &Path, label: &str) -> [String; 3] {
    [
        "--tool=callgrind".to_string(),
        "--instr-atstart=no".to_string(),
        format!(
            "--callgrind-out-file={}",
            dir.join(format!("{label}.%p")).display()
        ),
    ]
}

/// Counts the instructions of process `pid` (started with [`options`] of
/// `dir` and `label`) from `warmup` on for `duration`: run beside the
/// round, which measures the same window.
pub async fn measure(
    dir: PathBuf,
    label: String,
    pid: u32,
    warmup: Duration,
    duration: Duration,
) -> BoxResult<Instructions> {
    tokio::time::sleep(warmup).await;
    control(pid, &["-i", "on"]).await?;
    tokio::time::sleep(duration).await;
    control(pid, &["-d"]).await?;
    control(pid, &["-i", "off"]).await?;
    let dump = last_dump(&dir, &label, pid)?;
    let text =
        std::fs::read_to_string(&dump).map_err(|error| format!("{}: {error}", dump.display()))?;
    read(&text).ok_or_else(|| {
        format!(
            "{}: no totals, or no call of {} (was the window empty?)",
            dump.display(),
            PER_REQUEST.join(" or ")
        )
        .into()
    })
}

async fn control(pid: u32, args: &'static [&'static str]) -> BoxResult<()> {
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("callgrind_control")
            .args(args)
            .arg(pid.to_string())
            .output()
    })
    .await?
    .map_err(|error| format!("callgrind_control: {error} (is valgrind installed?)"))?;
    if !output.status.success() {
        return Err(format!(
            "callgrind_control {} {pid}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        )
        .into());
    }
    Ok(())
}

/// The newest dump of `label.PID` in `dir` (`label.PID.N`, highest N).
fn last_dump(dir: &Path, label: &str, pid: u32) -> BoxResult<PathBuf> {
    let prefix = format!("{label}.{pid}.");
    let mut newest: Option<(u64, PathBuf)> = None;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(number) = name
            .to_str()
            .and_then(|name| name.strip_prefix(&prefix))
            .and_then(|number| number.parse::<u64>().ok())
        else {
            continue;
        };
        if newest.as_ref().is_none_or(|(seen, _)| number > *seen) {
            newest = Some((number, entry.path()));
        }
    }
    newest
        .map(|(_, path)| path)
        .ok_or_else(|| format!("no callgrind dump {prefix}N in {}", dir.display()).into())
}

/// The `totals:` of a callgrind profile, the instructions of
/// [`PORTABLE_SHA`] itself and the calls of [`PER_REQUEST`] in it (of
/// the first one called).
/// Function names are compressed: `fn=(7) name` or `cfn=(7) name` the
/// first time, `(7)` alone after. Under `fn=` come its own costs
/// (`position Ir`); a `calls=N …` line counts N calls to the last `cfn=`,
/// and the cost line after it is that call's (not the function's own).
fn read(text: &str) -> Option<Instructions> {
    let mut names: HashMap<&str, &str> = HashMap::new();
    let mut function = "";
    let mut callee = "";
    let mut call_cost_next = false;
    let mut executed = None;
    let mut portable_sha = 0;
    let mut requests = [0; PER_REQUEST.len()];
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("fn=") {
            function = resolve(rest, &mut names);
        } else if let Some(rest) = line.strip_prefix("cfn=") {
            callee = resolve(rest, &mut names);
        } else if let Some(rest) = line.strip_prefix("calls=") {
            call_cost_next = true;
            if let Some(counted) = PER_REQUEST.iter().position(|name| callee.contains(name)) {
                requests[counted] += first_number(rest).unwrap_or(0);
            }
        } else if let Some(rest) = line.strip_prefix("totals:") {
            executed = rest.trim().parse::<u64>().ok();
        } else if line.starts_with(|c: char| c.is_ascii_digit() || matches!(c, '+' | '-' | '*')) {
            if std::mem::take(&mut call_cost_next) {
                continue;
            }
            if function.contains(PORTABLE_SHA) {
                portable_sha += line
                    .split_whitespace()
                    .nth(1)
                    .and_then(|cost| cost.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
    }
    let executed = executed?;
    let requests = requests.into_iter().find(|&calls| calls > 0).unwrap_or(0);
    (requests > 0).then_some(Instructions {
        executed,
        portable_sha,
        requests,
    })
}

/// The name of a compressed `(id) name` or `(id)`.
fn resolve<'t>(rest: &'t str, names: &mut HashMap<&'t str, &'t str>) -> &'t str {
    match rest.split_once(' ') {
        Some((id, name)) => {
            names.insert(id, name);
            name
        }
        None => names.get(rest).copied().unwrap_or(rest),
    }
}

fn first_number(text: &str) -> Option<u64> {
    text.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_profile_gives_its_totals_and_the_calls_of_the_request_function() {
        let profile = "\
events: Ir
fn=(1) main
3 10
cfn=(2) h2::proto::streams::recv::Recv::take_request
calls=3 0x10
5 90
cfn=(3) sha2::sha256::compress256
calls=100 0x20
5 50
fn=(3)
+2 40
* 2
fn=(4) elsewhere
cfn=(2)
calls=4 0x10
7 120
totals: 1000
";
        assert_eq!(
            read(profile),
            Some(Instructions {
                executed: 1000,
                portable_sha: 42,
                requests: 7
            })
        );
        assert_eq!(read("totals: 5\n"), None);
        // Link-time optimisation: `Recv::take_request` inlined into
        // `StreamRef::take_request`, whose calls count; both present:
        // the innermost one's, never the sum.
        let inlined = "\
fn=(1) main
cfn=(2) h2::proto::streams::streams::StreamRef<B>::take_request
calls=5 0x10
5 90
totals: 500
";
        assert_eq!(read(inlined).map(|counted| counted.requests), Some(5));
        let both = "\
fn=(1) main
cfn=(2) h2::proto::streams::streams::StreamRef<B>::take_request
calls=6 0x10
5 90
fn=(2)
cfn=(3) h2::proto::streams::recv::Recv::take_request
calls=5 0x10
5 80
cfn=(4) h2::proto::streams::streams::OpaqueStreamRef::new
calls=5 0x10
5 20
totals: 500
";
        assert_eq!(read(both).map(|counted| counted.requests), Some(5));
        assert_eq!(
            Instructions {
                executed: 700,
                portable_sha: 0,
                requests: 7
            }
            .per_request(),
            Some(100.0)
        );
    }
}
