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
