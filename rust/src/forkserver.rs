//! The sandbox's fork server loop (`mcpipe._sandbox._zygote.Zygote.serve`), native.
//!
//! Each `fork` write-protects every page of the fork server, and a page it writes afterwards is copied
//! while a worker still shares it. Its loop in Python wrote to some 180 pages per worker (the interpreter's
//! frames, `json`, `socket`'s wrappers, the bookkeeping dicts): about half of the 0.9 ms it spent on each.
//! Here the loop between two forks writes to its own few pages. What it does per worker is what the Python
//! loop did:
//!
//! * read a request (`{"op": "spawn", ...}` with the worker's four or five descriptors);
//! * make the worker's directory (`mcpipe-py-` and 12 random hex digits, mode 0700, the worker's uid's),
//!   fork it (in a new PID namespace when asked) through `os.fork` (so Python's fork hooks run), answer
//!   `{"pid", "cwd", "loops"}` with a pidfd, or `{"error": ...}`;
//! * when it ends, reap it, sweep what it left when it had no PID namespace (a Python callback: the rare
//!   case), remove its directory (`rmdir`; a directory left non-empty by a Python callback, which walks it
//!   without following links) and answer `{"exit": CODE}`.
//!
//! The forked worker returns from the call (the request's bytes, its descriptors, its directory, its uid,
//! whether it has a PID namespace and whether it loops) and becomes the worker in Python. The fork server itself returns only
//! with an error: when its server is gone (end of file, or its parent changed) it kills its workers,
//! removes their directories and exits.

use std::collections::HashMap;
use std::ffi::CString;

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use serde_json::Value;

const MAX_MESSAGE: usize = 65536;
const MAX_FDS: usize = 8;
const DIR_PREFIX: &str = "mcpipe-py-";

/// A worker alive: its status socket (a descriptor of this process), its uid of its own, whether it has a
/// PID namespace, its directory.
struct Entry {
    st: i32,
    uid: Option<i64>,
    pidns: bool,
    cwd: String,
}

/// What the forked worker returns with: the request's bytes, its descriptors, its directory, its uid (None:
/// the server's), whether it has a PID namespace, and whether it may serve more than one request (as the
/// server was told).
type Spawned = (Py<PyBytes>, Vec<i32>, String, Option<i64>, bool, bool);

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// `[Errno N] text`, as Python writes an `OSError`.
fn os_text(code: i32) -> String {
    let text = std::io::Error::from_raw_os_error(code).to_string();
    let text = text.split(" (os error").next().unwrap_or(&text).to_owned();
    format!("[Errno {code}] {text}")
}

fn close(fd: i32) {
    // SAFETY: closing a descriptor this process owns; an error (EBADF) is nothing to act on.
    unsafe { libc::close(fd) };
}

/// Send one datagram on a status socket, with `fd` passed along when given (errors ignored: the server
/// side may be gone, as the Python loop's `contextlib.suppress(OSError)` did).
fn send(st: i32, data: &[u8], fd: Option<i32>) -> bool {
    let mut iov = libc::iovec { iov_base: data.as_ptr() as *mut libc::c_void, iov_len: data.len() };
    // SAFETY: a msghdr over `data` and, for `fd`, a control buffer sized by CMSG_SPACE for one int.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        let space = libc::CMSG_SPACE(std::mem::size_of::<i32>() as u32) as usize;
        let mut control = vec![0u8; space];
        if let Some(fd) = fd {
            msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
            msg.msg_controllen = space;
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<i32>() as u32) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(cmsg) as *mut i32, fd);
        }
        loop {
            if libc::sendmsg(st, &msg, libc::MSG_NOSIGNAL) >= 0 {
                return true;
            }
            if errno() != libc::EINTR {
                return false;
            }
        }
    }
}

/// One request: its bytes and the descriptors that came with it; None at the end of the socket (or an
/// error reading it: the server is gone either way).
fn receive(sock: i32, buf: &mut [u8]) -> Option<(usize, Vec<i32>)> {
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr() as *mut libc::c_void, iov_len: buf.len() };
    // SAFETY: a msghdr over `buf` and a control buffer sized by CMSG_SPACE for MAX_FDS ints; the control
    // messages are walked with the CMSG macros within `msg_controllen`.
    unsafe {
        let space = libc::CMSG_SPACE((MAX_FDS * std::mem::size_of::<i32>()) as u32) as usize;
        let mut control = vec![0u8; space];
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = space;
        let n = loop {
            let n = libc::recvmsg(sock, &mut msg, 0);
            if n >= 0 || errno() != libc::EINTR {
                break n;
            }
        };
        if n <= 0 {
            return None;
        }
        let mut fds = Vec::new();
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg) as *const i32;
                let len = (*cmsg).cmsg_len - libc::CMSG_LEN(0) as usize;
                for i in 0..len / std::mem::size_of::<i32>() {
                    fds.push(std::ptr::read_unaligned(data.add(i)));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
        Some((n as usize, fds))
    }
}

/// A new directory for a worker in `parent` (see `_zygote.make_dir`): mode 0700, a name of 12 random hex
/// digits drawn again when it exists.
fn make_dir(parent: &str) -> Result<String, String> {
    for _ in 0..100 {
        let mut random = [0u8; 6];
        // SAFETY: getrandom fills the 6 bytes of `random`.
        let got = unsafe { libc::getrandom(random.as_mut_ptr() as *mut libc::c_void, random.len(), 0) };
        if got != random.len() as isize {
            return Err(os_text(errno()));
        }
        let hex: String = random.iter().map(|b| format!("{b:02x}")).collect();
        let path = format!("{parent}/{DIR_PREFIX}{hex}");
        let c = CString::new(path.as_str()).map_err(|_| "a NUL byte in the directory's name".to_owned())?;
        // SAFETY: a NUL-terminated path.
        if unsafe { libc::mkdir(c.as_ptr(), 0o700) } == 0 {
            return Ok(path);
        }
        let code = errno();
        if code != libc::EEXIST {
            return Err(format!("{}: '{path}'", os_text(code)));
        }
    }
    Err(format!("no free name for a worker's directory in {parent}"))
}

/// Remove a worker's directory: one `rmdir` when it is empty (most are), a link put in its place unlinked,
/// else `remove_tree` (Python's `_zygote.remove_dir`, which walks it without following links).
fn remove_dir(path: &str, remove_tree: &Bound<'_, PyAny>) -> PyResult<()> {
    let Ok(c) = CString::new(path) else { return Ok(()) };
    // SAFETY: NUL-terminated paths.
    unsafe {
        if libc::rmdir(c.as_ptr()) == 0 {
            return Ok(());
        }
        match errno() {
            libc::ENOENT => return Ok(()),
            libc::ENOTDIR => {
                libc::unlink(c.as_ptr());
                return Ok(());
            }
            _ => {}
        }
    }
    remove_tree.call1((path,))?;
    Ok(())
}

fn exit_code(status: i32) -> i32 {
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else if libc::WIFSIGNALED(status) {
        -libc::WTERMSIG(status)
    } else {
        status
    }
}

/// A request's value as Python's `bool()` reads it (the Python loop's `cmd.get(name, True)`).
fn truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

fn json_bytes(value: &Value) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_default()
}

struct Server<'py> {
    py: Python<'py>,
    tmp: String,
    uid_ok: bool,
    pidns_ok: bool,
    own_pidns: i32,
    fork: Bound<'py, PyAny>,
    sweep: Bound<'py, PyAny>,
    remove_tree: Bound<'py, PyAny>,
    workers: HashMap<i32, Entry>,
}

enum Handled {
    Parent,
    Child(Spawned),
}

impl Server<'_> {
    /// Kill every worker, remove their directories, exit: the server is gone.
    fn stop(&mut self) -> ! {
        for (pid, entry) in self.workers.drain() {
            // SAFETY: a signal to a child of this process (not yet reaped, so its pid is still its own).
            unsafe { libc::kill(pid, libc::SIGKILL) };
            let _ = remove_dir(&entry.cwd, &self.remove_tree);
        }
        // SAFETY: the process ends here, as `os._exit(0)` did.
        unsafe { libc::_exit(0) }
    }

    fn reap(&mut self) -> PyResult<()> {
        loop {
            let mut status = 0;
            // SAFETY: waitpid with a pointer to a local int.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if pid < 0 && errno() == libc::EINTR {
                continue;
            }
            if pid <= 0 {
                return Ok(());
            }
            let Some(entry) = self.workers.remove(&pid) else {
                continue; // something a worker left, re-parented here and now gone
            };
            if !entry.pidns {
                // in its own PID namespace, the kernel has killed the rest already
                let others: Vec<i32> = self.workers.keys().copied().collect();
                self.sweep.call1((entry.uid, others))?;
            }
            remove_dir(&entry.cwd, &self.remove_tree)?; // before the server hears of the end
            send(entry.st, &json_bytes(&serde_json::json!({"exit": exit_code(status)})), None);
            close(entry.st);
        }
    }

    fn handle(&mut self, message: &[u8], fds: &[i32]) -> PyResult<Handled> {
        let cmd: Value = serde_json::from_slice(message)
            .map_err(|e| PyValueError::new_err(format!("the fork server's request is not JSON: {e}")))?;
        if cmd.get("op").and_then(Value::as_str) != Some("spawn") || fds.len() < 4 {
            return Ok(Handled::Parent);
        }
        // SAFETY: dup of a descriptor received with the request.
        let st = unsafe { libc::dup(fds[0]) };
        if st < 0 {
            return Ok(Handled::Parent);
        }
        let flag = |name: &str| cmd.get(name).is_none_or(truthy);
        let separate_uid = flag("separate_uid");
        let wanted_uid = cmd.get("uid").and_then(Value::as_i64);
        let uid = if self.uid_ok && separate_uid { wanted_uid } else { None };
        let pidns = self.pidns_ok && flag("pidns");
        let reuse = cmd.get("reuse").is_some_and(truthy);
        let role_is_exec = cmd.get("role").and_then(Value::as_str) == Some("exec");
        let loops = reuse && !role_is_exec && (pidns || (self.uid_ok && separate_uid && wanted_uid.is_some()));

        let fail = |st: i32, text: String| {
            send(st, &json_bytes(&serde_json::json!({"error": format!("cannot start a worker: {text}")})), None);
            close(st);
        };
        let cwd = match make_dir(&self.tmp) {
            Ok(cwd) => cwd,
            Err(text) => {
                fail(st, text);
                return Ok(Handled::Parent);
            }
        };
        if let Some(uid) = uid {
            let c = CString::new(cwd.as_str()).unwrap_or_default();
            // SAFETY: a NUL-terminated path; the uid and gid are the worker's.
            if unsafe { libc::chown(c.as_ptr(), uid as libc::uid_t, uid as libc::gid_t) } != 0 {
                let text = format!("{}: '{cwd}'", os_text(errno()));
                remove_dir(&cwd, &self.remove_tree)?;
                fail(st, text);
                return Ok(Handled::Parent);
            }
        }
        // SAFETY: unshare with a flag only; the children forked from now are in a new PID namespace.
        if pidns && unsafe { libc::unshare(libc::CLONE_NEWPID) } != 0 {
            let text = os_text(errno());
            remove_dir(&cwd, &self.remove_tree)?;
            fail(st, format!("unshare: {text}"));
            return Ok(Handled::Parent);
        }
        let forked = self.fork.call0().and_then(|pid| pid.extract::<i32>());
        if pidns {
            // SAFETY: back to this process's own PID namespace for its later children.
            unsafe { libc::setns(self.own_pidns, libc::CLONE_NEWPID) };
        }
        let pid = match forked {
            Ok(pid) => pid,
            Err(e) => {
                remove_dir(&cwd, &self.remove_tree)?;
                let text = e.value(self.py).str().map(|s| s.to_string()).unwrap_or_default();
                fail(st, text);
                return Ok(Handled::Parent);
            }
        };
        if pid == 0 {
            close(st);
            let message = PyBytes::new(self.py, message).unbind();
            return Ok(Handled::Child((message, fds.to_vec(), cwd, uid, pidns, loops)));
        }
        // SAFETY: pidfd_open of a child of this process (not reaped yet).
        let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
        if pidfd < 0 {
            let text = os_text(errno());
            // SAFETY: a signal to the child just forked.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            send(st, &json_bytes(&serde_json::json!({"error": format!("cannot watch a worker: {text}")})), None);
            self.workers.insert(pid, Entry { st, uid: None, pidns, cwd });
            return Ok(Handled::Parent);
        }
        let ack = serde_json::json!({"pid": pid, "cwd": cwd, "loops": loops});
        if !send(st, &json_bytes(&ack), Some(pidfd)) {
            // SAFETY: a signal to the child just forked.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        close(pidfd);
        self.workers.insert(pid, Entry { st, uid, pidns, cwd });
        Ok(Handled::Parent)
    }
}

/// Serve the fork server's socket until the server is gone (see the module's text). Returns in each
/// forked worker only; raises if a request is not JSON or a callback raised.
#[pyfunction]
#[pyo3(signature = (sock, wake, parent, tmp, uid_ok, pidns_ok, own_pidns, fork, sweep, remove_tree))]
#[allow(clippy::too_many_arguments)]
pub fn fork_server_loop<'py>(
    py: Python<'py>,
    sock: i32,
    wake: i32,
    parent: i32,
    tmp: String,
    uid_ok: bool,
    pidns_ok: bool,
    own_pidns: i32,
    fork: Bound<'py, PyAny>,
    sweep: Bound<'py, PyAny>,
    remove_tree: Bound<'py, PyAny>,
) -> PyResult<Spawned> {
    let mut server = Server { py, tmp, uid_ok, pidns_ok, own_pidns, fork, sweep, remove_tree, workers: HashMap::new() };
    let mut buf = vec![0u8; MAX_MESSAGE];
    loop {
        let mut polled = [
            libc::pollfd { fd: sock, events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: wake, events: libc::POLLIN, revents: 0 },
        ];
        // SAFETY: poll over the two pollfds above.
        let n = unsafe { libc::poll(polled.as_mut_ptr(), 2, -1) };
        if n < 0 {
            let code = errno();
            if code == libc::EINTR {
                py.check_signals()?;
                continue;
            }
            return Err(PyOSError::new_err((code, format!("poll: {}", os_text(code)))));
        }
        if polled[1].revents != 0 {
            let mut drain = [0u8; 4096];
            // SAFETY: a read into a local buffer of its size (poll said the pipe is readable).
            unsafe { libc::read(wake, drain.as_mut_ptr() as *mut libc::c_void, drain.len()) };
            // The Python handlers of the signals that woke it (SIGCHLD's does nothing).
            py.check_signals()?;
            // SAFETY: getppid has no arguments.
            if unsafe { libc::getppid() } != parent {
                server.stop();
            }
            server.reap()?;
        }
        if polled[0].revents != 0 {
            let Some((len, fds)) = receive(sock, &mut buf) else { server.stop() };
            let handled = server.handle(&buf[..len], &fds);
            if let Ok(Handled::Child(spawned)) = handled {
                return Ok(spawned);
            }
            for fd in &fds {
                close(*fd);
            }
            handled?;
        }
    }
}
