//! The log sink against a `toolgate serve` process of its own: a stderr
//! pipe nobody drains does not freeze the server (health turns NOT_SERVING,
//! calls fail fast with UNAVAILABLE, and everything comes back once it
//! drains, with not one audit line lost), and the file sink rotates by size
//! without losing or splitting lines.

use std::collections::HashMap;
use std::io::Read;

use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;

use crate::support::policies::decide_text;
use crate::support::raw::until;
use crate::support::spawn::Serve;
use crate::support::tokens::HOST;
use crate::support::{authed, pb, read_balance};

fn decide_request(call_id: &str) -> tonic::Request<pb::DecideRequest> {
    authed(read_balance(call_id), HOST)
}

/// The call ids of the `decision` audit lines (JSON log format), counted.
fn decisions(text: &str) -> HashMap<String, usize> {
    let mut counted = HashMap::new();
    for line in text.lines() {
        let Ok(value) = serde_json::from_str::<serde_json::Value>(line) else {
            panic!("a line that is not whole JSON: {line:?}");
        };
        if value["event"] == "decision" {
            let call_id = value["call_id"].as_str().expect("call_id").to_string();
            *counted.entry(call_id).or_insert(0) += 1;
        }
    }
    counted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stderr_nobody_reads_turns_health_off_fails_calls_fast_and_loses_nothing() {
    let mut server = Serve::new(&decide_text(""))
        .with_metrics()
        .args(&["--log-format", "json", "--log-stall-seconds", "1"])
        .pipe_stderr()
        .start();
    let mut pdp = server.pdp().await;
    // Decide until the pipe (64 KiB) is full and the sink has been stuck
    // for a second: then calls fail fast instead of hanging.
    let mut answered = 0;
    let refusal = loop {
        assert!(answered < 200_000, "never refused");
        match pdp.decide(decide_request(&format!("d{answered}"))).await {
            // Past the session's decision budget the answer is a DENY;
            // every answer, ALLOW or DENY, writes its decision line.
            Ok(_) => answered += 1,
            Err(status) => break status,
        }
    };
    assert_eq!(refusal.code(), Code::Unavailable, "{refusal:?}");
    assert_eq!(
        refusal.message(),
        "toolgate's log sink is not taking audit lines; retry when health is SERVING"
    );
    until("health NOT_SERVING", || async {
        server.health().await == ServingStatus::NotServing
    })
    .await;
    let samples = server.metrics().await;
    assert_eq!(samples["toolgate_log_sink_stalled"], 1.0);
    assert_eq!(samples["toolgate_log_sink_stalls_total"], 1.0);
    assert!(samples["toolgate_log_stall_refused_total"] >= 1.0);
    let buffered = samples["toolgate_log_buffered_bytes"];
    assert!(
        buffered < 8.0 * 1024.0 * 1024.0,
        "{buffered} bytes buffered"
    );
    eprintln!("stalled after {answered} decisions with {buffered} bytes buffered");
    // Refusals a client can cause at will are only counted while the sink
    // is stalled: none of them waits in the buffer (a host retrying an old
    // token would otherwise fill it until every caller waits).
    let coalesced = r#"toolgate_audit_coalesced_total{event="auth_failed"}"#;
    for index in 0..150 {
        let request = authed(
            pb::DecideRequest::default(),
            &format!("not-a-token-{index}"),
        );
        let refused = pdp.decide(request).await.expect_err("refused");
        assert_eq!(refused.code(), Code::Unauthenticated);
    }
    let samples = server.metrics().await;
    assert_eq!(samples[coalesced], 150.0);
    let grown = samples["toolgate_log_buffered_bytes"] - buffered;
    assert!(grown < 1024.0, "{grown} bytes more buffered");
    // Somebody reads stderr again: the server recovers.
    let mut stderr = server.stderr.take().expect("stderr");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        stderr.read_to_string(&mut text).expect("read stderr");
        text
    });
    until("health SERVING", || async {
        server.health().await == ServingStatus::Serving
    })
    .await;
    pdp.decide(decide_request("after"))
        .await
        .expect("served after the sink drained");
    drop(pdp);
    assert_eq!(server.stop(), Some(0));
    let text = reader.join().expect("reader");
    // Every answered decision left exactly one audit line; the refused call
    // none.
    let counted = decisions(&text);
    assert_eq!(counted.len(), answered + 1);
    for index in 0..answered {
        assert_eq!(counted.get(&format!("d{index}")), Some(&1), "d{index}");
    }
    assert_eq!(counted.get("after"), Some(&1));
    assert_eq!(counted.get(&format!("d{answered}")), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_a_server_whose_stderr_nobody_reads_and_says_lines_were_lost() {
    let server = Serve::new(&decide_text("[server]\nshutdown_grace_seconds = 1"))
        .args(&["--log-format", "json", "--log-stall-seconds", "1"])
        .pipe_stderr()
        .start();
    let mut pdp = server.pdp().await;
    let mut answered = 0;
    while pdp
        .decide(decide_request(&format!("d{answered}")))
        .await
        .is_ok()
    {
        answered += 1;
        assert!(answered < 200_000, "never refused");
    }
    drop(pdp);
    // The writer is blocked in a write to the full pipe: the process still
    // exits (it waited forever for it), and its status says lines were lost.
    let code = tokio::task::spawn_blocking(move || server.stop())
        .await
        .expect("waited");
    assert_eq!(code, Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_file_sink_rotates_by_size_and_keeps_every_line() {
    let directory = tempfile::tempdir().expect("temp dir");
    let path = directory.path().join("toolgate.log");
    let path_text = path.display().to_string();
    let server = Serve::new(&decide_text(""))
        .with_metrics()
        .args(&[
            "--log-format",
            "json",
            "--log-file",
            &path_text,
            "--log-max-bytes",
            "20000",
            "--log-max-files",
            "1000",
        ])
        .start();
    let mut pdp = server.pdp().await;
    for index in 0..300 {
        pdp.decide(decide_request(&format!("f{index}")))
            .await
            .expect("decide");
    }
    drop(pdp);
    assert_eq!(server.stop(), Some(0));
    let mut files = 0;
    let mut text = String::new();
    for entry in std::fs::read_dir(directory.path()).expect("read dir") {
        let entry = entry.expect("entry");
        let name = entry.file_name().to_string_lossy().into_owned();
        assert!(name.starts_with("toolgate.log"), "{name}");
        let content = std::fs::read_to_string(entry.path()).expect("read log");
        assert!(content.ends_with('\n'), "{name} ends inside a line");
        text.push_str(&content);
        files += 1;
    }
    assert!(
        files >= 3,
        "{files} files for ~100 KB of lines at 20,000 bytes each"
    );
    let counted = decisions(&text);
    assert_eq!(counted.len(), 300);
    assert!(counted.values().all(|count| *count == 1));
}

/// `RUST_LOG` chooses the other logs, never the audit trail: with `warn`
/// the start's INFO lines are gone and every decision's line is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_log_never_turns_the_audit_trail_off() {
    let mut server = Serve::new(&decide_text(""))
        .args(&["--log-format", "json"])
        .pipe_stderr()
        .start_wrapped(|mut command| {
            command.env("RUST_LOG", "warn");
            command
        });
    let mut pdp = server.pdp().await;
    pdp.decide(decide_request("quiet")).await.expect("decided");
    drop(pdp);
    let mut stderr = server.stderr.take().expect("stderr");
    assert_eq!(server.stop(), Some(0));
    let mut text = String::new();
    stderr.read_to_string(&mut text).expect("read stderr");
    assert_eq!(decisions(&text).get("quiet"), Some(&1), "{text}");
    assert!(!text.contains("toolgate serving"), "{text}");
}
