//! Markdown tables of what the rounds measured.

use std::fmt::Write as _;
use std::time::Duration;

use crate::load::RoundStats;

pub fn latency(duration: Duration) -> String {
    let micros = duration.as_secs_f64() * 1e6;
    if micros < 10.0 {
        format!("{micros:.1} µs")
    } else if micros < 1000.0 {
        format!("{micros:.0} µs")
    } else if micros < 1e6 {
        format!("{:.2} ms", micros / 1e3)
    } else {
        format!("{:.2} s", micros / 1e6)
    }
}

pub fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

pub fn rate(per_second: f64) -> String {
    if per_second >= 100.0 {
        format!("{per_second:.0}")
    } else {
        format!("{per_second:.1}")
    }
}

pub fn ratio(numerator: f64, denominator: f64) -> String {
    if denominator <= 0.0 {
        return "–".into();
    }
    format!("{:.2}×", numerator / denominator)
}

/// The closed-loop throughput of one server over another's in a scenario:
/// over all their rounds, and per alternation. Each alternation runs every
/// server's round once, one after the other, so a ratio per alternation
/// compares rounds seconds apart, and the spread of those ratios shows how
/// far the machine's drifting speed moves the whole.
#[derive(Debug)]
pub struct Ratio {
    whole: f64,
    per_alternation: Vec<f64>,
}

impl Ratio {
    pub fn of(first: &RoundStats, second: &RoundStats) -> Ratio {
        // Nothing to compare with (a server that answered nothing): NaN,
        // shown as `–` and never meeting a goal.
        let quotient = |numerator: f64, denominator: f64| match denominator > 0.0 {
            true => numerator / denominator,
            false => f64::NAN,
        };
        Ratio {
            whole: quotient(first.throughput(), second.throughput()),
            per_alternation: first
                .round_rates
                .iter()
                .zip(&second.round_rates)
                .map(|(first, second)| quotient(*first, *second))
                .collect(),
        }
    }

    /// `0.63×`, and with more than one alternation `0.63× (0.55–0.71 in 2
    /// alternations)`.
    pub fn text(&self) -> String {
        if self.whole.is_nan() {
            return "–".into();
        }
        let mut text = format!("{:.2}×", self.whole);
        let low = self.per_alternation.iter().copied().reduce(f64::min);
        let high = self.per_alternation.iter().copied().reduce(f64::max);
        if let (Some(low), Some(high), 2..) = (low, high, self.per_alternation.len()) {
            let _ = write!(
                text,
                " ({low:.2}–{high:.2} in {} alternations)",
                self.per_alternation.len()
            );
        }
        text
    }

    /// The goal's verdict on the whole ratio, with the alternations that
    /// reached it: `met (in 1 of 2 alternations)`.
    pub fn verdict(&self, goal: f64) -> String {
        let verdict = if self.whole >= goal { "met" } else { "NOT MET" };
        match self.per_alternation.len() {
            0 | 1 => verdict.to_string(),
            count => {
                let reached = self
                    .per_alternation
                    .iter()
                    .filter(|ratio| **ratio >= goal)
                    .count();
                format!("{verdict} (in {reached} of {count} alternations)")
            }
        }
    }
}

fn errors(stats: &RoundStats) -> String {
    if stats.errors.is_empty() {
        return "0".into();
    }
    stats
        .errors
        .iter()
        .map(|(code, count)| format!("{code} {count}"))
        .collect::<Vec<_>>()
        .join(", ")
}

pub const QUANTILES: [(f64, &str); 4] = [
    (0.50, "p50"),
    (0.90, "p90"),
    (0.99, "p99"),
    (0.999, "p99.9"),
];

/// The header of a latency table whose first column is `first`.
pub fn header(first: &str) -> String {
    format!(
        "| {first} | req/s | p50 | p90 | p99 | p99.9 | max | errors | wrong answers | server CPU/req | client CPU/req | ops/batch | sync mean (p99 ≤, max ≤) |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |\n"
    )
}

/// The store's group commit in a round: operations per batch, and the mean
/// sync with the bucket bounds of its 99th percentile and of its slowest
/// batch (`?` past the last finite bucket, 5 s).
pub fn store_cells(stats: &RoundStats) -> (String, String) {
    let store = &stats.store;
    let operations = store
        .operations_per_batch()
        .map_or_else(|| "–".to_string(), |ops| format!("{ops:.1}"));
    let bound = |quantile| {
        store
            .sync_quantile_bound(quantile)
            .map_or_else(|| "?".to_string(), latency)
    };
    let sync = store.mean_sync().map_or_else(
        || "–".to_string(),
        |mean| format!("{} ({}, {})", latency(mean), bound(0.99), bound(1.0)),
    );
    (operations, sync)
}

/// One row of a latency table.
pub fn row(first: &str, stats: &RoundStats) -> String {
    let mut line = format!("| {first} | {} |", rate(stats.throughput()));
    for (quantile, _) in QUANTILES {
        let _ = write!(line, " {} |", latency(stats.percentile(quantile)));
    }
    let (operations, sync) = store_cells(stats);
    let _ = writeln!(
        line,
        " {} | {} | {} | {} | {} | {operations} | {sync} |",
        latency(stats.max()),
        errors(stats),
        stats.wrong,
        latency(stats.server_cpu_per_request()),
        latency(stats.client_cpu_per_request()),
    );
    line
}

/// A ratio row (`label`, e.g. durable/memory): throughput ratio (higher is
/// better for the first) and latency ratios (lower is better).
pub fn ratio_row(label: &str, first: &RoundStats, second: &RoundStats) -> String {
    let mut line = format!("| **{label}** | **{}** |", Ratio::of(first, second).text());
    for (quantile, name) in QUANTILES {
        let text = ratio(
            first.percentile(quantile).as_secs_f64(),
            second.percentile(quantile).as_secs_f64(),
        );
        if name == "p99" {
            let _ = write!(line, " **{text}** |");
        } else {
            let _ = write!(line, " {text} |");
        }
    }
    let _ = writeln!(
        line,
        " {} | | | {} | | | |",
        ratio(first.max().as_secs_f64(), second.max().as_secs_f64()),
        ratio(
            first.server_cpu_per_request().as_secs_f64(),
            second.server_cpu_per_request().as_secs_f64()
        ),
    );
    line
}

/// Notes under a table: wrong answers and errors seen, pools run dry.
pub fn notes(label: &str, stats: &RoundStats) -> String {
    let mut text = String::new();
    if let Some(wrong) = &stats.first_wrong {
        let _ = writeln!(text, "- {label}: first wrong answer: {wrong}");
    }
    if let Some(error) = &stats.first_error {
        let _ = writeln!(text, "- {label}: first error: {error}");
    }
    if stats.exhausted {
        let _ = writeln!(
            text,
            "- {label}: the prepared requests ran out before the end of a round (the round was shorter)"
        );
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rounds(rates: &[f64]) -> RoundStats {
        let mut stats = RoundStats::empty();
        for rate in rates {
            let mut round = RoundStats::empty();
            round.completed = *rate as u64;
            round.elapsed = Duration::from_secs(1);
            round.round_rates = vec![*rate];
            stats.merge(&round);
        }
        stats
    }

    #[test]
    fn a_ratio_per_alternation_beside_the_whole() {
        let ratio = Ratio::of(&rounds(&[600.0, 900.0]), &rounds(&[1000.0, 1000.0]));
        assert_eq!(ratio.whole, 0.75);
        assert_eq!(ratio.per_alternation, vec![0.6, 0.9]);
        assert_eq!(ratio.text(), "0.75× (0.60–0.90 in 2 alternations)");
        assert_eq!(ratio.verdict(0.7), "met (in 1 of 2 alternations)");
        assert_eq!(ratio.verdict(0.8), "NOT MET (in 1 of 2 alternations)");
        assert_eq!(ratio.verdict(0.95), "NOT MET (in 0 of 2 alternations)");
    }

    #[test]
    fn one_alternation_is_the_whole_ratio_alone() {
        let ratio = Ratio::of(&rounds(&[500.0]), &rounds(&[1000.0]));
        assert_eq!(ratio.text(), "0.50×");
        assert_eq!(ratio.verdict(0.5), "met");
        // Against a server that answered nothing there is no ratio.
        let none = Ratio::of(&rounds(&[500.0]), &rounds(&[0.0]));
        assert_eq!(none.text(), "–");
        assert_eq!(none.verdict(0.5), "NOT MET");
    }
}
