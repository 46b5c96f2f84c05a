//! Text output that must match Python byte for byte: JSON string quoting (`json.dumps(s,
//! ensure_ascii=False)`) and float formatting (`float.__repr__`, as `json.dumps` writes it).

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

/// Append `x` as `json.dumps` writes a float: Python's `repr` (the shortest digits that read back as
/// `x`, positional for exponents from -5 to 15, `1e+16` style beyond) and `NaN`/`Infinity`.
pub fn write_float(out: &mut String, x: f64) {
    if x.is_nan() {
        out.push_str("NaN");
        return;
    }
    if x.is_infinite() {
        out.push_str(if x > 0.0 { "Infinity" } else { "-Infinity" });
        return;
    }
    if x.is_sign_negative() {
        out.push('-');
    }
    if x == 0.0 {
        out.push_str("0.0");
        return;
    }
    // Rust's `{:e}` writes the shortest round-trip digits, the same digits as Python's repr.
    let mut sci = String::with_capacity(32);
    let _ = write!(sci, "{:e}", x.abs());
    let (mantissa, exponent) = sci.split_once('e').expect("`{:e}` writes an exponent");
    let exponent: i32 = exponent.parse().expect("`{:e}` writes an integer exponent");
    let digits: String = mantissa.chars().filter(|&c| c != '.').collect();
    let ndigits = digits.len() as i32;
    // Python's decpt: the value is 0.DIGITS * 10**decpt.
    let decpt = exponent + 1;
    if -4 < decpt && decpt <= 16 {
        if decpt <= 0 {
            out.push_str("0.");
            out.extend(std::iter::repeat_n('0', (-decpt) as usize));
            out.push_str(&digits);
        } else if decpt >= ndigits {
            out.push_str(&digits);
            out.extend(std::iter::repeat_n('0', (decpt - ndigits) as usize));
            out.push_str(".0");
        } else {
            out.push_str(&digits[..decpt as usize]);
            out.push('.');
            out.push_str(&digits[decpt as usize..]);
        }
    } else {
        out.push_str(&digits[..1]);
        if ndigits > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(out, "e{}{:02}", if exponent < 0 { '-' } else { '+' }, exponent.abs());
    }
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

    fn float(x: f64) -> String {
        let mut out = String::new();
        write_float(&mut out, x);
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
    fn floats_read_like_python_repr() {
        let cases = [
            (1.5, "1.5"),
            (100.0, "100.0"),
            (-0.0, "-0.0"),
            (0.0, "0.0"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (1e-4, "0.0001"),
            (1e-5, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (123456789012345678.0, "1.2345678901234568e+17"),
            (1e22, "1e+22"),
            (5e-324, "5e-324"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (0.1 + 0.2, "0.30000000000000004"),
            (-2.5, "-2.5"),
            (f64::NAN, "NaN"),
            (f64::INFINITY, "Infinity"),
            (f64::NEG_INFINITY, "-Infinity"),
        ];
        for (x, expected) in cases {
            assert_eq!(float(x), expected, "{x:e}");
        }
    }

    #[test]
    fn character_positions_count_characters_not_bytes() {
        assert_eq!(char_position("é${", 2), 1);
    }
}
