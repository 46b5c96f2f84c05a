//! How big a value is as JSON text and how deeply it nests, measured without building anything, so an
//! outsized or too deeply nested value is refused before it is copied, joined or encoded.

use pyo3::ffi;

use crate::capi;

/// The deepest the walk goes whatever the caller asks (the Rust stack stays small below this).
const MAX_WALK_DEPTH: u32 = 10_000;

/// What [`measure`] found: `bytes` estimates the compact JSON text from above (UTF-8 at its widest for
/// the string's storage kind; escapes not counted), `depth` counts nested containers (`1` is 0, `[1]` 1).
#[derive(Clone, Copy, Debug, Default)]
pub struct Measure {
    pub bytes: usize,
    pub depth: u32,
}

/// Measure `ptr`, stopping as soon as the size passes `max_bytes` or the depth passes `max_depth`: the
/// cost is bounded by the limits, not by the value (the answer is then only known to be over).
///
/// # Safety
/// `ptr` must be a live Python object; the walk runs no Python code, so nothing changes under it.
pub unsafe fn measure(ptr: *mut ffi::PyObject, max_bytes: usize, max_depth: u32) -> Measure {
    let mut walk = Walk { found: Measure::default(), max_bytes, max_depth: max_depth.min(MAX_WALK_DEPTH) };
    walk.value(ptr, 0);
    walk.found
}

struct Walk {
    found: Measure,
    max_bytes: usize,
    max_depth: u32,
}

impl Walk {
    #[inline]
    fn over(&self) -> bool {
        self.found.bytes > self.max_bytes || self.found.depth > self.max_depth
    }

    unsafe fn value(&mut self, ptr: *mut ffi::PyObject, level: u32) {
        let found = &mut self.found;
        if ffi::PyUnicode_Check(ptr) != 0 {
            found.bytes = found.bytes.saturating_add(capi::text_utf8_bound(ptr).saturating_add(2));
        } else if ffi::PyDict_Check(ptr) != 0 {
            if !self.open(level) {
                return;
            }
            let (mut pos, mut key, mut item) = (0, std::ptr::null_mut(), std::ptr::null_mut());
            while ffi::PyDict_Next(ptr, &mut pos, &mut key, &mut item) != 0 {
                self.value(key, level + 1);
                self.value(item, level + 1);
                self.found.bytes = self.found.bytes.saturating_add(2); // `:` and `,`
                if self.over() {
                    return;
                }
            }
        } else if ffi::PyList_Check(ptr) != 0 || ffi::PyTuple_Check(ptr) != 0 {
            if !self.open(level) {
                return;
            }
            let list = ffi::PyList_Check(ptr) != 0;
            let mut i = 0;
            // A list's length is read on every round: the walk runs no Python code, but stays in bounds.
            while i < if list { capi::list_size(ptr) } else { capi::tuple_size(ptr) } {
                let item = if list { capi::list_get(ptr, i) } else { capi::tuple_get(ptr, i) };
                self.value(item, level + 1);
                self.found.bytes = self.found.bytes.saturating_add(1);
                if self.over() {
                    return;
                }
                i += 1;
            }
        } else if ffi::PyLong_Check(ptr) != 0 {
            found.bytes = found.bytes.saturating_add(20);
        } else if ffi::PyFloat_Check(ptr) != 0 {
            found.bytes = found.bytes.saturating_add(24);
        } else {
            found.bytes = found.bytes.saturating_add(5); // true, false, null; foreign values guessed small
        }
    }

    /// Enter a container at `level`: false when that is already too deep.
    #[inline]
    fn open(&mut self, level: u32) -> bool {
        let depth = level + 1;
        if depth > self.found.depth {
            self.found.depth = depth;
        }
        self.found.bytes = self.found.bytes.saturating_add(2);
        depth <= self.max_depth && !self.over()
    }
}
