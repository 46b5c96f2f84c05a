//! References: `root(.segment | [index] | ["quoted key"])*`, parsed once into segments.
//!
//! Positions are byte offsets into the text being parsed; every syntax character is ASCII, so a byte
//! scan never splits a character. Messages convert offsets to character positions (what users count).

use std::collections::HashMap;
use std::fmt::Write;

use crate::text::write_json_string;

/// The roots a reference can start from (contract section 3), in the order messages list them.
pub const ROOTS: [&str; 5] = ["vars", "steps", "last", "args", "context"];

/// Whitespace allowed around a reference inside the brackets (Python's `" \t\n\r\f\v"`).
pub const WS: &[u8] = b" \t\n\r\x0c\x0b";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Root {
    Vars,
    Steps,
    Last,
    Args,
    Context,
}

impl Root {
    pub fn from_name(name: &str) -> Option<Root> {
        Some(match name {
            "vars" => Root::Vars,
            "steps" => Root::Steps,
            "last" => Root::Last,
            "args" => Root::Args,
            "context" => Root::Context,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        ROOTS[self as usize]
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegmentKind {
    /// `.word`: a key, or an index when the word is an integer and the value an array.
    Plain,
    /// `["key"]` / `['key']`: always a key.
    Quoted,
    /// `[12]`: an index on arrays, a key on objects.
    Index,
    /// `.*` / `[*]`: maps the rest of the path over every element.
    Star,
}

/// What an index-like segment means on an array.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ArrayIndex {
    /// Not an integer (or a quoted key): never applies to an array.
    NotIndex,
    /// An integer; negative counts from the end.
    At(i64),
    /// An integer too large for any array.
    Beyond,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    pub kind: SegmentKind,
    pub text: String,
}

impl Segment {
    pub fn plain(text: &str) -> Segment {
        let kind = if text == "*" { SegmentKind::Star } else { SegmentKind::Plain };
        Segment { kind, text: text.to_owned() }
    }

    pub fn array_index(&self) -> ArrayIndex {
        match self.kind {
            SegmentKind::Plain | SegmentKind::Index if is_index(&self.text) => {
                self.text.parse::<i64>().map_or(ArrayIndex::Beyond, ArrayIndex::At)
            }
            _ => ArrayIndex::NotIndex,
        }
    }

    /// The segment as it reads back in a normalized reference, with its leading `.` (or `[...]`).
    pub fn write_normalized(&self, out: &mut String) {
        match self.kind {
            SegmentKind::Star => out.push_str(".*"),
            SegmentKind::Plain | SegmentKind::Index => {
                out.push('.');
                out.push_str(&self.text);
            }
            SegmentKind::Quoted => {
                // A quoted key prints plain when that reads back as the same key.
                if reads_plain(&self.text) {
                    out.push('.');
                    out.push_str(&self.text);
                } else {
                    out.push('[');
                    write_json_string(out, &self.text);
                    out.push(']');
                }
            }
        }
    }

    /// The segment as error messages name it: normalized, without a leading `.`.
    pub fn shown(&self) -> String {
        let mut out = String::with_capacity(self.text.len() + 4);
        self.write_normalized(&mut out);
        if out.starts_with('.') {
            out.remove(0);
        }
        out
    }
}

/// A parsed reference. References written `{{id.rest}}` are already rewritten to `steps.id.output.rest`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Path {
    pub root: Root,
    pub segments: Vec<Segment>,
}

impl Path {
    pub fn normalized(&self) -> String {
        let mut out = String::from(self.root.name());
        for segment in &self.segments {
            segment.write_normalized(&mut out);
        }
        out
    }
}

/// A syntax error inside a reference: what is wrong and the byte offset where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathSyntax {
    pub reason: String,
    pub pos: usize,
}

impl PathSyntax {
    fn new(reason: impl Into<String>, pos: usize) -> PathSyntax {
        PathSyntax { reason: reason.into(), pos }
    }
}

/// Which id `{{stepN}}` stands for, by N written in decimal (N has no leading zeros, so the text is
/// canonical and N may exceed any integer type).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepIds {
    by_position: HashMap<String, String>,
    /// The length of the list when the ids came as one (not a mapping): a position past it is an error.
    count: Option<usize>,
}

impl StepIds {
    /// Ids by position, the first one being step 1.
    pub fn from_sequence<S: Into<String>>(ids: impl IntoIterator<Item = S>) -> StepIds {
        let by_position: HashMap<String, String> =
            ids.into_iter().enumerate().map(|(i, id)| ((i + 1).to_string(), id.into())).collect();
        let count = Some(by_position.len()).filter(|&n| n > 0);
        StepIds { by_position, count }
    }

    /// Ids were read from a list of `count` steps: `{{stepN}}` past its end is refused.
    pub fn set_count(&mut self, count: usize) {
        self.count = Some(count).filter(|&n| n > 0);
    }

    /// Record that step `n` (decimal text of an integer) has id `id`.
    pub fn insert(&mut self, n: String, id: String) {
        self.by_position.insert(n, id);
    }

    fn resolve<'a>(&'a self, head: &'a str) -> Result<&'a str, String> {
        match head.strip_prefix("step") {
            Some(n) if !n.is_empty() && !n.starts_with('0') && n.bytes().all(|b| b.is_ascii_digit()) => {
                match (self.by_position.get(n), self.count) {
                    (Some(id), _) => Ok(id),
                    (None, Some(count)) if !self.by_position.values().any(|id| id == head) => {
                        Err(past_the_end(n, count))
                    }
                    (None, _) => Ok(head),
                }
            }
            _ => Ok(head),
        }
    }
}

#[cold]
fn past_the_end(n: &str, count: usize) -> String {
    let plural = if count == 1 { "" } else { "s" };
    format!("`step{n}` is past the end of the step list (step {n} of {count} step{plural})")
}

/// Whether `b` can be part of a plain (unquoted) segment: anything but dots, brackets, braces, angles,
/// `$`, `\`, quotes and ASCII whitespace. Bytes of non-ASCII characters always can.
#[inline]
pub fn is_plain_byte(b: u8) -> bool {
    !matches!(
        b,
        b'.' | b'['
            | b']'
            | b'{'
            | b'}'
            | b'<'
            | b'>'
            | b'$'
            | b'\\'
            | b'"'
            | b'\''
            | b' '
            | b'\t'
            | b'\n'
            | b'\r'
            | b'\x0c'
            | b'\x0b'
    )
}

fn plain_end(bytes: &[u8], pos: usize) -> usize {
    pos + bytes[pos..].iter().take_while(|&&b| is_plain_byte(b)).count()
}

/// `-?[0-9]+`
pub fn is_index(text: &str) -> bool {
    let digits = text.strip_prefix('-').unwrap_or(text);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

/// `[A-Za-z_][A-Za-z0-9_-]*`: step ids, and keys that locations print after a dot.
pub fn is_identifier(text: &str) -> bool {
    let mut bytes = text.bytes();
    matches!(bytes.next(), Some(b'A'..=b'Z' | b'a'..=b'z' | b'_'))
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Whether a key written as a plain segment reads back as the same key.
fn reads_plain(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(is_plain_byte) && text != "*" && !is_index(text)
}

/// Parse `(.segment | [index] | ["key"])*` from `text[pos..]`; return the segments and where they end.
pub fn parse_segments(text: &str, mut pos: usize) -> Result<(Vec<Segment>, usize), PathSyntax> {
    let bytes = text.as_bytes();
    let n = bytes.len();
    let mut segments = Vec::new();
    while pos < n {
        match bytes[pos] {
            b'.' => {
                let end = plain_end(bytes, pos + 1);
                if end == pos + 1 {
                    return Err(PathSyntax::new("empty path segment", pos + 1));
                }
                segments.push(Segment::plain(&text[pos + 1..end]));
                pos = end;
            }
            b'[' => {
                pos += 1;
                let segment = if pos < n && (bytes[pos] == b'"' || bytes[pos] == b'\'') {
                    let quote = bytes[pos];
                    pos += 1;
                    let mut key = String::new();
                    let mut run = pos;
                    loop {
                        if pos >= n {
                            return Err(PathSyntax::new("unterminated quoted key", pos));
                        }
                        let b = bytes[pos];
                        if b == b'\\' && pos + 1 < n && (bytes[pos + 1] == quote || bytes[pos + 1] == b'\\') {
                            key.push_str(&text[run..pos]);
                            key.push(bytes[pos + 1] as char);
                            pos += 2;
                            run = pos;
                        } else if b == quote {
                            key.push_str(&text[run..pos]);
                            pos += 1;
                            break;
                        } else {
                            pos += 1;
                        }
                    }
                    Segment { kind: SegmentKind::Quoted, text: key }
                } else if pos < n && bytes[pos] == b'*' {
                    pos += 1;
                    Segment { kind: SegmentKind::Star, text: "*".to_owned() }
                } else {
                    let start = pos;
                    if pos < n && bytes[pos] == b'-' {
                        pos += 1;
                    }
                    let digits = bytes[pos..].iter().take_while(|b| b.is_ascii_digit()).count();
                    if digits == 0 {
                        return Err(PathSyntax::new("expected an index, `*` or a quoted key after `[`", start));
                    }
                    pos += digits;
                    Segment { kind: SegmentKind::Index, text: text[start..pos].to_owned() }
                };
                if pos >= n || bytes[pos] != b']' {
                    return Err(PathSyntax::new("expected `]`", pos));
                }
                pos += 1;
                segments.push(segment);
            }
            _ => break,
        }
    }
    Ok((segments, pos))
}

/// Parse a reference starting at `pos`. With `step_form` (the `{{...}}` brackets) the first word is a
/// step id and the path is rewritten to `steps.<id>.output...`.
pub fn parse_path(text: &str, pos: usize, step_form: bool, ids: &StepIds) -> Result<(Path, usize), PathSyntax> {
    let end = plain_end(text.as_bytes(), pos);
    if end == pos {
        return Err(PathSyntax::new("expected a reference", pos));
    }
    let head = &text[pos..end];
    if step_form {
        if !is_identifier(head) {
            return Err(PathSyntax::new(format!("`{head}` is not a step id"), pos));
        }
        let (rest, end) = parse_segments(text, end)?;
        let mut segments = Vec::with_capacity(rest.len() + 2);
        let id = ids.resolve(head).map_err(|reason| PathSyntax::new(reason, pos))?;
        segments.push(Segment { kind: SegmentKind::Plain, text: id.to_owned() });
        segments.push(Segment { kind: SegmentKind::Plain, text: "output".to_owned() });
        segments.extend(rest);
        return Ok((Path { root: Root::Steps, segments }, end));
    }
    let Some(root) = Root::from_name(head) else {
        let mut reason = format!("unknown root `{head}` (expected one of ");
        let _ = write!(reason, "{})", ROOTS.join(", "));
        return Err(PathSyntax::new(reason, pos));
    };
    let (segments, end) = parse_segments(text, end)?;
    Ok((Path { root, segments }, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<(Path, usize), PathSyntax> {
        parse_path(text, 0, false, &StepIds::default())
    }

    fn normalized(text: &str) -> String {
        let (path, end) = parse(text).unwrap();
        assert_eq!(end, text.len(), "{text}");
        path.normalized()
    }

    #[test]
    fn dotted_words_brackets_and_quotes_normalize_to_one_spelling() {
        assert_eq!(normalized("vars.a.b"), "vars.a.b");
        assert_eq!(normalized("steps.s[0].x[-1]"), "steps.s.0.x.-1");
        assert_eq!(normalized("vars[\"a b\"]"), "vars[\"a b\"]");
        assert_eq!(normalized("vars['plain']"), "vars.plain");
        assert_eq!(normalized("vars['0']"), "vars[\"0\"]");
        assert_eq!(normalized("vars['*']"), "vars[\"*\"]");
        assert_eq!(normalized("vars['']"), "vars[\"\"]");
        assert_eq!(normalized("vars['it\\'s']"), "vars[\"it's\"]");
        assert_eq!(normalized("vars[\"q\\\"\\\\\"]"), "vars[\"q\\\"\\\\\"]");
        assert_eq!(normalized("vars.*.x[*]"), "vars.*.x.*");
        assert_eq!(normalized("vars.*x"), "vars.*x");
        assert_eq!(normalized("vars.é"), "vars.é");
    }

    #[test]
    fn a_path_ends_at_the_first_character_that_cannot_continue_it() {
        let (path, end) = parse("vars.a}rest").unwrap();
        assert_eq!((path.normalized(), end), ("vars.a".to_owned(), 6));
        let (_, end) = parse("last x").unwrap();
        assert_eq!(end, 4);
    }

    #[test]
    fn malformed_paths_say_what_is_wrong_and_where() {
        let err = |t: &str| parse(t).unwrap_err();
        assert_eq!(err("vars."), PathSyntax::new("empty path segment", 5));
        assert_eq!(err("vars['a"), PathSyntax::new("unterminated quoted key", 7));
        assert_eq!(err("vars[x]"), PathSyntax::new("expected an index, `*` or a quoted key after `[`", 5));
        assert_eq!(err("vars[1"), PathSyntax::new("expected `]`", 6));
        assert_eq!(err("vars[*x]"), PathSyntax::new("expected `]`", 6));
        assert_eq!(err(""), PathSyntax::new("expected a reference", 0));
        assert_eq!(
            err("nope.x"),
            PathSyntax::new("unknown root `nope` (expected one of vars, steps, last, args, context)", 0)
        );
    }

    #[test]
    fn step_form_rewrites_to_the_step_output_and_maps_positions_to_ids() {
        let ids = StepIds::from_sequence(["search", "fetch"]);
        let parse = |t: &str| parse_path(t, 0, true, &ids).map(|(p, _)| p.normalized());
        assert_eq!(parse("step2.a"), Ok("steps.fetch.output.a".to_owned()));
        let past = "`step3` is past the end of the step list (step 3 of 2 steps)";
        assert_eq!(parse("step3").unwrap_err(), PathSyntax::new(past, 0));
        let named = StepIds::from_sequence(["step3"]);
        assert_eq!(
            parse_path("step3", 0, true, &named).map(|(p, _)| p.normalized()),
            Ok("steps.step3.output".to_owned())
        );
        assert_eq!(parse("step02"), Ok("steps.step02.output".to_owned()));
        assert_eq!(parse("search[0]"), Ok("steps.search.output.0".to_owned()));
        assert_eq!(parse("9x").unwrap_err(), PathSyntax::new("`9x` is not a step id", 0));
    }

    #[test]
    fn integer_segments_index_arrays_and_huge_ones_are_out_of_range() {
        let seg = |kind, text: &str| Segment { kind, text: text.to_owned() };
        assert_eq!(seg(SegmentKind::Plain, "-2").array_index(), ArrayIndex::At(-2));
        assert_eq!(seg(SegmentKind::Index, "007").array_index(), ArrayIndex::At(7));
        assert_eq!(seg(SegmentKind::Plain, "99999999999999999999999").array_index(), ArrayIndex::Beyond);
        assert_eq!(seg(SegmentKind::Quoted, "1").array_index(), ArrayIndex::NotIndex);
        assert_eq!(seg(SegmentKind::Plain, "1a").array_index(), ArrayIndex::NotIndex);
        assert_eq!(seg(SegmentKind::Plain, "-").array_index(), ArrayIndex::NotIndex);
    }

    #[test]
    fn shown_segments_drop_the_leading_dot() {
        assert_eq!(Segment::plain("a").shown(), "a");
        assert_eq!(Segment::plain("*").shown(), "*");
        assert_eq!(Segment { kind: SegmentKind::Quoted, text: "a.b".into() }.shown(), "[\"a.b\"]");
    }
}
