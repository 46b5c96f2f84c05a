//! Request heads for mcpipe's own HTTP/1.1 front (`mcpipe.server._front`): parsed with the `httparse` crate,
//! and accepted only when they are *plain*: what h11 (hypercorn's parser) would accept and read the same way.
//! Anything else is not refused here but handed back as [`Parsed::Other`]: the front then gives the
//! connection, with the bytes read so far, to hypercorn's own protocol, which answers it as it always has
//! (a 400 for what h11 refuses, h2c for an `Upgrade`, a chunked body, obs-fold, ...). So this parser may
//! be narrower than h11, never wider. Pure Rust; the binding is `binding::http1_head`.
//!
//! Plain means: a request line `METHOD SP target SP HTTP/1.0|1.1 CRLF` with a target of visible ASCII;
//! CRLF line ends only, no empty line before it; header names that are tokens, values of visible
//! characters, spaces, tabs and obs-text (trimmed); at most one `Content-Length`, of digits only; no
//! `Transfer-Encoding` and no `Upgrade`; exactly one `Host` on HTTP/1.1 (at most one on 1.0); the whole head
//! within `max_head` bytes (h11's `max_incomplete_event_size`).

/// How many header lines a plain head may have (more: hypercorn's protocol reads it).
pub const MAX_HEADERS: usize = 64;

/// The flags of a plain head.
pub const CLOSE: u32 = 1;
/// The client waits for `100 Continue` before its body (`Expect: 100-continue` on HTTP/1.1).
pub const EXPECT_CONTINUE: u32 = 2;

/// A plain request head: byte ranges into the buffer it was parsed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub method: (usize, usize),
    pub target: (usize, usize),
    /// `0` for HTTP/1.0, `1` for HTTP/1.1.
    pub minor: u8,
    /// (name, value) ranges; names are to be lower-cased by the reader.
    pub headers: Vec<((usize, usize), (usize, usize))>,
    /// The head's length, its empty line included: the body (if any) starts there.
    pub len: usize,
    pub content_length: u64,
    /// [`CLOSE`] (`Connection: close`, or HTTP/1.0, which h11 never keeps alive), [`EXPECT_CONTINUE`].
    pub flags: u32,
}

/// What the bytes at the start of a buffer are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    /// A head has begun but not ended (and is still within `max_head`).
    Partial,
    Plain(Head),
    /// Not a plain head (or too long): for hypercorn's protocol.
    Other,
}

fn range(buf: &[u8], part: &[u8]) -> (usize, usize) {
    let start = part.as_ptr() as usize - buf.as_ptr() as usize;
    (start, start + part.len())
}

fn trim(value: &[u8]) -> &[u8] {
    let start = value.iter().position(|b| *b != b' ' && *b != b'\t').unwrap_or(value.len());
    let end = value.iter().rposition(|b| *b != b' ' && *b != b'\t').map_or(start, |e| e + 1);
    &value[start..end]
}

/// Whether a comma-separated header value lists `token` (case-insensitive), as h11's `get_comma_header`.
fn lists(value: &[u8], token: &[u8]) -> bool {
    value.split(|b| *b == b',').any(|item| trim(item).eq_ignore_ascii_case(token))
}

/// Read the head at the start of `buf`.
pub fn parse(buf: &[u8], max_head: usize) -> Parsed {
    if buf.first().is_some_and(|b| *b == b'\r' || *b == b'\n') {
        return Parsed::Other; // h11 refuses an empty line before the request line; httparse skips it
    }
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut slots);
    let len = match request.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() <= max_head => return Parsed::Partial,
        _ => return Parsed::Other,
    };
    if len > max_head {
        return Parsed::Other;
    }
    plain(buf, len, &request).unwrap_or(Parsed::Other)
}

fn plain(buf: &[u8], len: usize, request: &httparse::Request<'_, '_>) -> Option<Parsed> {
    // Line ends are CRLF only (httparse takes a bare LF too; so does h11, but plain means one reading).
    let head = &buf[..len];
    if head.iter().enumerate().any(|(i, b)| *b == b'\n' && (i == 0 || head[i - 1] != b'\r')) {
        return None;
    }
    let method = request.method?;
    let target = request.path?;
    if target.is_empty() || !target.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
        return None;
    }
    let minor = request.version?;
    let mut flags = if minor == 0 { CLOSE } else { 0 };
    let mut content_length = None;
    let mut hosts = 0;
    let mut headers = Vec::with_capacity(request.headers.len());
    for header in request.headers.iter() {
        let name = header.name.as_bytes();
        let value = trim(header.value);
        if name.eq_ignore_ascii_case(b"content-length") {
            if content_length.is_some() || value.is_empty() || value.len() > 18 || !value.iter().all(u8::is_ascii_digit)
            {
                return None; // repeated (h11 merges equal ones, refuses others), or not digits: h11's call
            }
            content_length = Some(value.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0')));
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") || name.eq_ignore_ascii_case(b"upgrade") {
            return None;
        } else if name.eq_ignore_ascii_case(b"host") {
            hosts += 1;
        } else if name.eq_ignore_ascii_case(b"connection") {
            if lists(value, b"close") {
                flags |= CLOSE;
            }
        } else if name.eq_ignore_ascii_case(b"expect") && minor == 1 && lists(value, b"100-continue") {
            flags |= EXPECT_CONTINUE;
        }
        headers.push((range(buf, header.name.as_bytes()), range(buf, value)));
    }
    if hosts > 1 || (minor == 1 && hosts == 0) {
        return None; // h11: "Missing mandatory Host: header", "Found multiple Host: headers"
    }
    Some(Parsed::Plain(Head {
        method: range(buf, method.as_bytes()),
        target: range(buf, target.as_bytes()),
        minor,
        headers,
        len,
        content_length: content_length.unwrap_or(0),
        flags,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(raw: &[u8]) -> Head {
        match parse(raw, 16384) {
            Parsed::Plain(head) => head,
            other => panic!("{:?}: {other:?}", String::from_utf8_lossy(raw)),
        }
    }

    #[test]
    fn a_plain_post_gives_its_parts() {
        let raw = b"POST /mcp?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length:  12 \r\nX-A: b c \r\n\r\nbody";
        let h = head(raw);
        assert_eq!(&raw[h.method.0..h.method.1], b"POST");
        assert_eq!(&raw[h.target.0..h.target.1], b"/mcp?x=1");
        assert_eq!(h.content_length, 12);
        assert_eq!(h.len, raw.len() - 4);
        let (_, v) = h.headers[2];
        assert_eq!(&raw[v.0..v.1], b"b c");
        assert_eq!(h.flags, 0);
    }

    #[test]
    fn close_and_continue_are_flagged() {
        assert_eq!(head(b"GET / HTTP/1.0\r\n\r\n").flags, CLOSE);
        let h = head(b"POST / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, Close\r\nExpect: 100-continue\r\n\r\n");
        assert_eq!(h.flags, CLOSE | EXPECT_CONTINUE);
    }

    #[test]
    fn an_unfinished_head_is_partial_until_too_long() {
        assert_eq!(parse(b"GET / HTTP/1.1\r\nHost: a\r\n", 100), Parsed::Partial);
        assert_eq!(parse(b"GET / HTTP/1.1\r\nHost: a\r\n", 10), Parsed::Other);
    }

    #[test]
    fn what_is_not_plain_goes_to_hypercorn() {
        for raw in [
            &b"\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n"[..],
            b"GET / HTTP/1.1\nHost: a\n\n",
            b"GET / HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1,1\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: h2c\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nX: a\r\n b\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost : a\r\n\r\n",
            b"GET / HTTP/2.0\r\nHost: a\r\n\r\n",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            b"GET /\x7f HTTP/1.1\r\nHost: a\r\n\r\n",
            b"GET  / HTTP/1.1\r\nHost: a\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\x01\r\n\r\n",
        ] {
            assert_eq!(parse(raw, 16384), Parsed::Other, "{:?}", String::from_utf8_lossy(raw));
        }
    }
}
