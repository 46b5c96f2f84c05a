//! Template strings and `$ref` targets, parsed once (contract section 4).
//!
//! A string becomes a constant (no placeholder), a typed reference (exactly one placeholder and nothing
//! else) or a list of pieces to interpolate as text. All scanning happens here, at compile time.

use std::fmt::Write;

use crate::path::{is_identifier, parse_path, Literal, Path, PathSyntax, StepIds, WS};
use crate::text::{char_position, write_json_string};

/// One piece of an interpolated string.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    Literal(String),
    Reference(Path),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParsedString {
    /// No placeholder: the text, escapes applied.
    Constant(String),
    /// Exactly one placeholder: the referenced value keeps its type.
    Reference(Path),
    /// Placeholders mixed with text: each value is stringified.
    Text(Vec<Piece>),
}

struct Opener {
    open: &'static str,
    close: &'static str,
    /// `{{...}}` / `<<...>>`: the first word is a step id.
    step_form: bool,
    /// `${` and `{{` must start a placeholder; `$<` and `<<` are plain text unless one follows.
    strict: bool,
}

const OPENERS: [Opener; 4] = [
    Opener { open: "${", close: "}", step_form: false, strict: true },
    Opener { open: "{{", close: "}}", step_form: true, strict: true },
    Opener { open: "$<", close: ">", step_form: false, strict: false },
    Opener { open: "<<", close: ">>", step_form: true, strict: false },
];

fn opener_at(bytes: &[u8], i: usize) -> Option<&'static Opener> {
    OPENERS.iter().find(|o| bytes[i..].starts_with(o.open.as_bytes()))
}

/// Whether `s` contains an opener (and so may hold a placeholder or an escape).
pub fn has_opener(s: &str) -> bool {
    OPENERS.iter().any(|o| s.contains(o.open))
}

fn skip_ws(bytes: &[u8], mut i: usize) -> usize {
    while i < bytes.len() && WS.contains(&bytes[i]) {
        i += 1;
    }
    i
}

/// Parse a template string. The error is the reason (the caller knows the location).
pub fn parse_string(s: &str, ids: &StepIds) -> Result<ParsedString, String> {
    let bytes = s.as_bytes();
    let n = bytes.len();
    let mut pieces: Vec<Piece> = Vec::new();
    let mut buf = String::new();
    let mut run = 0; // start of the text not yet copied to `buf`
    let mut i = 0;
    while i < n {
        let b = bytes[i];
        if b == b'\\' && i + 1 < n {
            if let Some(opener) = opener_at(bytes, i + 1) {
                buf.push_str(&s[run..i]);
                buf.push_str(opener.open);
                i += 1 + opener.open.len();
                run = i;
                continue;
            }
        }
        if b != b'$' && b != b'{' && b != b'<' {
            i += 1;
            continue;
        }
        let Some(opener) = opener_at(bytes, i) else {
            i += 1;
            continue;
        };
        match parse_placeholder(s, i, opener, ids) {
            Ok((path, end)) => {
                buf.push_str(&s[run..i]);
                if !buf.is_empty() {
                    pieces.push(Piece::Literal(std::mem::take(&mut buf)));
                }
                pieces.push(Piece::Reference(path));
                i = end;
                run = i;
            }
            Err(_) if !opener.strict => i += opener.open.len(),
            Err(err) => return Err(placeholder_error(s, i, opener, &err)),
        }
    }
    buf.push_str(&s[run..]);
    if !buf.is_empty() {
        pieces.push(Piece::Literal(buf));
    }
    Ok(match pieces.len() {
        0 => ParsedString::Constant(String::new()),
        1 => match pieces.pop() {
            Some(Piece::Reference(path)) => ParsedString::Reference(path),
            Some(Piece::Literal(text)) => ParsedString::Constant(text),
            None => unreachable!(),
        },
        _ => ParsedString::Text(pieces),
    })
}

fn parse_placeholder(s: &str, i: usize, opener: &Opener, ids: &StepIds) -> Result<(Path, usize), PathSyntax> {
    let bytes = s.as_bytes();
    let j = skip_ws(bytes, i + opener.open.len());
    let (mut path, j) = parse_path(s, j, opener.step_form, ids)?;
    let mut j = skip_ws(bytes, j);
    if bytes[j..].starts_with(b"??") {
        let (default, k) = parse_literal(s, skip_ws(bytes, j + 2))?;
        path.default = Some(default);
        j = skip_ws(bytes, k);
    }
    if !bytes[j..].starts_with(opener.close.as_bytes()) {
        return Err(PathSyntax { reason: format!("expected `{}`", opener.close), pos: j });
    }
    Ok((path, j + opener.close.len()))
}

/// Parse the default after `??`: a JSON string (or one in single quotes), number, `true`, `false` or
/// `null`. Answers the literal and the offset after it.
pub fn parse_literal(s: &str, i: usize) -> Result<(Literal, usize), PathSyntax> {
    let bytes = s.as_bytes();
    let expected = || PathSyntax {
        reason: "expected a default after `??` (a string, a number, true, false or null)".to_owned(),
        pos: i,
    };
    let Some(&first) = bytes.get(i) else { return Err(expected()) };
    if first == b'"' || first == b'\'' {
        return parse_quoted(s, i).ok_or_else(expected);
    }
    for (word, literal) in [("null", Literal::Null), ("true", Literal::Bool(true)), ("false", Literal::Bool(false))] {
        let end = i + word.len();
        if bytes[i..].starts_with(word.as_bytes()) && !bytes.get(end).is_some_and(|b| b.is_ascii_alphanumeric()) {
            return Ok((literal, end));
        }
    }
    // A JSON number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
    let mut j = i;
    let digits = |j: &mut usize| {
        let start = *j;
        while bytes.get(*j).is_some_and(u8::is_ascii_digit) {
            *j += 1;
        }
        *j > start
    };
    if bytes.get(j) == Some(&b'-') {
        j += 1;
    }
    if bytes.get(j) == Some(&b'0') {
        j += 1; // JSON: no leading zeros, so `01` is the number 0 and then a `1`
    } else if !digits(&mut j) {
        return Err(expected());
    }
    // The fraction and the exponent are optional: when one is incomplete, the number ends before it.
    if bytes.get(j) == Some(&b'.') {
        let mut k = j + 1;
        if digits(&mut k) {
            j = k;
        }
    }
    if matches!(bytes.get(j), Some(b'e' | b'E')) {
        let mut k = j + 1;
        if matches!(bytes.get(k), Some(b'+' | b'-')) {
            k += 1;
        }
        if digits(&mut k) {
            j = k;
        }
    }
    Ok((Literal::Number(s[i..j].to_owned()), j))
}

/// A quoted default: JSON's escapes in double quotes (a lone surrogate is not text); in single quotes
/// `\'` and `\\` only. None when it is not closed or holds another escape.
fn parse_quoted(s: &str, i: usize) -> Option<(Literal, usize)> {
    let quote = s.as_bytes()[i] as char;
    let mut out = String::new();
    let mut chars = s[i + 1..].char_indices();
    while let Some((k, c)) = chars.next() {
        if c == quote {
            return Some((Literal::String(out), i + 1 + k + 1));
        }
        if c != '\\' {
            out.push(c);
            continue;
        }
        let (_, e) = chars.next()?;
        if quote == '\'' {
            match e {
                '\'' | '\\' => out.push(e),
                _ => return None,
            }
            continue;
        }
        match e {
            '"' | '\\' | '/' => out.push(e),
            'b' => out.push('\u{8}'),
            'f' => out.push('\u{c}'),
            'n' => out.push('\n'),
            'r' => out.push('\r'),
            't' => out.push('\t'),
            'u' => {
                let hi = hex_unit(&mut chars)?;
                let code = if (0xD800..0xDC00).contains(&hi) {
                    let (Some((_, '\\')), Some((_, 'u'))) = (chars.next(), chars.next()) else { return None };
                    match hex_unit(&mut chars) {
                        Some(lo) if (0xDC00..0xE000).contains(&lo) => 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00),
                        _ => return None,
                    }
                } else {
                    hi
                };
                out.push(char::from_u32(code)?);
            }
            _ => return None,
        }
    }
    None
}

fn hex_unit(chars: &mut std::str::CharIndices<'_>) -> Option<u32> {
    let hex: String = (0..4).filter_map(|_| chars.next().map(|(_, h)| h)).collect();
    if hex.len() == 4 {
        u32::from_str_radix(&hex, 16).ok()
    } else {
        None
    }
}

#[cold]
fn placeholder_error(s: &str, i: usize, opener: &Opener, err: &PathSyntax) -> String {
    let at = char_position(s, i);
    if !s[i + opener.open.len()..].contains(opener.close) {
        format!("`{}` has no closing `{}` (character {at})", opener.open, opener.close)
    } else {
        let pos = char_position(s, err.pos);
        format!("invalid placeholder at character {at}: {} (character {pos})", err.reason)
    }
}

/// Parse the target of `{"$ref": target}`: one reference, whitespace around it allowed.
pub fn parse_ref(target: &str, ids: &StepIds) -> Result<Path, String> {
    let text = target.trim_matches(|c: char| c.is_ascii() && WS.contains(&(c as u8)));
    let parsed = parse_path(text, 0, false, ids).and_then(|(path, end)| match text[end..].chars().next() {
        None => Ok(path),
        Some(c) => Err(PathSyntax { reason: format!("unexpected `{c}`"), pos: end }),
    });
    parsed.map_err(|err| {
        let mut reason = String::from("invalid `$ref` path ");
        write_json_string(&mut reason, target);
        let _ = write!(reason, ": {}", err.reason);
        reason
    })
}

/// The location of an object member: `base.key` for identifier keys, else `base["key"]`.
pub fn key_location(base: &str, key: &str) -> String {
    let mut out = String::with_capacity(base.len() + key.len() + 4);
    out.push_str(base);
    if is_identifier(key) {
        if !base.is_empty() {
            out.push('.');
        }
        out.push_str(key);
    } else {
        out.push('[');
        write_json_string(&mut out, key);
        out.push(']');
    }
    out
}

/// The location of an array element, or of a non-string key: `base[index]`.
pub fn index_location(base: &str, index: impl std::fmt::Display) -> String {
    format!("{base}[{index}]")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids() -> StepIds {
        StepIds::from_sequence(["search", "fetch"])
    }

    fn parse(s: &str) -> Result<ParsedString, String> {
        parse_string(s, &ids())
    }

    fn reference(s: &str) -> Piece {
        let ParsedString::Reference(path) = parse(&format!("${{{s}}}")).unwrap() else { panic!("{s}") };
        Piece::Reference(path)
    }

    fn lit(s: &str) -> Piece {
        Piece::Literal(s.to_owned())
    }

    fn normalized(s: &str) -> String {
        match parse(s).unwrap() {
            ParsedString::Reference(path) => path.normalized(),
            other => panic!("{s}: {other:?}"),
        }
    }

    #[test]
    fn a_string_that_is_exactly_one_placeholder_is_a_typed_reference() {
        assert_eq!(normalized("${vars.n}"), "vars.n");
        assert_eq!(normalized("${  vars.n\t}"), "vars.n");
        assert_eq!(normalized("{{step1.results[0]}}"), "steps.search.output.results.0");
        assert_eq!(normalized("{{ fetch }}"), "steps.fetch.output");
        assert_eq!(normalized("$<vars.n>"), "vars.n");
        assert_eq!(normalized("<<step2.url>>"), "steps.fetch.output.url");
    }

    #[test]
    fn text_around_placeholders_makes_an_interpolated_string() {
        assert_eq!(
            parse("a ${vars.x} b{{step1}}").unwrap(),
            ParsedString::Text(vec![lit("a "), reference("vars.x"), lit(" b"), reference("steps.search.output")])
        );
        assert_eq!(
            parse("${vars.x}${vars.y}").unwrap(),
            ParsedString::Text(vec![reference("vars.x"), reference("vars.y")])
        );
    }

    #[test]
    fn strings_without_placeholders_are_constants_with_escapes_applied() {
        let constant = |s: &str| ParsedString::Constant(s.to_owned());
        assert_eq!(parse("").unwrap(), constant(""));
        assert_eq!(parse("plain é").unwrap(), constant("plain é"));
        assert_eq!(parse("\\${vars.x}").unwrap(), constant("${vars.x}"));
        assert_eq!(parse("\\{{ \\$< \\<<").unwrap(), constant("{{ $< <<"));
        assert_eq!(parse("a\\b \\").unwrap(), constant("a\\b \\"));
        assert_eq!(parse("a << b, x <<EOF, $<5>").unwrap(), constant("a << b, x <<EOF, $<5>"));
        assert_eq!(parse("<<<vars.x>>").unwrap(), constant("<<<vars.x>>"));
        assert_eq!(parse("$ { } {").unwrap(), constant("$ { } {"));
    }

    #[test]
    fn alternative_openers_start_a_placeholder_only_when_a_reference_and_closer_follow() {
        assert_eq!(
            parse("x <<EOF>> y").unwrap(),
            ParsedString::Text(vec![lit("x "), reference("steps.EOF.output"), lit(" y")])
        );
        assert_eq!(parse("$<$<vars.a>").unwrap(), ParsedString::Text(vec![lit("$<"), reference("vars.a")]));
    }

    #[test]
    fn broken_strict_placeholders_are_errors_with_character_positions() {
        assert_eq!(parse("ab ${vars.x").unwrap_err(), "`${` has no closing `}` (character 3)");
        assert_eq!(parse("é{{step1").unwrap_err(), "`{{` has no closing `}}` (character 1)");
        assert_eq!(
            parse("${nope} }").unwrap_err(),
            "invalid placeholder at character 0: unknown root `nope` (expected one of vars, steps, last, args, \
             context) (character 2)"
        );
        assert_eq!(
            parse("é${vars.}").unwrap_err(),
            "invalid placeholder at character 1: empty path segment (character 8)"
        );
        assert_eq!(parse("${vars.a b}").unwrap_err(), "invalid placeholder at character 0: expected `}` (character 9)");
        assert_eq!(
            parse("{{1x}}").unwrap_err(),
            "invalid placeholder at character 0: `1x` is not a step id (character 2)"
        );
        assert_eq!(parse("${}").unwrap_err(), "invalid placeholder at character 0: expected a reference (character 2)");
    }

    #[test]
    fn ref_targets_are_one_whole_reference() {
        assert_eq!(parse_ref(" steps.a[0] ", &ids()).unwrap().normalized(), "steps.a.0");
        assert_eq!(parse_ref("vars.a b", &ids()).unwrap_err(), "invalid `$ref` path \"vars.a b\": unexpected ` `");
        assert_eq!(
            parse_ref("step1", &ids()).unwrap_err(),
            "invalid `$ref` path \"step1\": unknown root `step1` (expected one of vars, steps, last, args, context)"
        );
        assert_eq!(parse_ref("vars.é}", &ids()).unwrap_err(), "invalid `$ref` path \"vars.é}\": unexpected `}`");
    }

    #[test]
    fn locations_use_dots_for_identifiers_and_brackets_otherwise() {
        assert_eq!(key_location("", "a"), "a");
        assert_eq!(key_location("args", "url"), "args.url");
        assert_eq!(key_location("args", "a b"), "args[\"a b\"]");
        assert_eq!(key_location("", "0"), "[\"0\"]");
        assert_eq!(index_location("args.items", 2), "args.items[2]");
    }

    #[test]
    fn a_default_after_question_marks_is_parsed_once_with_its_reference() {
        let default = |s: &str| match parse(s).unwrap() {
            ParsedString::Reference(path) => path.default,
            other => panic!("{s}: {other:?}"),
        };
        assert_eq!(default("${vars.a ?? 'it\\'s'}"), Some(Literal::String("it's".to_owned())));
        assert_eq!(default("${vars.a ?? \"x}\\u00e9\"}"), Some(Literal::String("x}é".to_owned())));
        assert_eq!(default("${vars.a??1}"), None); // `?` is a key character: the key is `a??1`
        assert_eq!(default("{{step1.x ?? -1.5e3}}"), Some(Literal::Number("-1.5e3".to_owned())));
        assert_eq!(default("${vars.a ?? null }"), Some(Literal::Null));
        assert_eq!(default("${vars.a ?? false}"), Some(Literal::Bool(false)));
        assert_eq!(default("${vars.a}"), None);
        let expected = "invalid placeholder at character 0: expected a default after `??` (a string, a number, \
                        true, false or null) (character 12)";
        assert_eq!(parse("${vars.a ?? nope}").unwrap_err(), expected);
        assert_eq!(parse("${vars.a ?? \"\\ud800\"}").unwrap_err(), expected);
        assert_eq!(
            parse("${vars.a ?? 1.}").unwrap_err(),
            "invalid placeholder at character 0: expected `}` (character 13)"
        );
        assert_eq!(parse("a $<vars.a ?? nope> b").unwrap(), ParsedString::Constant("a $<vars.a ?? nope> b".to_owned()));
    }

    #[test]
    fn a_for_each_alias_reads_as_the_item_root_and_only_where_it_is_given() {
        let mut ids = ids();
        ids.item_alias = Some("page".to_owned());
        let ParsedString::Reference(path) = parse_string("${page.url}", &ids).unwrap() else { panic!() };
        assert_eq!(path.normalized(), "item.url");
        assert!(parse("${page.url}").unwrap_err().contains("unknown root `page`"));
        assert_eq!(normalized("${index}"), "index");
    }

    #[test]
    fn opener_detection_covers_every_opener() {
        assert!(has_opener("a ${"));
        assert!(has_opener("<<"));
        assert!(!has_opener("$ { < "));
    }
}
