//! Identifier rules shared by proposals, sessions, manifests, resources,
//! approvals and the policy.

use uuid::Uuid;

use crate::domain::error::{Error, Result};

/// Text of a fixed length in a stack buffer: a fingerprint's hex digits
/// ([`Fingerprint::hex`](crate::domain::canonical::Fingerprint::hex)) or an
/// id's ([`id_text`]), for an audit line or a record without an allocation
/// or `fmt`. Only ASCII is ever written into it. Read it as `text.as_str()`,
/// or through `Deref` (`id.as_deref()` for an id that may be absent).
#[derive(Clone, Copy)]
pub struct AsciiText<const N: usize>([u8; N]);

impl<const N: usize> AsciiText<N> {
    /// `bytes`, which the caller wrote from ASCII only.
    pub(crate) fn new(bytes: [u8; N]) -> Self {
        debug_assert!(bytes.is_ascii());
        AsciiText(bytes)
    }

    pub fn as_str(&self) -> &str {
        // ASCII only: always UTF-8.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl<const N: usize> std::ops::Deref for AsciiText<N> {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

/// An id's text as its `Display` writes it (lowercase, hyphenated).
pub fn id_text(id: Uuid) -> AsciiText<{ uuid::fmt::Hyphenated::LENGTH }> {
    let mut text = [0; uuid::fmt::Hyphenated::LENGTH];
    id.hyphenated().encode_lower(&mut text);
    AsciiText::new(text)
}

/// Longest identifier allowed by `[A-Za-z][A-Za-z0-9_-]{0,39}`.
pub const MAX_IDENTIFIER_LEN: usize = 40;

/// The bytes of `[A-Za-z0-9_-]`, one lookup per byte of every identifier
/// a call carries.
const IDENTIFIER_BYTES: [bool; 256] = {
    let mut table = [false; 256];
    let mut byte = 0;
    while byte < 256 {
        let b = byte as u8;
        table[byte] = b.is_ascii_alphanumeric() || b == b'_' || b == b'-';
        byte += 1;
    }
    table
};

/// Checks SPEC §2's identifier pattern `[A-Za-z][A-Za-z0-9_-]{0,39}` (call ids,
/// actors, tool names, session ids, workspaces).
pub fn check_identifier(field: &str, value: &str) -> Result<()> {
    let bytes = value.as_bytes();
    let Some(first) = bytes.first() else {
        return Err(Error::invalid(field, "must not be empty"));
    };
    if bytes.len() > MAX_IDENTIFIER_LEN {
        return Err(Error::invalid(
            field,
            format!(
                "must be at most {MAX_IDENTIFIER_LEN} characters matching [A-Za-z][A-Za-z0-9_-]*"
            ),
        ));
    }
    if !first.is_ascii_alphabetic() {
        return Err(Error::invalid(field, "must start with an ASCII letter"));
    }
    if !bytes
        .iter()
        .all(|byte| IDENTIFIER_BYTES[usize::from(*byte)])
    {
        return Err(Error::invalid(
            field,
            "must match [A-Za-z][A-Za-z0-9_-]{0,39} (ASCII letters, digits, '_' and '-')",
        ));
    }
    Ok(())
}

/// Longest manifest server id or manifest tool name.
pub const MAX_SERVER_ID_LEN: usize = 64;

/// Checks a manifest server id or manifest tool name:
/// `[A-Za-z0-9][A-Za-z0-9._-]{0,63}`.
pub fn check_server_id(field: &str, value: &str) -> Result<()> {
    let bytes = value.as_bytes();
    let Some(first) = bytes.first() else {
        return Err(Error::invalid(field, "must not be empty"));
    };
    let valid = bytes.len() <= MAX_SERVER_ID_LEN
        && first.is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-'));
    if !valid {
        return Err(Error::invalid(
            field,
            "must match [A-Za-z0-9][A-Za-z0-9._-]{0,63}",
        ));
    }
    Ok(())
}

/// Longest resource name (the policy's `state.resources` keys).
pub const MAX_RESOURCE_NAME_LEN: usize = 64;

/// Checks a resource name: 1 to [`MAX_RESOURCE_NAME_LEN`] bytes.
pub fn check_resource_name(field: &str, name: &str) -> Result<()> {
    if name.is_empty() || name.len() > MAX_RESOURCE_NAME_LEN {
        return Err(Error::invalid(
            field,
            format!("must be 1 to {MAX_RESOURCE_NAME_LEN} bytes"),
        ));
    }
    Ok(())
}

/// Parses an approval id: a UUID, required.
pub fn approval_id(field: &str, text: &str) -> Result<Uuid> {
    if text.is_empty() {
        return Err(Error::invalid(field, "is required"));
    }
    Uuid::parse_str(text).map_err(|_| Error::invalid(field, "must be a UUID"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_as_text_is_its_display() {
        for id in [Uuid::nil(), Uuid::max(), Uuid::new_v4()] {
            assert_eq!(&*id_text(id), id.to_string());
            assert_eq!(id_text(id).as_str(), id.to_string());
        }
    }

    #[test]
    fn identifiers_follow_the_spec_pattern() {
        for good in ["a", "c1", "set_ticket", "Finance-Payments", &"a".repeat(40)] {
            assert_eq!(check_identifier("call_id", good), Ok(()), "{good}");
        }
        for bad in [
            "",
            "1a",
            "_a",
            "a b",
            "a.b",
            "аctor",
            &"a".repeat(41),
            "a\u{0}",
        ] {
            let Err(Error::InvalidArgument { field, .. }) = check_identifier("call_id", bad) else {
                panic!("{bad:?} accepted");
            };
            assert_eq!(field, "call_id");
        }
    }

    #[test]
    fn an_identifier_takes_exactly_letters_digits_underscores_and_hyphens() {
        for code in 0..=0x2ffu32 {
            let Some(next) = char::from_u32(code) else {
                continue;
            };
            let allowed = next.is_ascii_alphanumeric() || next == '_' || next == '-';
            assert_eq!(
                check_identifier("call_id", &format!("a{next}z")).is_ok(),
                allowed,
                "U+{code:04X}"
            );
        }
    }

    #[test]
    fn server_ids_allow_dots_and_leading_digits() {
        assert_eq!(check_server_id("server_id", "github.com-mcp_1"), Ok(()));
        assert_eq!(check_server_id("server_id", "9lives"), Ok(()));
        assert!(matches!(
            check_server_id("server_id", ".hidden"),
            Err(Error::InvalidArgument { .. })
        ));
        assert!(matches!(
            check_server_id("server_id", &"s".repeat(65)),
            Err(Error::InvalidArgument { .. })
        ));
    }
}
