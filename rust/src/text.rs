//! Text output that must match Python byte for byte: JSON string quoting (`json.dumps(s,
//! ensure_ascii=False)`). Floats are written by Python's own `float.__repr__` (see `resolve`): Rust's
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
    fn character_positions_count_characters_not_bytes() {
        assert_eq!(char_position("é${", 2), 1);
    }
}
