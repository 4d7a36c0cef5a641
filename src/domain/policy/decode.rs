//! Decoding errors in plain words: TOML to the raw policy, with an error
//! that names its key path; and TOML values as JSON.

use super::PolicyError;
use super::parse::{Loader, RawPolicy};

/// Parses the TOML and decodes it into the raw policy. An error names the
/// key path it is about (found from the error's position in the text) and
/// says what is wrong in the policy's own terms, never in Rust's.
pub(super) fn decode(loader: &Loader<'_>, text: &str) -> Result<RawPolicy, PolicyError> {
    let document = toml::de::DeTable::parse(text).map_err(|error| {
        let message = error.message().replace('\n', "; ");
        match error.span() {
            Some(span) => loader.error(line_and_column(text, span.start), message),
            None => loader.error("", message),
        }
    })?;
    if document.get_ref().is_empty() {
        return Err(loader.error(
            "",
            "the policy is empty: it must declare its tools and how hosts authenticate",
        ));
    }
    toml::from_str::<RawPolicy>(text).map_err(|error| {
        let path = error
            .span()
            .map(|span| key_path_at(document.get_ref(), span.start))
            .unwrap_or_default();
        let at_table = matches!(
            value_at(document.get_ref(), &path),
            Some(toml::de::DeValue::Table(_))
        );
        match plain_message(error.message(), path, at_table) {
            Some((key, message)) => loader.error(key, message),
            // Not a message we know: say where it is, as TOML put it.
            None => match error.span() {
                Some(span) => loader.error(line_and_column(text, span.start), error.message()),
                None => loader.error("", error.message()),
            },
        }
    })
}

/// The value a key path leads to.
fn value_at<'a>(
    table: &'a toml::de::DeTable<'_>,
    path: &[Segment],
) -> Option<&'a toml::de::DeValue<'a>> {
    let (Segment::Key(first), rest) = path.split_first()? else {
        return None;
    };
    let mut value = table
        .iter()
        .find(|(key, _)| key.get_ref() == first)
        .map(|(_, value)| value.get_ref())?;
    for segment in rest {
        value = match (segment, value) {
            (Segment::Key(name), toml::de::DeValue::Table(table)) => table
                .iter()
                .find(|(key, _)| key.get_ref() == name)
                .map(|(_, value)| value.get_ref())?,
            (Segment::Index(index), toml::de::DeValue::Array(items)) => {
                items.get(*index).map(|item| item.get_ref())?
            }
            _ => return None,
        };
    }
    Some(value)
}

fn line_and_column(text: &str, offset: usize) -> String {
    let before = &text[..floor_char_boundary(text, offset)];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |newline| newline + 1) + 1;
    format!("line {line}, column {column}")
}

fn floor_char_boundary(text: &str, offset: usize) -> usize {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    offset
}

/// One step of a key path.
enum Segment {
    Key(String),
    Index(usize),
}

/// The path of the deepest key or value whose text contains `offset`.
fn key_path_at(table: &toml::de::DeTable<'_>, offset: usize) -> Vec<Segment> {
    let mut path = Vec::new();
    descend_table(table, offset, &mut path);
    path
}

fn descend_table(table: &toml::de::DeTable<'_>, offset: usize, path: &mut Vec<Segment>) {
    for (key, value) in table {
        if key.span().contains(&offset) {
            path.push(Segment::Key(key.get_ref().to_string()));
            return;
        }
        if value.span().contains(&offset) || nested_contains(value.get_ref(), offset) {
            path.push(Segment::Key(key.get_ref().to_string()));
            descend_value(value.get_ref(), offset, path);
            return;
        }
    }
}

fn descend_value(value: &toml::de::DeValue<'_>, offset: usize, path: &mut Vec<Segment>) {
    match value {
        toml::de::DeValue::Table(table) => descend_table(table, offset, path),
        toml::de::DeValue::Array(items) => {
            for (index, item) in items.iter().enumerate() {
                if item.span().contains(&offset) || nested_contains(item.get_ref(), offset) {
                    path.push(Segment::Index(index));
                    descend_value(item.get_ref(), offset, path);
                    return;
                }
            }
        }
        _ => {}
    }
}

/// Whether a table's or array's entries contain `offset` (a table made by
/// `[header]` sections has no one span covering all its keys).
fn nested_contains(value: &toml::de::DeValue<'_>, offset: usize) -> bool {
    match value {
        toml::de::DeValue::Table(table) => table.iter().any(|(key, value)| {
            key.span().contains(&offset)
                || value.span().contains(&offset)
                || nested_contains(value.get_ref(), offset)
        }),
        toml::de::DeValue::Array(items) => items
            .iter()
            .any(|item| item.span().contains(&offset) || nested_contains(item.get_ref(), offset)),
        _ => false,
    }
}

fn render_path(path: &[Segment]) -> String {
    let mut text = String::new();
    for segment in path {
        match segment {
            Segment::Key(key) => {
                if !text.is_empty() {
                    text.push('.');
                }
                let bare = !key.is_empty()
                    && key
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
                if bare {
                    text.push_str(key);
                } else {
                    text.push_str(&format!("{key:?}"));
                }
            }
            Segment::Index(index) => text.push_str(&format!("[{index}]")),
        }
    }
    text
}

/// Rewrites serde's decoding messages (`invalid type: string "300",
/// expected u64`, `missing field `mode``, `unknown field `limit`, …`) in
/// plain words, and decides which key the message belongs to: a missing or
/// unknown key is reported on the table that should (not) hold it. `None`
/// for a message it does not know.
fn plain_message(
    message: &str,
    mut path: Vec<Segment>,
    at_table: bool,
) -> Option<(String, String)> {
    if let Some(rest) = message.strip_prefix("missing field ") {
        let name = first_backquoted(rest).unwrap_or(rest);
        // The position may be one of the table's keys: name the table.
        if !at_table {
            path.pop();
        }
        return Some((render_path(&path), format!("missing key {name}")));
    }
    if let Some(rest) = message.strip_prefix("unknown field ") {
        let name = first_backquoted(rest).unwrap_or(rest);
        if matches!(path.last(), Some(Segment::Key(last)) if last == name) {
            path.pop();
        }
        return Some((render_path(&path), format!("unknown key {name}")));
    }
    if let Some(rest) = message.strip_prefix("unknown variant ") {
        let name = first_backquoted(rest).unwrap_or(rest);
        let allowed = rest
            .split_once("expected ")
            .map(|(_, expected)| quote_backquoted(expected.trim_start_matches("one of ")))
            .unwrap_or_default();
        return Some((
            render_path(&path),
            format!("must be {allowed}, not {name:?}"),
        ));
    }
    for prefix in ["invalid type: ", "invalid value: "] {
        if let Some(rest) = message.strip_prefix(prefix)
            && let Some((found, expected)) = rest.rsplit_once(", expected ")
        {
            return Some((
                render_path(&path),
                format!(
                    "expected {}, found {}",
                    plain_expected(expected),
                    plain_found(found)
                ),
            ));
        }
    }
    None
}

fn first_backquoted(text: &str) -> Option<&str> {
    let start = text.find('`')? + 1;
    let length = text[start..].find('`')?;
    Some(&text[start..start + length])
}

/// `` `a`, `b` or `c` `` → `"a", "b" or "c"`.
fn quote_backquoted(text: &str) -> String {
    let mut quoted = String::new();
    let mut inside = false;
    for character in text.chars() {
        if character == '`' {
            quoted.push('"');
            inside = !inside;
        } else {
            quoted.push(character);
        }
    }
    quoted
}

fn plain_expected(expected: &str) -> String {
    match expected {
        "u8" | "u16" | "u32" | "u64" | "u128" | "usize" => "a non-negative integer".to_string(),
        "i8" | "i16" | "i32" | "i64" | "i128" | "isize" => "an integer".to_string(),
        "f32" | "f64" => "a number".to_string(),
        "a boolean" => "true or false".to_string(),
        "a sequence" => "an array".to_string(),
        "a map" => "a table".to_string(),
        "path string" => "a string (a file path)".to_string(),
        other if other.starts_with("struct ") => "a table".to_string(),
        other if other.starts_with("enum ") => "a string".to_string(),
        other => quote_backquoted(other),
    }
}

fn plain_found(found: &str) -> String {
    let value = first_backquoted(found);
    match found.split_once(' ').map_or(found, |(kind, _)| kind) {
        "string" => format!("the string {}", &found["string ".len()..]),
        "integer" => format!("the integer {}", value.unwrap_or("")),
        "floating" => format!("the number {}", value.unwrap_or("")),
        "boolean" => value.unwrap_or(found).to_string(),
        "sequence" => "an array".to_string(),
        "map" => "a table".to_string(),
        _ => quote_backquoted(found),
    }
}

/// TOML has no null and distinguishes integers from floats like JSON does.
/// `nan` and `inf` have no JSON form: refused (with the JSON pointer of the
/// value below the key, `pointer` being where `value` is), never turned
/// into something else.
pub(super) fn toml_to_json(
    value: &toml::Value,
    pointer: &str,
) -> Result<serde_json::Value, String> {
    Ok(match value {
        toml::Value::String(text) => serde_json::Value::String(text.clone()),
        toml::Value::Integer(number) => serde_json::Value::from(*number),
        toml::Value::Float(number) => match serde_json::Number::from_f64(*number) {
            Some(number) => serde_json::Value::Number(number),
            None => {
                let at = if pointer.is_empty() { "/" } else { pointer };
                return Err(format!(
                    "at {at}: {} has no JSON form (nan and inf are refused)",
                    number.to_string().to_lowercase()
                ));
            }
        },
        toml::Value::Boolean(flag) => serde_json::Value::Bool(*flag),
        toml::Value::Datetime(datetime) => serde_json::Value::String(datetime.to_string()),
        toml::Value::Array(items) => serde_json::Value::Array(
            items
                .iter()
                .enumerate()
                .map(|(index, item)| toml_to_json(item, &format!("{pointer}/{index}")))
                .collect::<Result<_, _>>()?,
        ),
        toml::Value::Table(table) => serde_json::Value::Object(
            table
                .iter()
                .map(|(key, item)| {
                    let escaped = key.replace('~', "~0").replace('/', "~1");
                    toml_to_json(item, &format!("{pointer}/{escaped}"))
                        .map(|json| (key.clone(), json))
                })
                .collect::<Result<_, _>>()?,
        ),
    })
}
