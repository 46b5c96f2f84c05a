//! A JSON-RPC answer's `result.tools` array cut to its first `max` elements while the bytes stream past
//! (issue 27: a downstream listing 100 000 tools was read and validated whole before mcpipe kept 1000).
//!
//! `ArrayCap` is a tokenizer over a byte stream fed in chunks of any size: strings (with their escapes),
//! nesting, and object keys, no values built. Every byte is copied to the output except the elements of the
//! target array past the `max`-th (with the commas before them); the array's `]` is kept, so the output is
//! the same JSON with a shorter array. It also counts the array's elements, kept or not (`total`). Bytes
//! outside the top-level object (an SSE stream's `event:` and `data:` framing around a compact message)
//! pass as they are. Another message (no `result.tools` array) passes unchanged.

/// Where a container sits, as far as the cut cares.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    /// The top-level object of the message.
    Top,
    /// The value of `result` in the top-level object.
    Result,
    /// The value of `tools` in `result`: the array cut.
    Target,
    Other,
}

#[derive(Clone, Copy)]
struct Frame {
    role: Role,
    object: bool,
    /// In an object: the next string is a key.
    expect_key: bool,
    /// In an object: what the last key names (`result` or `tools`), for the value after it.
    key: Key,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Key {
    Result,
    Tools,
    Other,
}

/// The longest key compared (`result`); longer keys are `Other` without being kept.
const KEY_BYTES: usize = 8;

pub struct ArrayCap {
    max: usize,
    stack: Vec<Frame>,
    in_string: bool,
    escape: bool,
    /// The string being read is a key: its first bytes.
    key_string: bool,
    key: [u8; KEY_BYTES],
    key_len: usize,
    key_long: bool,
    /// In the target array: an element has begun since its `[` or last `,`.
    element_open: bool,
    /// Elements of the target array begun so far.
    total: usize,
    /// The bytes of elements past `max` are being dropped.
    dropping: bool,
}

impl ArrayCap {
    pub fn new(max: usize) -> Self {
        ArrayCap {
            max,
            stack: Vec::new(),
            in_string: false,
            escape: false,
            key_string: false,
            key: [0; KEY_BYTES],
            key_len: 0,
            key_long: false,
            element_open: false,
            total: 0,
            dropping: false,
        }
    }

    /// How many elements the target array had, kept or not (so far).
    pub fn total(&self) -> usize {
        self.total
    }

    fn in_target(&self) -> bool {
        matches!(self.stack.last(), Some(f) if f.role == Role::Target)
    }

    /// A value begins at the current level (a byte that is not whitespace, `,`, `:` or a closing bracket).
    fn value_begins(&mut self) {
        if self.in_target() && !self.element_open {
            self.element_open = true;
            self.total += 1;
            if self.total > self.max {
                self.dropping = true; // the first element past the cut (with `max` 0, the first of all)
            }
        }
    }

    fn role_of_child(&self, object: bool) -> Role {
        match self.stack.last() {
            None if object => Role::Top,
            None => Role::Other,
            Some(f) => match (f.role, f.key, object) {
                (Role::Top, Key::Result, true) => Role::Result,
                (Role::Result, Key::Tools, false) => Role::Target,
                _ => Role::Other,
            },
        }
    }

    /// Copy `input` to `out`, less the dropped elements.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) {
        out.reserve(input.len());
        for &b in input {
            if self.in_string {
                if !self.dropping {
                    out.push(b);
                }
                if self.escape {
                    self.escape = false;
                } else if b == b'\\' {
                    self.escape = true;
                } else if b == b'"' {
                    self.in_string = false;
                    if self.key_string {
                        self.key_string = false;
                        let key = &self.key[..self.key_len];
                        let named = match (self.key_long, key) {
                            (false, b"result") => Key::Result,
                            (false, b"tools") => Key::Tools,
                            _ => Key::Other,
                        };
                        if let Some(f) = self.stack.last_mut() {
                            f.key = named;
                            f.expect_key = false;
                        }
                    }
                } else if self.key_string {
                    if self.key_len < KEY_BYTES {
                        self.key[self.key_len] = b;
                        self.key_len += 1;
                    } else {
                        self.key_long = true;
                    }
                }
                continue;
            }
            match b {
                b' ' | b'\t' | b'\n' | b'\r' | b':' => {}
                b',' => {
                    if self.in_target() {
                        self.element_open = false;
                        if self.total >= self.max {
                            self.dropping = true; // this comma and the elements after it
                        }
                    }
                    if let Some(f) = self.stack.last_mut() {
                        if f.object {
                            f.expect_key = true;
                        }
                    }
                }
                b'"' => {
                    let is_key = matches!(self.stack.last(), Some(f) if f.object && f.expect_key);
                    if !is_key {
                        self.value_begins();
                    }
                    self.in_string = true;
                    self.key_string = is_key;
                    self.key_len = 0;
                    self.key_long = false;
                }
                b'{' | b'[' => {
                    self.value_begins();
                    let object = b == b'{';
                    let role = self.role_of_child(object);
                    if role == Role::Target {
                        self.element_open = false;
                    }
                    self.stack.push(Frame { role, object, expect_key: object, key: Key::Other });
                }
                b'}' | b']' => {
                    if let Some(f) = self.stack.pop() {
                        if f.role == Role::Target {
                            self.dropping = false; // the closing bracket is kept
                        }
                    }
                }
                _ => self.value_begins(),
            }
            if !self.dropping {
                out.push(b);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cap(text: &str, max: usize, chunk: usize) -> (String, usize) {
        let mut c = ArrayCap::new(max);
        let mut out = Vec::new();
        for piece in text.as_bytes().chunks(chunk) {
            c.feed(piece, &mut out);
        }
        (String::from_utf8(out).unwrap(), c.total())
    }

    #[test]
    fn the_tools_of_a_listing_are_cut_to_the_first_max_whatever_the_chunks() {
        let text = r#"{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"a","x":[1,{"y":"],"}]},{"name":"b"},"c\"",3],"nextCursor":"n"}}"#;
        for chunk in [1, 2, 7, 1000] {
            let (out, total) = cap(text, 2, chunk);
            assert_eq!(
                out,
                r#"{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"a","x":[1,{"y":"],"}]},{"name":"b"}],"nextCursor":"n"}}"#
            );
            assert_eq!(total, 4);
        }
    }

    #[test]
    fn a_cut_to_nothing_keeps_an_empty_array() {
        assert_eq!(cap(r#"{"result":{"tools":[{"a":1},2]}}"#, 0, 3), (r#"{"result":{"tools":[]}}"#.into(), 2));
    }

    #[test]
    fn a_short_listing_and_other_messages_pass_unchanged() {
        for text in [
            r#"{"id":1,"result":{"tools":[]}}"#,
            r#"{"id":1,"result":{"tools":[{"name":"a"}]}}"#,
            r#"{"id":1,"result":{"content":[{"tools":[1,2,3]}],"tools2":[1,2,3]}}"#,
            r#"{"id":1,"error":{"tools":[1,2,3]}}"#,
            "event: message\ndata: {\"id\":1,\"result\":{\"tools\":[1, 2]}}\n\n",
        ] {
            assert_eq!(cap(text, 2, 3).0, text);
        }
        let sse = "event: message\ndata: {\"id\":1,\"result\":{\"tools\":[1, 2, 3]}}\n\n";
        assert_eq!(cap(sse, 1, 5), ("event: message\ndata: {\"id\":1,\"result\":{\"tools\":[1]}}\n\n".into(), 3));
    }
}
