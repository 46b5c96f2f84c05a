//! Text output that must match Python byte for byte: JSON string quoting (`json.dumps(s,
//! ensure_ascii=False)`), URL components (`urllib.parse.quote(s, safe="-_.~")`). Floats are written by Python's own `float.__repr__` (see `resolve`): Rust's
//! shortest formatting breaks ties between two equally close shortest forms differently.

use std::fmt::Write;

/// Append `s` as a JSON string literal, escaping exactly what Python's `json` escapes with
/// `ensure_ascii=False`: `"`, `\` and the control characters below U+0020.
pub fn write_json_string(out: &mut String, s: &str) {
    out.reserve(s.len() + 2);
    out.push('"');
    let bytes = s.as_bytes();
    let mut run = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x08 => "\\b",
            0x0c => "\\f",
            0..=0x1f => "",
            _ => continue,
        };
        out.push_str(&s[run..i]);
        if escape.is_empty() {
            let _ = write!(out, "\\u{b:04x}");
        } else {
            out.push_str(escape);
        }
        run = i + 1;
    }
    out.push_str(&s[run..]);
    out.push('"');
}

/// Append `text` percent-encoded as one URL component (RFC 3986): its UTF-8 bytes, each but the unreserved
/// `A-Z a-z 0-9 - _ . ~` written `%XX` (upper-case hex), as mcpg's `percent_encode_component` writes them.
pub fn url_component(out: &mut String, text: &str) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &byte in text.as_bytes() {
        if unreserved(byte) {
            out.push(char::from(byte));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(byte >> 4)]));
            out.push(char::from(HEX[usize::from(byte & 15)]));
        }
    }
}

/// The length of `text` once `url_component` has encoded it.
pub fn url_component_len(text: &str) -> usize {
    text.bytes().map(|byte| if unreserved(byte) { 1 } else { 3 }).sum()
}

#[inline]
fn unreserved(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~')
}

/// The character position of byte offset `pos` in `s` (what Python would index).
pub fn char_position(s: &str, pos: usize) -> usize {
    s[..pos].chars().count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(s: &str) -> String {
        let mut out = String::new();
        write_json_string(&mut out, s);
        out
    }

    #[test]
    fn json_strings_escape_quotes_backslashes_and_control_characters_only() {
        assert_eq!(json("plain é 😀"), "\"plain é 😀\"");
        assert_eq!(json("a\"b\\c"), "\"a\\\"b\\\\c\"");
        assert_eq!(json("\n\r\t\x08\x0c"), "\"\\n\\r\\t\\b\\f\"");
        assert_eq!(json("\x01\x1f\x7f\u{2028}"), "\"\\u0001\\u001f\x7f\u{2028}\"");
    }

    #[test]
    fn url_components_keep_only_the_unreserved_characters() {
        let mut out = String::new();
        url_component(&mut out, "a-Z_0.~ /?#@%é");
        assert_eq!(out, "a-Z_0.~%20%2F%3F%23%40%25%C3%A9");
        assert_eq!(url_component_len("a-Z_0.~ /?#@%é"), out.len());
    }

    #[test]
    fn character_positions_count_characters_not_bytes() {
        assert_eq!(char_position("é${", 2), 1);
    }
}
