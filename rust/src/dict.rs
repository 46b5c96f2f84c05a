//! Dict lookups on the resolve path: CPython's own probe of a str-keyed table, inlined.
//!
//! `PyDict_GetItemWithError` costs about 110 instructions a call on CPython 3.11 (the call, the
//! generic `_Py_dict_lookup` dispatch, then the probe); a resolve of a small template makes a dozen.
//! For an exact dict whose table holds only str keys (CPython's `DICT_KEYS_UNICODE` tables, the usual
//! JSON-like dict) the probe itself is a few loads: hash the key (cached in the str), read the index
//! slot, compare the entry's key by identity (our keys are interned) or, failing that, by hash and
//! contents, exactly as `unicodekeys_lookup_unicode` in `Objects/dictobject.c` does. Every other
//! table (general keys, split tables) goes to `PyDict_GetItemWithError`.
//!
//! The layout below is CPython's (`Include/internal/pycore_dict.h`), the same from 3.11 to 3.14 in the
//! default (GIL) build; `enable` checks the running interpreter and then the layout itself on a real
//! dict before switching the probe on, so anything else simply keeps the C API.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

/// `PyDictObject` (3.11 to 3.14: the version tag became the watcher tag in 3.14, same size).
#[allow(dead_code)] // the fields only mirror the layout
#[repr(C)]
struct DictObject {
    ob_base: ffi::PyObject,
    ma_used: ffi::Py_ssize_t,
    ma_version_tag: u64,
    ma_keys: *mut DictKeys,
    ma_values: *mut c_void,
}

/// `struct _dictkeysobject`, without free threading's `dk_mutex`; the index table follows, then the
/// entries.
#[allow(dead_code)]
#[repr(C)]
struct DictKeys {
    dk_refcnt: ffi::Py_ssize_t,
    dk_log2_size: u8,
    dk_log2_index_bytes: u8,
    dk_kind: u8,
    dk_version: u32,
    dk_usable: ffi::Py_ssize_t,
    dk_nentries: ffi::Py_ssize_t,
    dk_indices: [u8; 0],
}

/// `PyDictUnicodeEntry`.
#[repr(C)]
struct UnicodeEntry {
    key: *mut ffi::PyObject,
    value: *mut ffi::PyObject,
}

const DICT_KEYS_UNICODE: u8 = 1;
#[cfg(not(feature = "abi3"))]
const DKIX_EMPTY: isize = -1;
#[cfg(not(feature = "abi3"))]
const PERTURB_SHIFT: u32 = 5;

static PROBE: AtomicBool = AtomicBool::new(false);

/// Switch the inlined probe on when the running interpreter is CPython 3.11 to 3.14 with the plain
/// object header (no free threading), and the probe finds and misses keys in a real dict as the C API
/// does. Called once, when the module is loaded.
pub fn enable(py: Python<'_>) -> PyResult<()> {
    if cfg!(feature = "abi3") {
        return Ok(()); // a stable-ABI build loads on interpreters whose dict layout it cannot know
    }
    let version = py.version_info();
    let cpython = py.import("sys")?.getattr("implementation")?.getattr("name")?.extract::<String>()? == "cpython";
    let plain_header = std::mem::size_of::<ffi::PyObject>() == 2 * std::mem::size_of::<usize>();
    if !(cpython && plain_header && version.major == 3 && (11..15).contains(&version.minor)) {
        return Ok(());
    }
    // The layout check, on a small dict (one-byte indices) and a large one (two-byte indices): every key
    // is found where the C API finds it, an equal str that is not the same object too, and a missing
    // key is missing.
    let mut layout_holds = true;
    for size in [5, 300] {
        let dict = PyDict::new(py);
        let keys = (0..size).map(|i| PyString::intern(py, &format!("k{i}"))).collect::<Vec<_>>();
        for (i, key) in keys.iter().enumerate() {
            dict.set_item(key, i)?;
        }
        let copy = PyString::new(py, "k3");
        let absent = PyString::new(py, "absent");
        copy.hash()?;
        absent.hash()?;
        for key in keys.iter().chain([&copy]) {
            let expected = dict.get_item(key)?.map_or(std::ptr::null_mut(), |value| value.as_ptr());
            // SAFETY: a live exact dict and exact str keys with cached hashes.
            let found = unsafe { probe(dict.as_ptr(), key.as_ptr()) };
            layout_holds &= matches!(found, Probe::Hit(value) if value == expected);
        }
        // SAFETY: as above.
        layout_holds &= matches!(unsafe { probe(dict.as_ptr(), absent.as_ptr()) }, Probe::Miss);
    }
    PROBE.store(layout_holds, Ordering::Relaxed);
    Ok(())
}

#[cfg_attr(feature = "abi3", allow(dead_code))]
pub enum Probe {
    Hit(*mut ffi::PyObject),
    Miss,
    /// Not a str-keyed table (or something unexpected): ask the C API.
    Unknown,
}

/// `PyDict_GetItemWithError(dict, key)`: the value (borrowed), or null with an error set, or null with
/// none (the key is missing). `dict` must be an exact dict and `key` an exact str whose hash is cached
/// (the plan's interned keys). Runs no Python code on a str-keyed table.
#[inline(always)]
pub unsafe fn get_item(dict: *mut ffi::PyObject, key: *mut ffi::PyObject) -> *mut ffi::PyObject {
    if PROBE.load(Ordering::Relaxed) {
        match probe(dict, key) {
            Probe::Hit(value) => return value,
            Probe::Miss => return std::ptr::null_mut(),
            Probe::Unknown => {}
        }
    }
    ffi::PyDict_GetItemWithError(dict, key)
}

/// The probe alone (`Unknown` when it is off or the table is not str-keyed): runs no Python code.
/// `dict` must be an exact dict and `key` an exact str whose hash is cached.
#[inline(always)]
pub unsafe fn probe_str_table(dict: *mut ffi::PyObject, key: *mut ffi::PyObject) -> Probe {
    if PROBE.load(Ordering::Relaxed) {
        probe(dict, key)
    } else {
        Probe::Unknown
    }
}

/// The stable ABI has no dict layout: the probe is never on.
#[cfg(feature = "abi3")]
unsafe fn probe(_dict: *mut ffi::PyObject, _key: *mut ffi::PyObject) -> Probe {
    Probe::Unknown
}

/// `unicodekeys_lookup_unicode` of CPython's `Objects/dictobject.c`, for a combined str-keyed table.
#[cfg(not(feature = "abi3"))]
#[inline(always)]
unsafe fn probe(dict: *mut ffi::PyObject, key: *mut ffi::PyObject) -> Probe {
    let keys = (*dict.cast::<DictObject>()).ma_keys;
    let hash = (*key.cast::<ffi::PyASCIIObject>()).hash;
    if (*keys).dk_kind != DICT_KEYS_UNICODE || hash == -1 {
        return Probe::Unknown;
    }
    let log2_size = (*keys).dk_log2_size;
    let mask = (1usize << log2_size) - 1;
    let indices = std::ptr::addr_of!((*keys).dk_indices).cast::<u8>();
    let entries = indices.add(1usize << (*keys).dk_log2_index_bytes).cast::<UnicodeEntry>();
    let mut perturb = hash as usize;
    let mut i = hash as usize & mask;
    loop {
        let ix = if log2_size < 8 { *indices.cast::<i8>().add(i) as isize } else { wide_index(indices, log2_size, i) };
        if ix >= 0 {
            let entry = &*entries.add(ix as usize);
            if entry.key == key || same_text(entry.key, key, hash) {
                return if entry.value.is_null() { Probe::Unknown } else { Probe::Hit(entry.value) };
            }
        } else if ix == DKIX_EMPTY {
            return Probe::Miss;
        }
        perturb >>= PERTURB_SHIFT;
        i = mask & (i.wrapping_mul(5).wrapping_add(perturb).wrapping_add(1));
    }
}

#[cfg(not(feature = "abi3"))]
#[inline(never)]
unsafe fn wide_index(indices: *const u8, log2_size: u8, i: usize) -> isize {
    match log2_size {
        8..=15 => *indices.cast::<i16>().add(i) as isize,
        16..=31 => *indices.cast::<i32>().add(i) as isize,
        _ => *indices.cast::<i64>().add(i) as isize,
    }
}

/// `unicode_get_hash(a) == hash && unicode_eq(a, b)`: two exact str with the same hash and contents.
#[cfg(not(feature = "abi3"))]
#[inline(never)]
unsafe fn same_text(a: *mut ffi::PyObject, b: *mut ffi::PyObject, hash: ffi::Py_hash_t) -> bool {
    if (*a.cast::<ffi::PyASCIIObject>()).hash != hash {
        return false;
    }
    let len = ffi::PyUnicode_GET_LENGTH(a);
    if len != ffi::PyUnicode_GET_LENGTH(b) {
        return false;
    }
    let kind = ffi::PyUnicode_KIND(a);
    if kind != ffi::PyUnicode_KIND(b) {
        return false;
    }
    let bytes = len as usize * kind as usize;
    std::slice::from_raw_parts(ffi::PyUnicode_DATA(a).cast::<u8>(), bytes)
        == std::slice::from_raw_parts(ffi::PyUnicode_DATA(b).cast::<u8>(), bytes)
}

// --- building a dict from a skeleton ------------------------------------------------------------------

/// The dict a template object's results copy: its keys in order, every value None. None when the
/// probe is off or a key is not an exact str (then results are built key by key).
pub fn skeleton(py: Python<'_>, keys: &[Py<PyAny>]) -> PyResult<Option<Py<PyDict>>> {
    // SAFETY: type checks on live objects.
    let all_str = keys.iter().all(|key| unsafe { ffi::PyUnicode_CheckExact(key.as_ptr()) } != 0);
    if !PROBE.load(Ordering::Relaxed) || !all_str || keys.is_empty() {
        return Ok(None);
    }
    let dict = PyDict::new(py);
    for key in keys {
        dict.set_item(key, py.None())?;
    }
    Ok(Some(dict.unbind()))
}

/// A copy of `skeleton` (`n` keys) and its entries, to be filled with `set_value`; None (nothing left
/// to release) when the copy's table is not a str-keyed table of exactly `n` entries in order.
#[inline]
pub unsafe fn copy_skeleton(
    py: Python<'_>,
    skeleton: *mut ffi::PyObject,
    n: usize,
) -> PyResult<Option<(*mut ffi::PyObject, Entries)>> {
    let copy = ffi::PyDict_Copy(skeleton);
    if copy.is_null() {
        return Err(PyErr::fetch(py));
    }
    let keys = (*copy.cast::<DictObject>()).ma_keys;
    let plain = (*copy.cast::<DictObject>()).ma_values.is_null();
    if !plain || (*keys).dk_kind != DICT_KEYS_UNICODE || (*keys).dk_nentries != n as ffi::Py_ssize_t {
        ffi::Py_DECREF(copy);
        return Ok(None);
    }
    let entries = std::ptr::addr_of!((*keys).dk_indices).cast::<u8>().add(1usize << (*keys).dk_log2_index_bytes);
    Ok(Some((copy, Entries(entries.cast_mut().cast()))))
}

/// The entries of a dict copied by `copy_skeleton`, which nothing else has seen yet.
pub struct Entries(*mut UnicodeEntry);

/// Put `value` (a new reference, stolen) in entry `i` of `dict`, in place of its None, and let the
/// garbage collector track the dict once it holds a container (what `PyDict_SetItem` would do).
#[inline]
pub unsafe fn set_value(dict: *mut ffi::PyObject, entries: &Entries, i: usize, value: *mut ffi::PyObject) {
    let entry = entries.0.add(i);
    let old = (*entry).value;
    (*entry).value = value;
    ffi::Py_DECREF(old);
    // A GC type (tracking a dict that would not need it, for a type object that is not collected, is
    // harmless), checked on the flag rather than through `PyObject_IS_GC`, a call.
    if ffi::PyType_HasFeature(ffi::Py_TYPE(value), ffi::Py_TPFLAGS_HAVE_GC) != 0
        && ffi::PyObject_GC_IsTracked(dict) == 0
    {
        ffi::PyObject_GC_Track(dict.cast());
    }
}
