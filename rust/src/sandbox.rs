//! The sandbox's system calls (`mcpipe._sandbox._zygote`): `prctl`, `unshare`, `setns`, `mount`, `capset`
//! and `sched_setattr`, called directly.
//!
//! The fork server calls them in each worker it forks, as the worker's first work after `fork`. Through
//! `ctypes` each such call cost some 50 µs there: in a fresh fork, the first write to each page of the fork
//! server's heap copies it, and a `ctypes` call touches many (its argument conversions, its objects). A
//! native call touches a few. Each raises `OSError(errno, "what: strerror")` as the `ctypes` versions did.

use std::ffi::CString;

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;

/// `OSError(errno, "what: strerror")` for the last system call's error.
fn last_error(what: &str) -> PyErr {
    let err = std::io::Error::last_os_error();
    let code = err.raw_os_error().unwrap_or(0);
    let text = err.to_string();
    let text = text.split(" (os error").next().unwrap_or(&text).to_owned();
    PyOSError::new_err((code, format!("{what}: {text}")))
}

fn check(result: libc::c_int, what: impl FnOnce() -> String) -> PyResult<()> {
    if result == 0 {
        Ok(())
    } else {
        Err(last_error(&what()))
    }
}

fn c_string(s: Option<&str>) -> PyResult<Option<CString>> {
    s.map(|s| CString::new(s).map_err(|_| PyValueError::new_err("a mount argument holds a NUL byte"))).transpose()
}

/// `prctl(option, value, 0, 0, 0)`.
#[pyfunction]
pub fn sys_prctl(option: libc::c_int, value: libc::c_ulong) -> PyResult<()> {
    // SAFETY: prctl with integer arguments only; the zero trailing arguments are what the options used
    // here expect.
    check(unsafe { libc::prctl(option, value, 0 as libc::c_ulong, 0 as libc::c_ulong, 0 as libc::c_ulong) }, || {
        format!("prctl({option})")
    })
}

/// `unshare(flags)`.
#[pyfunction]
pub fn sys_unshare(flags: libc::c_int) -> PyResult<()> {
    // SAFETY: no pointers.
    check(unsafe { libc::unshare(flags) }, || "unshare".to_owned())
}

/// `setns(fd, kind)`.
#[pyfunction]
pub fn sys_setns(fd: libc::c_int, kind: libc::c_int) -> PyResult<()> {
    // SAFETY: no pointers; a bad descriptor is the kernel's EBADF.
    check(unsafe { libc::setns(fd, kind) }, || "setns".to_owned())
}

/// `mount(source, target, fstype, flags, data)`, each string optional but `target`.
#[pyfunction]
#[pyo3(signature = (source, target, fstype, flags, data = None))]
pub fn sys_mount(
    source: Option<&str>,
    target: &str,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> PyResult<()> {
    let (source, fstype, data) = (c_string(source)?, c_string(fstype)?, c_string(data)?);
    let target_c = c_string(Some(target))?.unwrap_or_default();
    let ptr = |s: &Option<CString>| s.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
    // SAFETY: every pointer is a NUL-terminated string alive for the call, or null where mount allows it.
    let result =
        unsafe { libc::mount(ptr(&source), target_c.as_ptr(), ptr(&fstype), flags, ptr(&data) as *const libc::c_void) };
    check(result, || format!("mount {target}"))
}

/// No capability left, effective, permitted or inheritable (`capset`, version 3).
#[pyfunction]
pub fn sys_drop_capabilities() -> PyResult<()> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Default, Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut header = Header { version: 0x2008_0522, pid: 0 };
    let data = [Data::default(); 2];
    // SAFETY: the header and the two data words of `_LINUX_CAPABILITY_VERSION_3`, alive for the call.
    let result = unsafe { libc::syscall(libc::SYS_capset, &mut header as *mut Header, data.as_ptr()) };
    check(result as libc::c_int, || "capset".to_owned())
}

/// This thread's `sched_runtime` (its time slice, Linux 6.12+) set to `runtime_ns` at its nice value,
/// policy normal: true when the kernel took it.
#[pyfunction]
pub fn sys_sched_runtime(runtime_ns: u64) -> bool {
    #[repr(C)]
    struct SchedAttr {
        size: u32,
        policy: u32,
        flags: u64,
        nice: i32,
        priority: u32,
        runtime: u64,
        deadline: u64,
        period: u64,
        util_min: u32,
        util_max: u32,
    }
    // SAFETY: getpriority with integer arguments; errno is cleared first, as its -1 may be a nice value.
    let nice = unsafe {
        *libc::__errno_location() = 0;
        libc::getpriority(libc::PRIO_PROCESS, 0)
    };
    let mut attr = SchedAttr {
        size: std::mem::size_of::<SchedAttr>() as u32,
        policy: 0,
        flags: 0,
        nice,
        priority: 0,
        runtime: runtime_ns,
        deadline: 0,
        period: 0,
        util_min: 0,
        util_max: 0,
    };
    // SAFETY: a `sched_attr` of its declared size, alive for the call; pid 0 is this thread.
    unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &mut attr as *mut SchedAttr, 0) == 0 }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(sys_prctl, m)?)?;
    m.add_function(wrap_pyfunction!(sys_unshare, m)?)?;
    m.add_function(wrap_pyfunction!(sys_setns, m)?)?;
    m.add_function(wrap_pyfunction!(sys_mount, m)?)?;
    m.add_function(wrap_pyfunction!(sys_drop_capabilities, m)?)?;
    m.add_function(wrap_pyfunction!(sys_sched_runtime, m)?)?;
    m.add_function(wrap_pyfunction!(crate::forkserver::fork_server_loop, m)?)?;
    Ok(())
}
