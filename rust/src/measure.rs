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
    let mut walk = Walk { found: Measure::default(), max_bytes, max_depth: max_depth.min(MAX_WALK_DEPTH), wire: false };
    walk.value(ptr, 0);
    walk.found
}

/// Measure `ptr` as an MCP result carries a structured answer: its compact JSON text with every escape
/// counted, plus that text again written as a JSON string (the text block repeating the structured
/// content), so `bytes` bounds both representations together from above. Strings are scanned for the
/// characters JSON escapes; a string whose smallest possible size already passes `max_bytes` is not
/// scanned, so the walk still costs at most what the limits allow.
///
/// # Safety
/// As for [`measure`].
pub unsafe fn measure_wire(ptr: *mut ffi::PyObject, max_bytes: usize, max_depth: u32) -> Measure {
    let mut walk = Walk { found: Measure::default(), max_bytes, max_depth: max_depth.min(MAX_WALK_DEPTH), wire: true };
    walk.value(ptr, 0);
    walk.found
}

struct Walk {
    found: Measure,
    max_bytes: usize,
    max_depth: u32,
    /// Both representations, escapes counted (see [`measure_wire`]): every byte of punctuation counts twice.
    wire: bool,
}

/// What one ASCII character costs in both representations: itself in the JSON text and again in that
/// text written as a JSON string. `"` and `\` are `\"` (2) then `\\\"` (4); `\n` and its kin 2 then 3;
/// other control characters `\u00XX` (6) then `\\u00XX` (7); anything else 1 and 1.
const fn ascii_wire(b: u8) -> usize {
    match b {
        b'"' | b'\\' => 6,
        8 | 9 | 10 | 12 | 13 => 5,
        0..=31 => 13,
        _ => 2,
    }
}

#[inline]
fn special(b: u8) -> bool {
    b < 0x20 || b == b'"' || b == b'\\'
}

/// Both representations of UTF-8 (or ASCII) text, without its quotes.
fn utf8_wire(bytes: &[u8]) -> usize {
    let plain = bytes.iter().filter(|&&b| special(b)).count() == 0;
    if plain {
        return bytes.len() * 2;
    }
    bytes.iter().map(|&b| if b < 0x80 { ascii_wire(b) } else { 2 }).sum()
}

/// Both representations of a character given by its code point (UTF-8 written raw, as orjson and the
/// SDK's encoder do).
#[inline]
fn char_wire(c: u32) -> usize {
    if c < 0x80 {
        ascii_wire(c as u8)
    } else if c < 0x800 {
        4
    } else if c < 0x10000 {
        6
    } else {
        8
    }
}

impl Walk {
    #[inline]
    fn over(&self) -> bool {
        self.found.bytes > self.max_bytes || self.found.depth > self.max_depth
    }

    unsafe fn value(&mut self, ptr: *mut ffi::PyObject, level: u32) {
        if self.wire {
            return self.wire_value(ptr, level);
        }
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

    /// [`Self::value`] for [`measure_wire`]: punctuation and numbers count twice, strings are scanned.
    unsafe fn wire_value(&mut self, ptr: *mut ffi::PyObject, level: u32) {
        if ffi::PyUnicode_Check(ptr) != 0 {
            let size = self.wire_text(ptr);
            self.found.bytes = self.found.bytes.saturating_add(size);
        } else if ffi::PyDict_Check(ptr) != 0 {
            if !self.open(level) {
                return;
            }
            self.found.bytes = self.found.bytes.saturating_add(2); // `{}` again, in the text
            let (mut pos, mut key, mut item) = (0, std::ptr::null_mut(), std::ptr::null_mut());
            while ffi::PyDict_Next(ptr, &mut pos, &mut key, &mut item) != 0 {
                self.wire_value(key, level + 1);
                self.wire_value(item, level + 1);
                self.found.bytes = self.found.bytes.saturating_add(4);
                if self.over() {
                    return;
                }
            }
        } else if ffi::PyList_Check(ptr) != 0 || ffi::PyTuple_Check(ptr) != 0 {
            if !self.open(level) {
                return;
            }
            self.found.bytes = self.found.bytes.saturating_add(2);
            let list = ffi::PyList_Check(ptr) != 0;
            let mut i = 0;
            while i < if list { capi::list_size(ptr) } else { capi::tuple_size(ptr) } {
                let item = if list { capi::list_get(ptr, i) } else { capi::tuple_get(ptr, i) };
                self.wire_value(item, level + 1);
                self.found.bytes = self.found.bytes.saturating_add(2);
                if self.over() {
                    return;
                }
                i += 1;
            }
        } else if ffi::PyLong_Check(ptr) != 0 {
            let digits = capi::int_digits_bound(ptr);
            self.found.bytes = self.found.bytes.saturating_add(digits.saturating_mul(2));
        } else if ffi::PyFloat_Check(ptr) != 0 {
            self.found.bytes = self.found.bytes.saturating_add(48);
        } else {
            self.found.bytes = self.found.bytes.saturating_add(10);
        }
    }

    /// Both representations of a str, quotes included: scanned only when it may still fit.
    unsafe fn wire_text(&self, ptr: *mut ffi::PyObject) -> usize {
        let n = capi::text_len(ptr) as usize;
        // Each character is at least one byte in each representation, and the quotes are `"` then `\"`.
        let least = n.saturating_mul(2).saturating_add(6);
        if self.found.bytes.saturating_add(least) > self.max_bytes {
            return least;
        }
        6 + capi::text_wire(ptr, utf8_wire, char_wire)
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
