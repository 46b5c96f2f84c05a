//! A small load generator for MCP over streamable HTTP: `clients` threads, each on one keep-alive
//! HTTP/1.1 connection, sending the same `tools/call` POST (body on stdin) back to back, `calls / clients`
//! each; every answer must be 200 and contain `check`. Answers of `Content-Length` and chunked (SSE)
//! framing are read; a connection the server closes is opened again and the unanswered request sent again.
//!
//!     mcpipe-loadgen URL CLIENTS CALLS CHECK < body.json
//!
//! Prints `calls seconds cpu_seconds` (this process's user+system CPU) on one line.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

struct Target {
    addr: String,
    request: Vec<u8>,
    check: Vec<u8>,
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return Some(0);
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

/// One complete response at the start of `buf`: (status, body, server closes, bytes used).
fn answer(buf: &[u8]) -> Option<(u16, Vec<u8>, bool, usize)> {
    let end = find(buf, b"\r\n\r\n")?;
    let head = buf[..end].to_ascii_lowercase();
    let status: u16 = std::str::from_utf8(&head[9..12]).ok()?.parse().ok()?;
    let closes = find(&head, b"\r\nconnection: close").is_some();
    if let Some(at) = find(&head, b"\r\ncontent-length:") {
        let rest = &head[at + 17..];
        let stop = find(rest, b"\r\n").unwrap_or(rest.len());
        let size: usize = std::str::from_utf8(&rest[..stop])
            .ok()?
            .trim()
            .parse()
            .ok()?;
        if buf.len() < end + 4 + size {
            return None;
        }
        return Some((
            status,
            buf[end + 4..end + 4 + size].to_vec(),
            closes,
            end + 4 + size,
        ));
    }
    // chunked: decode to the terminal chunk
    let mut at = end + 4;
    let mut body = Vec::new();
    loop {
        let line_end = at + find(&buf[at..], b"\r\n")?;
        let size_text = std::str::from_utf8(&buf[at..line_end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        let data = line_end + 2;
        if buf.len() < data + size + 2 {
            return None;
        }
        body.extend_from_slice(&buf[data..data + size]);
        at = data + size + 2;
        if size == 0 {
            return Some((status, body, closes, at));
        }
    }
}

fn client(target: &Target, mut left: usize) -> Result<usize, String> {
    let mut done = 0;
    let mut buf: Vec<u8> = Vec::with_capacity(65536);
    let mut chunk = vec![0u8; 65536];
    'connection: while left > 0 {
        let mut stream = TcpStream::connect(&target.addr)
            .map_err(|e| format!("connect {}: {e}", target.addr))?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        buf.clear();
        while left > 0 {
            stream
                .write_all(&target.request)
                .map_err(|e| format!("send: {e}"))?;
            loop {
                if let Some((status, body, closes, used)) = answer(&buf) {
                    buf.drain(..used);
                    if status != 200 || find(&body, &target.check).is_none() {
                        let shown =
                            String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
                        return Err(format!("bad answer {status}: {shown}"));
                    }
                    done += 1;
                    left -= 1;
                    if closes {
                        continue 'connection;
                    }
                    break;
                }
                let n = stream.read(&mut chunk).unwrap_or(0);
                if n == 0 {
                    continue 'connection; // closed under a request: send it again on a new connection
                }
                buf.extend_from_slice(&chunk[..n]);
            }
        }
    }
    Ok(done)
}

fn cpu_seconds() -> f64 {
    // utime and stime of this process, fields 14 and 15 of /proc/self/stat, in clock ticks (100 a second
    // on Linux unless the kernel says otherwise; USER_HZ is 100 on every common build).
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 5 {
        return Err("usage: mcpipe-loadgen URL CLIENTS CALLS CHECK < body".into());
    }
    let url = args[1]
        .strip_prefix("http://")
        .ok_or("the URL must start with http://")?;
    let (hostport, path) = url
        .split_once('/')
        .map(|(h, p)| (h, format!("/{p}")))
        .unwrap_or((url, "/".into()));
    let clients: usize = args[2].parse().map_err(|_| "CLIENTS must be a number")?;
    let calls: usize = args[3].parse().map_err(|_| "CALLS must be a number")?;
    if clients == 0 {
        return Err("CLIENTS must be at least 1".into());
    }
    let mut body = Vec::new();
    std::io::stdin()
        .read_to_end(&mut body)
        .map_err(|e| e.to_string())?;
    let name = find(&body, b"\"name\":\"")
        .map(|at| {
            let rest = &body[at + 8..];
            String::from_utf8_lossy(&rest[..find(rest, b"\"").unwrap_or(0)]).into_owned()
        })
        .unwrap_or_default();
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: {hostport}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\n\
         Mcp-Method: tools/call\r\nMcp-Name: {name}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(&body);
    let target = Arc::new(Target {
        addr: hostport.to_string(),
        request,
        check: args[4].clone().into_bytes(),
    });
    let per = (calls / clients).max(1);
    let t0 = Instant::now();
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let t = Arc::clone(&target);
            std::thread::spawn(move || client(&t, per))
        })
        .collect();
    let mut done = 0;
    for t in threads {
        done += t.join().map_err(|_| "a client thread panicked")??;
    }
    println!(
        "{done} {:.6} {:.3}",
        t0.elapsed().as_secs_f64(),
        cpu_seconds()
    );
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mcpipe-loadgen: {e}");
            ExitCode::FAILURE
        }
    }
}
