//! The Prometheus exposition of a metrics listener, over plain HTTP/1.1.

use std::collections::HashMap;
use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// GET /metrics: the exposition text (the answer must be 200 OK).
pub async fn scrape(addr: SocketAddr) -> String {
    let mut stream = TcpStream::connect(addr).await.expect("connect metrics");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .expect("request");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .await
        .expect("response");
    let (head, body) = response.split_once("\r\n\r\n").expect("http response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_string()
}

/// Samples `name{labels} value` of the exposition text, by `name{labels}`.
pub fn samples(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            Some((series.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// One raw GET /metrics with extra request header lines: the response head
/// and the body's bytes (as sent, so possibly compressed).
pub async fn scrape_raw(addr: SocketAddr, extra_headers: &str) -> (String, Vec<u8>) {
    let mut stream = TcpStream::connect(addr).await.expect("connect metrics");
    let request = format!(
        "GET /metrics HTTP/1.1\r\nHost: localhost\r\n{extra_headers}Connection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.expect("request");
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.expect("response");
    let split = response
        .windows(4)
        .position(|window| window == b"\r\n\r\n")
        .expect("http response");
    let head = String::from_utf8(response[..split].to_vec()).expect("ascii head");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    (head, response[split + 4..].to_vec())
}

/// One sample of a family: its name, its labels in order, its value.
pub type Sample = (String, Vec<(String, String)>, f64);

/// One metric family of a parsed exposition.
#[derive(Debug, Default, Clone)]
pub struct Family {
    pub help: Option<String>,
    pub kind: Option<String>,
    /// `(sample name, labels, value)`, in order.
    pub samples: Vec<Sample>,
}

/// Parses the Prometheus text format (0.0.4) strictly, as Prometheus's own
/// parser does: `# HELP`/`# TYPE` lines (at most one each per family, TYPE
/// before the family's samples), samples `name{label="value",...} value`
/// with escaped label values, histogram and summary samples
/// (`_bucket`/`_sum`/`_count`) grouped under their family. Panics, naming
/// the line, on anything else.
pub fn parse_exposition(text: &str) -> std::collections::BTreeMap<String, Family> {
    let mut families: std::collections::BTreeMap<String, Family> = Default::default();
    let valid_name = |name: &str| {
        !name.is_empty()
            && name.chars().enumerate().all(|(at, c)| {
                c.is_ascii_alphabetic() || c == '_' || c == ':' || (at > 0 && c.is_ascii_digit())
            })
    };
    for (number, line) in text.lines().enumerate() {
        let context = || format!("line {}: {line:?}", number + 1);
        if line.trim().is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix("# ") {
            let mut parts = comment.splitn(3, ' ');
            let (keyword, name, rest) = (parts.next(), parts.next(), parts.next());
            let Some(name) = name else { continue };
            assert!(valid_name(name), "bad family name, {}", context());
            let family = families.entry(name.to_string()).or_default();
            match keyword {
                Some("HELP") => {
                    assert!(family.help.is_none(), "second HELP, {}", context());
                    family.help = Some(rest.unwrap_or("").to_string());
                }
                Some("TYPE") => {
                    assert!(family.kind.is_none(), "second TYPE, {}", context());
                    assert!(
                        family.samples.is_empty(),
                        "TYPE after samples, {}",
                        context()
                    );
                    let kind = rest.unwrap_or("");
                    assert!(
                        ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                        "bad TYPE, {}",
                        context()
                    );
                    family.kind = Some(kind.to_string());
                }
                _ => {}
            }
            continue;
        }
        let name_end = line
            .find(['{', ' '])
            .unwrap_or_else(|| panic!("no value, {}", context()));
        let name = &line[..name_end];
        assert!(valid_name(name), "bad metric name, {}", context());
        let mut rest = &line[name_end..];
        let mut labels = Vec::new();
        if let Some(inner) = rest.strip_prefix('{') {
            let bytes = inner.as_bytes();
            let mut at = 0;
            while bytes.get(at) != Some(&b'}') {
                let eq = inner[at..]
                    .find('=')
                    .unwrap_or_else(|| panic!("label without =, {}", context()));
                let label = &inner[at..at + eq];
                assert!(
                    valid_name(label) && !label.contains(':'),
                    "bad label name, {}",
                    context()
                );
                at += eq + 1;
                assert_eq!(
                    bytes.get(at),
                    Some(&b'"'),
                    "unquoted label value, {}",
                    context()
                );
                at += 1;
                let mut value = String::new();
                loop {
                    let c = inner[at..]
                        .chars()
                        .next()
                        .unwrap_or_else(|| panic!("unterminated label value, {}", context()));
                    at += c.len_utf8();
                    match c {
                        '"' => break,
                        '\\' => {
                            value.push(match bytes.get(at) {
                                Some(b'n') => '\n',
                                Some(b'\\') => '\\',
                                Some(b'"') => '"',
                                _ => panic!("bad escape, {}", context()),
                            });
                            at += 1;
                        }
                        other => value.push(other),
                    }
                }
                labels.push((label.to_string(), value));
                match bytes.get(at) {
                    Some(b',') => at += 1,
                    Some(b'}') => {}
                    _ => panic!("bad label separator, {}", context()),
                }
            }
            rest = &inner[at + 1..];
        }
        let mut fields = rest.split_whitespace();
        let value = fields
            .next()
            .unwrap_or_else(|| panic!("no value, {}", context()));
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            "NaN" => f64::NAN,
            number => number
                .parse()
                .unwrap_or_else(|_| panic!("bad value, {}", context())),
        };
        if let Some(timestamp) = fields.next() {
            timestamp
                .parse::<i64>()
                .unwrap_or_else(|_| panic!("bad timestamp, {}", context()));
        }
        assert!(fields.next().is_none(), "trailing text, {}", context());
        let family_name = ["_bucket", "_sum", "_count"]
            .iter()
            .filter_map(|suffix| name.strip_suffix(suffix))
            .find(|base| {
                families
                    .get(*base)
                    .and_then(|family| family.kind.as_deref())
                    .is_some_and(|kind| kind == "histogram" || kind == "summary")
            })
            .unwrap_or(name);
        families
            .entry(family_name.to_string())
            .or_default()
            .samples
            .push((name.to_string(), labels, value));
    }
    families
}
