//! The few CPython macros the hot path uses, spelled for the build at hand: the direct ones (struct field
//! reads, no calls) by default, their stable-ABI functions under the `abi3` feature, whose wheel loads on
//! every CPython from 3.11 on. Only this file and the probe in `dict.rs` know the difference.
//!
//! SAFETY (every function): the caller passes live objects of the named exact type and indices in range,
//! as the macros require.
#![allow(clippy::missing_safety_doc)]

use pyo3::ffi;

#[inline(always)]
pub unsafe fn list_size(list: *mut ffi::PyObject) -> ffi::Py_ssize_t {
    #[cfg(not(feature = "abi3"))]
    return ffi::PyList_GET_SIZE(list);
    #[cfg(feature = "abi3")]
    return ffi::PyList_Size(list);
}

/// A borrowed item.
#[inline(always)]
pub unsafe fn list_get(list: *mut ffi::PyObject, i: ffi::Py_ssize_t) -> *mut ffi::PyObject {
    #[cfg(not(feature = "abi3"))]
    return ffi::PyList_GET_ITEM(list, i);
    #[cfg(feature = "abi3")]
    return ffi::PyList_GetItem(list, i);
}

/// Fill an empty slot of a new list with a new reference (stolen).
#[inline(always)]
pub unsafe fn list_set(list: *mut ffi::PyObject, i: ffi::Py_ssize_t, item: *mut ffi::PyObject) {
    #[cfg(not(feature = "abi3"))]
    ffi::PyList_SET_ITEM(list, i, item);
    #[cfg(feature = "abi3")]
    ffi::PyList_SetItem(list, i, item); // cannot fail: an exact list and an index in range
}

#[inline(always)]
pub unsafe fn tuple_size(tuple: *mut ffi::PyObject) -> ffi::Py_ssize_t {
    #[cfg(not(feature = "abi3"))]
    return ffi::PyTuple_GET_SIZE(tuple);
    #[cfg(feature = "abi3")]
    return ffi::PyTuple_Size(tuple);
}

/// A borrowed item.
#[inline(always)]
pub unsafe fn tuple_get(tuple: *mut ffi::PyObject, i: ffi::Py_ssize_t) -> *mut ffi::PyObject {
    #[cfg(not(feature = "abi3"))]
    return ffi::PyTuple_GET_ITEM(tuple, i);
    #[cfg(feature = "abi3")]
    return ffi::PyTuple_GetItem(tuple, i);
}

#[inline(always)]
pub unsafe fn float_value(float: *mut ffi::PyObject) -> f64 {
    #[cfg(not(feature = "abi3"))]
    return ffi::PyFloat_AS_DOUBLE(float);
    #[cfg(feature = "abi3")]
    return ffi::PyFloat_AsDouble(float);
}

/// A new dict with room for `n` items (a new reference, or null with an error set).
#[inline(always)]
pub unsafe fn dict_with_capacity(n: ffi::Py_ssize_t) -> *mut ffi::PyObject {
    #[cfg(not(feature = "abi3"))]
    return ffi::_PyDict_NewPresized(n);
    #[cfg(feature = "abi3")]
    {
        let _ = n;
        ffi::PyDict_New()
    }
}

/// Whether an exact str is compact ASCII, whose text the ASCII fast paths copy as bytes (never, with
/// `abi3`: the layout is not part of the stable ABI, so those strings take the general path).
#[inline(always)]
pub unsafe fn is_compact_ascii(text: *mut ffi::PyObject) -> bool {
    #[cfg(not(feature = "abi3"))]
    return ffi::PyUnicode_IS_COMPACT_ASCII(text) != 0;
    #[cfg(feature = "abi3")]
    {
        let _ = text;
        false
    }
}

/// The length in characters of an exact str.
#[inline(always)]
pub unsafe fn text_len(text: *mut ffi::PyObject) -> ffi::Py_ssize_t {
    #[cfg(not(feature = "abi3"))]
    return ffi::PyUnicode_GET_LENGTH(text);
    #[cfg(feature = "abi3")]
    return ffi::PyUnicode_GetLength(text);
}

/// The bytes of a compact ASCII str (one a character); only called where `is_compact_ascii` holds.
#[inline(always)]
pub unsafe fn ascii_bytes(text: *mut ffi::PyObject) -> *const u8 {
    #[cfg(not(feature = "abi3"))]
    return ffi::PyUnicode_1BYTE_DATA(text).cast_const();
    #[cfg(feature = "abi3")]
    {
        let mut size = 0;
        ffi::PyUnicode_AsUTF8AndSize(text, &mut size).cast()
    }
}

/// A str of `len` ASCII characters written by `fill` into its buffer (`len` bytes): a new reference, or
/// null with an error set.
#[inline(always)]
pub unsafe fn ascii_text(len: usize, fill: impl FnOnce(*mut u8)) -> *mut ffi::PyObject {
    #[cfg(not(feature = "abi3"))]
    {
        let text = ffi::PyUnicode_New(len as ffi::Py_ssize_t, 127);
        if !text.is_null() {
            fill(ffi::PyUnicode_1BYTE_DATA(text));
        }
        text
    }
    #[cfg(feature = "abi3")]
    {
        let mut buf = vec![0u8; len];
        fill(buf.as_mut_ptr());
        ffi::PyUnicode_FromStringAndSize(buf.as_ptr().cast(), len as ffi::Py_ssize_t)
    }
}

/// At least the UTF-8 size in bytes of a str: its length times the widest UTF-8 encoding of its kind (the
/// kind is read from the object by default; with `abi3`, the exact size of its cached UTF-8 form).
#[inline(always)]
pub unsafe fn text_utf8_bound(text: *mut ffi::PyObject) -> usize {
    #[cfg(not(feature = "abi3"))]
    {
        let n = ffi::PyUnicode_GET_LENGTH(text) as usize;
        let width = if ffi::PyUnicode_IS_ASCII(text) != 0 {
            1
        } else {
            match ffi::PyUnicode_KIND(text) {
                ffi::PyUnicode_1BYTE_KIND => 2,
                ffi::PyUnicode_2BYTE_KIND => 3,
                _ => 4,
            }
        };
        n.saturating_mul(width)
    }
    #[cfg(feature = "abi3")]
    {
        let mut size = 0;
        if ffi::PyUnicode_AsUTF8AndSize(text, &mut size).is_null() {
            ffi::PyErr_Clear(); // a lone surrogate: no UTF-8 form, so the widest bound
            return (ffi::PyUnicode_GetLength(text) as usize).saturating_mul(4);
        }
        size as usize
    }
}

/// Both representations (see `measure::measure_wire`) of a str's characters, quotes excluded: ASCII and
/// UTF-8 text by `bytes`, anything else character by character through `char`.
pub unsafe fn text_wire(text: *mut ffi::PyObject, bytes: fn(&[u8]) -> usize, char: fn(u32) -> usize) -> usize {
    let n = text_len(text) as usize;
    #[cfg(not(feature = "abi3"))]
    {
        if ffi::PyUnicode_IS_ASCII(text) != 0 {
            return bytes(std::slice::from_raw_parts(ffi::PyUnicode_1BYTE_DATA(text), n));
        }
        match ffi::PyUnicode_KIND(text) {
            ffi::PyUnicode_1BYTE_KIND => {
                std::slice::from_raw_parts(ffi::PyUnicode_1BYTE_DATA(text), n).iter().map(|&c| char(c.into())).sum()
            }
            ffi::PyUnicode_2BYTE_KIND => {
                std::slice::from_raw_parts(ffi::PyUnicode_2BYTE_DATA(text), n).iter().map(|&c| char(c.into())).sum()
            }
            _ => std::slice::from_raw_parts(ffi::PyUnicode_4BYTE_DATA(text), n).iter().map(|&c| char(c)).sum(),
        }
    }
    #[cfg(feature = "abi3")]
    {
        let _ = char;
        let mut size = 0;
        let data = ffi::PyUnicode_AsUTF8AndSize(text, &mut size);
        if data.is_null() {
            ffi::PyErr_Clear(); // a lone surrogate: no UTF-8 form (nor any JSON), so the widest bound
            return n.saturating_mul(26);
        }
        bytes(std::slice::from_raw_parts(data.cast(), size as usize))
    }
}

/// At least the number of characters an int takes as JSON (its sign included).
pub unsafe fn int_digits_bound(int: *mut ffi::PyObject) -> usize {
    let mut overflow = 0;
    ffi::PyLong_AsLongLongAndOverflow(int, &mut overflow);
    if overflow == 0 {
        return 20;
    }
    #[cfg(not(feature = "abi3"))]
    {
        // log10(2) < 0.30103: bits * 30103 / 100000 + 1 digits at most, plus a sign.
        let bits = ffi::_PyLong_NumBits(int);
        if bits == usize::MAX {
            ffi::PyErr_Clear();
            return usize::MAX / 4;
        }
        bits / 100_000 * 30_103 + (bits % 100_000) * 30_103 / 100_000 + 2
    }
    #[cfg(feature = "abi3")]
    {
        // The stable ABI has no bit count but `int.bit_length()`, which runs no Python code of anyone's.
        let bits = ffi::PyObject_CallMethod(int, c"bit_length".as_ptr(), std::ptr::null());
        if bits.is_null() {
            ffi::PyErr_Clear();
            return usize::MAX / 4;
        }
        let n = ffi::PyLong_AsSsize_t(bits) as usize;
        ffi::Py_DecRef(bits);
        n / 100_000 * 30_103 + (n % 100_000) * 30_103 / 100_000 + 2
    }
}
