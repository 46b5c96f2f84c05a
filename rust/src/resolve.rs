//! Walk a plan against an environment and build a fresh result.
//!
//! Exact `dict`/`list`/`tuple`/`str`/`int`/`float`/`bool`/`None` are handled by pointer and type checks
//! on the C API; subclasses and foreign types go through the Python protocol (out of line), so the
//! result is always what the oracle's `isinstance`-based code gives.

use std::cell::Cell;
use std::fmt::Write;
use std::ptr::addr_of_mut;

use pyo3::exceptions::{PyMemoryError, PyRecursionError};
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};

use crate::capi;
use crate::dict::{self, Probe};
use crate::errors::{Found, ResolveError};
use crate::measure::measure;
use crate::path::ArrayIndex;
use crate::plan::{Node, ObjectNode, Part, Plan, PrefixNode, Reference, Step, TextNode, NO_ENCODING, NO_PARENT};
use crate::text::{url_component, url_component_len, write_json_string};

/// Containers nested deeper than this are not copied: a deeper (or cyclic) value raises RecursionError,
/// as the recursive copy in Python would.
const MAX_COPY_DEPTH: u32 = 1000;
/// Values nested deeper than this are stringified by Python's `json` (which detects cycles).
const MAX_JSON_DEPTH: u32 = 128;

thread_local! {
    /// The text buffer reused from one resolve to the next (taken, so a nested resolve gets a new one).
    static TEXT_BUFFER: Cell<String> = const { Cell::new(String::new()) };
}

/// The largest text buffer kept for reuse between resolves.
const KEEP_TEXT_BUFFER: usize = 1 << 20;

/// Prefix tables up to this size live on the stack.
const INLINE_PREFIXES: usize = 8;

/// One resolve: the environment, and the values of the plan's shared path prefixes.
pub struct Resolver<'a, 'py> {
    py: Python<'py>,
    env: &'a Bound<'py, PyAny>,
    /// Strong references, one slot per prefix node (null: no plain hit), in `inline` for small tables;
    /// `len` is 0 when the plan shares no prefix or the environment is not an exact dict.
    inline: [*mut ffi::PyObject; INLINE_PREFIXES],
    heap: Vec<*mut ffi::PyObject>,
    len: usize,
    /// The plan's bound on what one resolve produces, in bytes of JSON: interpolated texts and the values
    /// typed references copy, together; and what they have taken so far.
    max_text: usize,
    spent: usize,
}

impl<'a, 'py> Resolver<'a, 'py> {
    #[inline]
    pub fn new(plan: &'a Plan, env: &'a Bound<'py, PyAny>) -> Self {
        let mut resolver = Resolver {
            py: env.py(),
            env,
            inline: [std::ptr::null_mut(); INLINE_PREFIXES],
            heap: Vec::new(),
            len: 0,
            max_text: plan.max_text,
            spent: 0,
        };
        // SAFETY: a type check on a live object.
        if !plan.prefixes.is_empty() && unsafe { ffi::PyDict_CheckExact(env.as_ptr()) } != 0 {
            if plan.prefixes.len() > INLINE_PREFIXES {
                resolver.heap = vec![std::ptr::null_mut(); plan.prefixes.len()];
            }
            // SAFETY: `env` is a live exact dict.
            unsafe { resolver.find_prefixes(&plan.prefixes) };
        }
        resolver
    }

    #[inline(always)]
    fn slots(&mut self) -> &mut [*mut ffi::PyObject] {
        if self.heap.is_empty() {
            &mut self.inline[..self.len]
        } else {
            &mut self.heap[..self.len]
        }
    }

    /// The value of prefix node `i`, or null when it is not a plain hit (or there is no table).
    #[inline(always)]
    fn prefix(&self, i: u32) -> *mut ffi::PyObject {
        let i = i as usize;
        if i >= self.len {
            return std::ptr::null_mut();
        }
        // SAFETY: `i` is in bounds of the filled slots.
        unsafe {
            if self.heap.is_empty() {
                *self.inline.get_unchecked(i)
            } else {
                *self.heap.get_unchecked(i)
            }
        }
    }

    /// Look every prefix up once, parents first (the table lists a parent before its children). Every
    /// reference of a plan is followed on every resolve, so this does no lookup that would not happen
    /// anyway. A slot stays null when a step is not a plain hit on an exact dict, list or tuple: the
    /// references under it walk their whole path, which handles (and reports) everything else.
    unsafe fn find_prefixes(&mut self, prefixes: &[PrefixNode]) {
        let env = self.env.as_ptr();
        self.len = prefixes.len();
        let slots = self.slots();
        for (i, node) in prefixes.iter().enumerate() {
            // SAFETY (index): the table lists a parent before its children, so its slot is filled.
            let parent = if node.parent == NO_PARENT { env } else { *slots.get_unchecked(node.parent as usize) };
            let item = if parent.is_null() {
                parent
            } else if ffi::PyDict_CheckExact(parent) != 0 {
                let item = dict::get_item(parent, node.key.as_ptr());
                if item.is_null() {
                    ffi::PyErr_Clear();
                }
                item
            } else if ffi::PyList_CheckExact(parent) != 0 {
                match array_position(node.index, capi::list_size(parent)) {
                    Some(k) => capi::list_get(parent, k),
                    None => std::ptr::null_mut(),
                }
            } else if ffi::PyTuple_CheckExact(parent) != 0 {
                match array_position(node.index, capi::tuple_size(parent)) {
                    Some(k) => capi::tuple_get(parent, k),
                    None => std::ptr::null_mut(),
                }
            } else {
                std::ptr::null_mut()
            };
            if !item.is_null() {
                ffi::Py_INCREF(item);
            }
            *slots.get_unchecked_mut(i) = item;
        }
    }
}

impl Drop for Resolver<'_, '_> {
    #[inline]
    fn drop(&mut self) {
        for &item in self.slots().iter() {
            if !item.is_null() {
                // SAFETY: each non-null slot holds one strong reference, taken in `find_prefixes`.
                unsafe { ffi::Py_DECREF(item) };
            }
        }
    }
}

/// Resolve `node` into a new value that shares no container with the plan or the environment.
pub fn resolve<'py>(r: &mut Resolver<'_, 'py>, node: &Node) -> PyResult<Bound<'py, PyAny>> {
    match node {
        Node::Atom(value) => Ok(value.bind(r.py).clone()),
        Node::Container(value) => deep_copy(value.bind(r.py).clone(), 0),
        Node::Reference(reference) => copy_bounded(r, reference),
        Node::Text(text) => interpolate(r, text),
        Node::Object(object) => resolve_object(r, object),
        Node::Array(items) => resolve_array(r, items),
    }
}

fn resolve_object<'py>(r: &mut Resolver<'_, 'py>, node: &ObjectNode) -> PyResult<Bound<'py, PyAny>> {
    let py = r.py;
    if let Some(skeleton) = &node.skeleton {
        // SAFETY: the copy is ours alone until returned; `set_value` fills each entry once, in order, with
        // a new reference; a copy dropped half-filled holds None in the entries not yet filled.
        unsafe {
            if let Some((copy, entries)) = dict::copy_skeleton(py, skeleton.as_ptr(), node.values.len())? {
                let copy = Bound::from_owned_ptr(py, copy);
                for (i, value) in node.values.iter().enumerate() {
                    let value = resolve(r, value)?;
                    dict::set_value(copy.as_ptr(), &entries, i, value.into_ptr());
                }
                return Ok(copy);
            }
        }
    }
    // SAFETY: the new dict is ours; PyDict_SetItem borrows key and value and reports failure by -1.
    unsafe {
        let dict = Bound::from_owned_ptr_or_err(py, capi::dict_with_capacity(node.keys.len() as ffi::Py_ssize_t))?;
        for (key, value) in node.keys.iter().zip(node.values.iter()) {
            let value = resolve(r, value)?;
            if ffi::PyDict_SetItem(dict.as_ptr(), key.as_ptr(), value.as_ptr()) != 0 {
                return Err(PyErr::fetch(py));
            }
        }
        Ok(dict)
    }
}

fn resolve_array<'py>(r: &mut Resolver<'_, 'py>, items: &[Node]) -> PyResult<Bound<'py, PyAny>> {
    let py = r.py;
    // SAFETY: the new list has exactly `items.len()` slots, each filled once with a new reference
    // (SET_ITEM steals it); a list dropped half-filled releases only the slots that were set.
    unsafe {
        let list = Bound::from_owned_ptr_or_err(py, ffi::PyList_New(items.len() as ffi::Py_ssize_t))?;
        for (i, item) in items.iter().enumerate() {
            let value = resolve(r, item)?;
            capi::list_set(list.as_ptr(), i as ffi::Py_ssize_t, value.into_ptr());
        }
        Ok(list)
    }
}

// --- following paths ---------------------------------------------------------------------------------

/// The value `reference` names in the environment; a deep copy when `copy`, else the value itself.
#[inline(always)]
pub fn lookup<'py>(r: &mut Resolver<'_, 'py>, reference: &Reference, copy: bool) -> PyResult<Bound<'py, PyAny>> {
    match &reference.default {
        None => follow(r, reference, copy),
        Some(default) => follow_or(r, reference, copy, default),
    }
}

/// A reference with a default: the default when the path cannot be followed or ends at null.
#[inline(never)]
fn follow_or<'py>(
    r: &mut Resolver<'_, 'py>,
    reference: &Reference,
    copy: bool,
    default: &Py<PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = r.py;
    match follow(r, reference, copy) {
        Ok(value) if !value.is_none() => Ok(value),
        Err(err) if !crate::errors::is_missing(py, &err) => Err(err),
        _ if copy => deep_copy(default.bind(py).clone(), 0),
        _ => Ok(default.bind(py).clone()),
    }
}

#[inline(always)]
fn follow<'py>(r: &mut Resolver<'_, 'py>, reference: &Reference, copy: bool) -> PyResult<Bound<'py, PyAny>> {
    let (py, env) = (r.py, r.env);
    let value = r.prefix(reference.prefix);
    if !value.is_null() {
        // The table holds a strong reference to the prefix value until the resolve ends.
        return walk(py, reference, reference.prefix_len, value, copy);
    }
    // SAFETY: `env` is alive for the call, and so is the borrowed root item for the walk (which runs no
    // Python code before it holds what it reads).
    unsafe {
        if ffi::PyDict_CheckExact(env.as_ptr()) != 0 {
            let root = dict::get_item(env.as_ptr(), reference.root_key.as_ptr());
            if root.is_null() {
                return Err(fetch_or(py, || missing_root(reference, env)));
            }
            return walk(py, reference, 0, root, copy);
        }
    }
    let root = root_slow(reference, env)?;
    walk(py, reference, 0, root.as_ptr(), copy)
}

#[inline(never)]
fn root_slow<'py>(reference: &Reference, env: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let key = reference.root_key.bind(env.py());
    if !env.contains(key)? {
        return Err(missing_root(reference, env));
    }
    env.get_item(key)
}

/// Follow `reference.steps[from..]` from `start` (borrowed: the caller keeps it alive).
#[inline]
fn walk<'py>(
    py: Python<'py>,
    reference: &Reference,
    from: usize,
    start: *mut ffi::PyObject,
    copy: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let mut cur = start;
    // SAFETY: plain hits on exact str-keyed dicts, lists and tuples run no Python code, so each borrowed
    // item stays alive as long as `start` does; list and tuple reads are bounds-checked by
    // `array_position`; anything else goes on in `walk_slow` from a strong reference.
    unsafe {
        for (i, step) in reference.steps.iter().enumerate().skip(from) {
            let Step::Key { key, index } = step else {
                return walk_slow(py, reference, i, Bound::from_borrowed_ptr(py, cur), copy);
            };
            let item = if ffi::PyDict_CheckExact(cur) != 0 {
                match dict::probe_str_table(cur, key.as_ptr()) {
                    Probe::Hit(item) => item,
                    Probe::Miss => return Err(missing(reference, i, &Bound::from_borrowed_ptr(py, cur))),
                    Probe::Unknown => return walk_slow(py, reference, i, Bound::from_borrowed_ptr(py, cur), copy),
                }
            } else if ffi::PyList_CheckExact(cur) != 0 {
                match array_position(*index, capi::list_size(cur)) {
                    Some(k) => capi::list_get(cur, k),
                    None => return Err(missing(reference, i, &Bound::from_borrowed_ptr(py, cur))),
                }
            } else if ffi::PyTuple_CheckExact(cur) != 0 {
                match array_position(*index, capi::tuple_size(cur)) {
                    Some(k) => capi::tuple_get(cur, k),
                    None => return Err(missing(reference, i, &Bound::from_borrowed_ptr(py, cur))),
                }
            } else {
                return walk_slow(py, reference, i, Bound::from_borrowed_ptr(py, cur), copy);
            };
            cur = item;
        }
        let value = Bound::from_borrowed_ptr(py, cur);
        if copy && is_container(cur) {
            deep_copy(value, 0)
        } else {
            Ok(value)
        }
    }
}

/// Follow `reference.steps[from..]` from `value`, whatever the containers: stars, tables the probe
/// does not read (through `PyDict_GetItemWithError`, holding each container), subclasses.
#[inline(never)]
fn walk_slow<'py>(
    py: Python<'py>,
    reference: &Reference,
    from: usize,
    mut value: Bound<'py, PyAny>,
    copy: bool,
) -> PyResult<Bound<'py, PyAny>> {
    for (i, step) in reference.steps.iter().enumerate().skip(from) {
        let (key, index) = match step {
            Step::Star => return star(py, reference, i, value, copy),
            Step::Key { key, index } => (key, *index),
        };
        let ptr = value.as_ptr();
        // SAFETY: `ptr` is kept alive by `value`; list and tuple reads are bounds-checked by
        // `array_position`; every borrowed item is increfed (from_borrowed_ptr) before `value` is replaced.
        unsafe {
            let item = if ffi::PyDict_CheckExact(ptr) != 0 {
                let item = dict::get_item(ptr, key.as_ptr());
                if item.is_null() {
                    return Err(fetch_or(py, || missing(reference, i, &value)));
                }
                item
            } else if ffi::PyList_CheckExact(ptr) != 0 {
                match array_position(index, capi::list_size(ptr)) {
                    Some(k) => capi::list_get(ptr, k),
                    None => return Err(missing(reference, i, &value)),
                }
            } else if ffi::PyTuple_CheckExact(ptr) != 0 {
                match array_position(index, capi::tuple_size(ptr)) {
                    Some(k) => capi::tuple_get(ptr, k),
                    None => return Err(missing(reference, i, &value)),
                }
            } else {
                value = step_slow(reference, i, &value)?;
                continue;
            };
            value = Bound::from_borrowed_ptr(py, item);
        }
    }
    if copy {
        deep_copy(value, 0)
    } else {
        Ok(value)
    }
}

#[inline]
fn array_position(index: ArrayIndex, len: ffi::Py_ssize_t) -> Option<ffi::Py_ssize_t> {
    let ArrayIndex::At(k) = index else { return None };
    let k = if k < 0 { k + len as i64 } else { k };
    (0..len as i64).contains(&k).then_some(k as ffi::Py_ssize_t)
}

/// One key/index step on anything but an exact dict, list or tuple: subclasses through their own
/// methods (`in`, `[]`, `len`), like the oracle; anything else has no members.
#[inline(never)]
fn step_slow<'py>(reference: &Reference, i: usize, value: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let Step::Key { key, index } = &reference.steps[i] else { unreachable!("stars are handled by walk") };
    let key = key.bind(value.py());
    if value.is_instance_of::<PyDict>() {
        if value.contains(key)? {
            return value.get_item(key);
        }
    } else if value.is_instance_of::<PyList>() || value.is_instance_of::<PyTuple>() {
        if let ArrayIndex::At(k) = *index {
            let len = value.len()? as i64;
            if -len <= k && k < len {
                return value.get_item(k);
            }
        }
    }
    Err(missing(reference, i, value))
}

/// `*`: the rest of the path over every element of an array or every value of an object, as a list.
fn star<'py>(
    py: Python<'py>,
    reference: &Reference,
    i: usize,
    value: Bound<'py, PyAny>,
    copy: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let ptr = value.as_ptr();
    // SAFETY: each call returns a new reference or NULL with an error set.
    let elements = unsafe {
        if ffi::PyDict_CheckExact(ptr) != 0 {
            Bound::from_owned_ptr_or_err(py, ffi::PyDict_Values(ptr))?
        } else if ffi::PyList_CheckExact(ptr) != 0 || ffi::PyTuple_CheckExact(ptr) != 0 {
            Bound::from_owned_ptr_or_err(py, ffi::PySequence_List(ptr))?
        } else if value.is_instance_of::<PyDict>() {
            let values = value.call_method0(intern!(py, "values"))?;
            Bound::from_owned_ptr_or_err(py, ffi::PySequence_List(values.as_ptr()))?
        } else if value.is_instance_of::<PyList>() || value.is_instance_of::<PyTuple>() {
            Bound::from_owned_ptr_or_err(py, ffi::PySequence_List(ptr))?
        } else {
            return Err(missing(reference, i, &value));
        }
    };
    let elements = elements.cast_into::<PyList>()?;
    let n = elements.len();
    // SAFETY: `out` has `n` slots, each set once with a new reference; `elements` is our own list, so
    // its length cannot change while we walk.
    unsafe {
        let out = Bound::from_owned_ptr_or_err(py, ffi::PyList_New(n as ffi::Py_ssize_t))?;
        for j in 0..n {
            let element = capi::list_get(elements.as_ptr(), j as ffi::Py_ssize_t);
            let result = walk(py, reference, i + 1, element, copy)?;
            capi::list_set(out.as_ptr(), j as ffi::Py_ssize_t, result.into_ptr());
        }
        Ok(out)
    }
}

// --- errors ------------------------------------------------------------------------------------------

/// The Python error a failed C call set, or (none set: a plain miss) the error `otherwise` builds.
#[inline]
fn fetch_or(py: Python<'_>, otherwise: impl FnOnce() -> PyErr) -> PyErr {
    PyErr::take(py).unwrap_or_else(otherwise)
}

#[cold]
#[inline(never)]
fn missing(reference: &Reference, i: usize, found: &Bound<'_, PyAny>) -> PyErr {
    let segment = match reference.steps[i] {
        Step::Star => "*".to_owned(),
        Step::Key { .. } => reference.path.segments[i].shown(),
    };
    match describe(found, None) {
        Ok(found) => ResolveError::missing(reference.path.normalized(), &reference.location, segment, found).into(),
        Err(err) => err,
    }
}

#[cold]
#[inline(never)]
fn missing_root(reference: &Reference, env: &Bound<'_, PyAny>) -> PyErr {
    let root = reference.path.root.name().to_owned();
    match describe(env, Some("environment")) {
        Ok(found) => ResolveError::missing(reference.path.normalized(), &reference.location, root, found).into(),
        Err(err) => err,
    }
}

/// What an error says was found: the JSON type (or `type_name`), and a mapping's first 10 keys and
/// size or an array's length.
fn describe(found: &Bound<'_, PyAny>, type_name: Option<&str>) -> PyResult<Found> {
    static MAPPING: PyOnceLock<Py<pyo3::types::PyType>> = PyOnceLock::new();
    let py = found.py();
    let type_name = match type_name {
        Some(name) => name.to_owned(),
        None => json_type_name(found)?,
    };
    let (mut keys, mut length) = (None, None);
    if found.is_instance(MAPPING.import(py, "collections.abc", "Mapping")?)? {
        // SAFETY: PySequence_List returns a new reference or NULL with an error set.
        let all = unsafe { Bound::from_owned_ptr_or_err(py, ffi::PySequence_List(found.as_ptr()))? };
        let all = all.cast_into::<PyList>()?;
        let first: PyResult<Vec<String>> =
            all.iter().take(10).map(|k| Ok(k.str()?.to_string_lossy().into_owned())).collect();
        keys = Some(first?);
        length = Some(found.len()?);
    } else if found.is_instance_of::<PyList>() || found.is_instance_of::<PyTuple>() {
        length = Some(found.len()?);
    }
    Ok(Found { type_name, keys, length })
}

fn json_type_name(value: &Bound<'_, PyAny>) -> PyResult<String> {
    Ok(if value.is_none() {
        "null".to_owned()
    } else if value.is_instance_of::<pyo3::types::PyBool>() {
        "boolean".to_owned()
    } else if value.is_instance_of::<pyo3::types::PyInt>() || value.is_instance_of::<pyo3::types::PyFloat>() {
        "number".to_owned()
    } else if value.is_instance_of::<PyString>() {
        "string".to_owned()
    } else if value.is_instance_of::<PyDict>() {
        "object".to_owned()
    } else if value.is_instance_of::<PyList>() || value.is_instance_of::<PyTuple>() {
        "array".to_owned()
    } else {
        value.get_type().name()?.to_string()
    })
}

// --- deep copies -------------------------------------------------------------------------------------

#[inline(always)]
unsafe fn is_container(ptr: *mut ffi::PyObject) -> bool {
    let flags = ffi::Py_TPFLAGS_LIST_SUBCLASS | ffi::Py_TPFLAGS_TUPLE_SUBCLASS | ffi::Py_TPFLAGS_DICT_SUBCLASS;
    ffi::PyType_HasFeature(ffi::Py_TYPE(ptr), flags) != 0
}

/// A copy of `value` in which every dict, list and tuple (subclasses included) is a new dict or list;
/// everything else is shared.
#[inline]
pub fn deep_copy(value: Bound<'_, PyAny>, depth: u32) -> PyResult<Bound<'_, PyAny>> {
    let ptr = value.as_ptr();
    // SAFETY: `ptr` is kept alive by `value` for the whole copy.
    unsafe {
        if !is_container(ptr) {
            return Ok(value);
        }
        if depth >= MAX_COPY_DEPTH {
            return Err(too_deep());
        }
        let py = value.py();
        if ffi::PyDict_CheckExact(ptr) != 0 {
            copy_dict(py, ptr, depth)
        } else if ffi::PyList_CheckExact(ptr) != 0 {
            copy_list(py, &value, depth)
        } else if ffi::PyTuple_CheckExact(ptr) != 0 {
            copy_tuple(py, ptr, depth)
        } else {
            copy_slow(&value, depth)
        }
    }
}

/// Copy the dict in one step (same keys, same order), then replace the values that are containers.
unsafe fn copy_dict(py: Python<'_>, src: *mut ffi::PyObject, depth: u32) -> PyResult<Bound<'_, PyAny>> {
    let copy = Bound::from_owned_ptr_or_err(py, ffi::PyDict_Copy(src))?;
    let (mut pos, mut key, mut item) = (0, std::ptr::null_mut(), std::ptr::null_mut());
    // Replacing the value of an existing key keeps the key set, which PyDict_Next allows.
    while ffi::PyDict_Next(copy.as_ptr(), &mut pos, &mut key, &mut item) != 0 {
        if is_container(item) {
            let key = Bound::from_borrowed_ptr(py, key);
            let copied = deep_copy(Bound::from_borrowed_ptr(py, item), depth + 1)?;
            if ffi::PyDict_SetItem(copy.as_ptr(), key.as_ptr(), copied.as_ptr()) != 0 {
                return Err(PyErr::fetch(py));
            }
        }
    }
    Ok(copy)
}

unsafe fn copy_list<'py>(py: Python<'py>, src: &Bound<'py, PyAny>, depth: u32) -> PyResult<Bound<'py, PyAny>> {
    let ptr = src.as_ptr();
    let n = capi::list_size(ptr);
    let out = Bound::from_owned_ptr_or_err(py, ffi::PyList_New(n))?;
    for i in 0..n {
        // Copying a subclass runs Python code, which could change the list under us: then start over
        // the way Python would iterate it.
        if i >= capi::list_size(ptr) {
            return copy_slow(src, depth);
        }
        let item = capi::list_get(ptr, i);
        let copied = if is_container(item) {
            deep_copy(Bound::from_borrowed_ptr(py, item), depth + 1)?.into_ptr()
        } else {
            ffi::Py_INCREF(item);
            item
        };
        capi::list_set(out.as_ptr(), i, copied);
    }
    if capi::list_size(ptr) != n {
        return copy_slow(src, depth);
    }
    Ok(out)
}

unsafe fn copy_tuple(py: Python<'_>, src: *mut ffi::PyObject, depth: u32) -> PyResult<Bound<'_, PyAny>> {
    let n = capi::tuple_size(src);
    let out = Bound::from_owned_ptr_or_err(py, ffi::PyList_New(n))?;
    for i in 0..n {
        let item = capi::tuple_get(src, i);
        let copied = deep_copy(Bound::from_borrowed_ptr(py, item), depth + 1)?;
        capi::list_set(out.as_ptr(), i, copied.into_ptr());
    }
    Ok(out)
}

/// Subclasses of dict, list and tuple: through their own `items()` / iteration, into a plain dict or list.
#[inline(never)]
fn copy_slow<'py>(value: &Bound<'py, PyAny>, depth: u32) -> PyResult<Bound<'py, PyAny>> {
    let py = value.py();
    if value.is_instance_of::<PyDict>() {
        let out = PyDict::new(py);
        for item in value.call_method0(intern!(py, "items"))?.try_iter()? {
            let (key, item): (Bound<'py, PyAny>, Bound<'py, PyAny>) = item?.extract()?;
            out.set_item(key, deep_copy(item, depth + 1)?)?;
        }
        return Ok(out.into_any());
    }
    let items = value.try_iter()?.map(|item| deep_copy(item?, depth + 1)).collect::<PyResult<Vec<_>>>()?;
    Ok(PyList::new(py, items)?.into_any())
}

#[cold]
fn too_deep() -> PyErr {
    PyRecursionError::new_err("maximum nesting depth exceeded while copying a value")
}

// --- interpolation -----------------------------------------------------------------------------------

/// Texts with up to this many references look them all up first, then build the result in one go.
const TEXT_REFERENCES: usize = 8;

/// The values of a text's references (strong references), released when the text is built.
struct Values {
    items: [*mut ffi::PyObject; TEXT_REFERENCES],
    len: usize,
}

impl Drop for Values {
    fn drop(&mut self) {
        for &item in &self.items[..self.len] {
            // SAFETY: each item is a strong reference taken by `interpolate`.
            unsafe { ffi::Py_DECREF(item) };
        }
    }
}

fn interpolate<'py>(r: &mut Resolver<'_, 'py>, node: &TextNode) -> PyResult<Bound<'py, PyAny>> {
    if node.encode_from != NO_ENCODING {
        return interpolate_url(r, node);
    }
    if node.references > TEXT_REFERENCES {
        return interpolate_buffered(r, node, None);
    }
    let mut values = Values { items: [std::ptr::null_mut(); TEXT_REFERENCES], len: 0 };
    // The length of the result while every piece is ASCII (the literals, exact ASCII strs, None).
    let mut ascii_len = node.literal_ascii.then_some(node.literal_len);
    for part in node.parts.iter() {
        if let Part::Reference(reference) = part {
            let value = lookup(r, reference, false)?.into_ptr();
            values.items[values.len] = value;
            values.len += 1;
            // SAFETY: `value` is alive (held by `values`) and only read.
            unsafe {
                if let Some(len) = ascii_len.as_mut() {
                    if ffi::PyUnicode_CheckExact(value) != 0 && capi::is_compact_ascii(value) {
                        *len += capi::text_len(value) as usize;
                    } else if let Some(n) = small_int(value) {
                        *len += decimal_len(n);
                    } else if value != ffi::Py_None() {
                        ascii_len = None;
                    }
                }
            }
        }
    }
    match ascii_len {
        Some(len) => {
            let total = r.spent.saturating_add(len);
            if total > r.max_text {
                return Err(text_too_large(node, total, r.max_text));
            }
            r.spent = total;
            // SAFETY: every piece is ASCII and `len` is their total length.
            unsafe { join_ascii(r.py, node, &values.items[..values.len], len) }
        }
        None => interpolate_buffered(r, node, Some(&values.items[..values.len])),
    }
}

/// The text of `node` when the literals and the values (exact compact ASCII strs or None) are all ASCII,
/// `len` characters in all: copied straight into a new `str`.
unsafe fn join_ascii<'py>(
    py: Python<'py>,
    node: &TextNode,
    values: &[*mut ffi::PyObject],
    len: usize,
) -> PyResult<Bound<'py, PyAny>> {
    let text = capi::ascii_text(len, |mut out| {
        let mut values = values.iter();
        for part in node.parts.iter() {
            let (data, n) = match part {
                Part::Literal(literal) => (literal.as_ptr(), literal.len()),
                Part::Reference(_) => {
                    let value = *values.next().unwrap_or(&std::ptr::null_mut());
                    if value.is_null() || value == ffi::Py_None() {
                        continue;
                    }
                    if let Some(n) = small_int(value) {
                        out = write_decimal(out, n);
                        continue;
                    }
                    (capi::ascii_bytes(value), capi::text_len(value) as usize)
                }
            };
            std::ptr::copy_nonoverlapping(data, out, n);
            out = out.add(n);
        }
    });
    Bound::from_owned_ptr_or_err(py, text)
}

/// The value of an exact `int` (not a `bool`) that fits in an `i64`.
#[inline]
unsafe fn small_int(value: *mut ffi::PyObject) -> Option<i64> {
    if ffi::PyLong_CheckExact(value) == 0 {
        return None;
    }
    let mut overflow = 0;
    let n = ffi::PyLong_AsLongLongAndOverflow(value, &mut overflow);
    if overflow != 0 || (n == -1 && !ffi::PyErr_Occurred().is_null()) {
        ffi::PyErr_Clear();
        return None;
    }
    Some(n)
}

/// How many characters `n` takes in decimal.
fn decimal_len(n: i64) -> usize {
    let digits = n.unsigned_abs().checked_ilog10().map_or(1, |log| log as usize + 1);
    digits + usize::from(n < 0)
}

/// Write `n` in decimal at `out` (`decimal_len(n)` bytes); the position after it.
unsafe fn write_decimal(out: *mut u8, n: i64) -> *mut u8 {
    let len = decimal_len(n);
    let mut m = n.unsigned_abs();
    let mut at = out.add(len);
    loop {
        at = at.sub(1);
        *at = b'0' + (m % 10) as u8;
        m /= 10;
        if m == 0 {
            break;
        }
    }
    if n < 0 {
        *out = b'-';
    }
    out.add(len)
}

/// Interpolation through a reused UTF-8 buffer, for everything else: non-ASCII text, numbers, objects
/// and arrays as JSON, foreign types through Python's `json`. `values` are the references' values when
/// `interpolate` has looked them up already.
#[inline(never)]
fn interpolate_buffered<'py>(
    r: &mut Resolver<'_, 'py>,
    node: &TextNode,
    values: Option<&[*mut ffi::PyObject]>,
) -> PyResult<Bound<'py, PyAny>> {
    let mut buf = TEXT_BUFFER.take();
    buf.clear();
    buf.reserve(node.literal_len + 32);
    let result = interpolate_into(r, node, &mut buf, values);
    // Keep a modest buffer for the next text; one outsized text must not stay resident.
    if buf.capacity() > KEEP_TEXT_BUFFER {
        buf = String::new();
    }
    TEXT_BUFFER.set(buf);
    result
}

fn interpolate_into<'py>(
    r: &mut Resolver<'_, 'py>,
    node: &TextNode,
    buf: &mut String,
    values: Option<&[*mut ffi::PyObject]>,
) -> PyResult<Bound<'py, PyAny>> {
    let mut ascii = node.literal_ascii;
    let mut values = values.map(|values| values.iter());
    // The room this text may take: what the resolve has not spent yet.
    let (spent, max) = (r.spent, r.max_text.saturating_sub(r.spent));
    for part in node.parts.iter() {
        match part {
            Part::Literal(text) => {
                grow(buf, text.len(), spent, max, node)?;
                buf.push_str(text);
            }
            Part::Reference(reference) => {
                let value = match values.as_mut().and_then(Iterator::next) {
                    // SAFETY: the caller holds a strong reference to each value.
                    Some(&value) => unsafe { Bound::from_borrowed_ptr(r.py, value) },
                    None => lookup(r, reference, false)?,
                };
                // The value's size is known (from above) before a byte of it is written: a text past the
                // limit is refused, and the room for the rest is reserved fallibly, so a failed
                // allocation is a MemoryError rather than an abort.
                let remaining = max.saturating_sub(buf.len());
                // SAFETY: `value` is alive; the walk runs no Python code.
                let size = unsafe { measure(value.as_ptr(), remaining, MAX_JSON_DEPTH) }.bytes;
                grow(buf, size, spent, max, node)?;
                let start = buf.len();
                if !write_text(buf, &value)? {
                    return interpolate_slow(r, node);
                }
                if buf.len() > max {
                    return Err(text_too_large(node, spent + buf.len(), r.max_text));
                }
                ascii = ascii && buf.as_bytes()[start..].is_ascii();
            }
        }
    }
    r.spent = spent + buf.len();
    let len = buf.len() as ffi::Py_ssize_t;
    // SAFETY: an ASCII str of `len` characters has `len` bytes of data, all written here; otherwise
    // `buf` is valid UTF-8. Both calls return a new reference or NULL with an error set.
    unsafe {
        if ascii {
            let text = capi::ascii_text(buf.len(), |out| std::ptr::copy_nonoverlapping(buf.as_ptr(), out, buf.len()));
            return Bound::from_owned_ptr_or_err(r.py, text);
        }
        Bound::from_owned_ptr_or_err(r.py, ffi::PyUnicode_FromStringAndSize(buf.as_ptr().cast(), len))
    }
}

/// The text of a URL template: each reference from `node.encode_from` on written as its text would be, then
/// percent-encoded as one URL component (`url_component`); the others as in any text. Out of line: URL
/// templates are few, and their values short.
#[cold]
#[inline(never)]
fn interpolate_url<'py>(r: &mut Resolver<'_, 'py>, node: &TextNode) -> PyResult<Bound<'py, PyAny>> {
    let mut buf = String::with_capacity(node.literal_len + 32);
    let mut value_text = String::new();
    let (spent, max) = (r.spent, r.max_text.saturating_sub(r.spent));
    for (i, part) in node.parts.iter().enumerate() {
        match part {
            Part::Literal(text) => {
                grow(&mut buf, text.len(), spent, max, node)?;
                buf.push_str(text);
            }
            Part::Reference(reference) => {
                let value = lookup(r, reference, false)?;
                let remaining = max.saturating_sub(buf.len());
                // SAFETY: `value` is alive; the walk runs no Python code.
                let size = unsafe { measure(value.as_ptr(), remaining, MAX_JSON_DEPTH) }.bytes;
                if i < node.encode_from {
                    grow(&mut buf, size, spent, max, node)?;
                    if !write_text(&mut buf, &value)? {
                        return Err(lone_surrogate(reference));
                    }
                } else {
                    value_text.clear();
                    grow(&mut value_text, size, spent, max, node)?;
                    if !write_text(&mut value_text, &value)? {
                        return Err(lone_surrogate(reference));
                    }
                    grow(&mut buf, url_component_len(&value_text), spent, max, node)?;
                    url_component(&mut buf, &value_text);
                }
                if buf.len() > max {
                    return Err(text_too_large(node, spent + buf.len(), r.max_text));
                }
            }
        }
    }
    r.spent = spent + buf.len();
    Ok(PyString::new(r.py, &buf).into_any())
}

#[cold]
fn lone_surrogate(reference: &Reference) -> PyErr {
    pyo3::exceptions::PyValueError::new_err(format!(
        "the value of `{}` at {} holds a lone surrogate, which no URL can carry",
        reference.path.normalized(),
        reference.location
    ))
}

/// Make room for `more` bytes in `buf`, refusing to pass `max` (the room left after `spent` bytes of the
/// resolve) and answering MemoryError when the allocator refuses.
#[inline]
fn grow(buf: &mut String, more: usize, spent: usize, max: usize, node: &TextNode) -> PyResult<()> {
    let size = buf.len().saturating_add(more);
    if size > max {
        return Err(text_too_large(node, spent.saturating_add(size), spent.saturating_add(max)));
    }
    if buf.capacity() - buf.len() < more {
        buf.try_reserve(more).map_err(|_| out_of_memory(size))?;
    }
    Ok(())
}

#[cold]
#[inline(never)]
fn out_of_memory(size: usize) -> PyErr {
    PyMemoryError::new_err(format!("cannot allocate {size} bytes of interpolated text"))
}

/// The error of a text that would pass its limit, located at its first reference.
#[cold]
#[inline(never)]
fn text_too_large(node: &TextNode, size: usize, limit: usize) -> PyErr {
    let location = node
        .parts
        .iter()
        .find_map(|part| match part {
            Part::Reference(reference) => Some(&*reference.location),
            Part::Literal(_) => None,
        })
        .unwrap_or("");
    ResolveError::too_large(size, limit, "the interpolated text", location).into()
}

/// A typed reference's value, copied once the resolve has room for it (measured first, so a template
/// naming one large value many times is refused before it copies it many times).
#[inline]
fn copy_bounded<'py>(r: &mut Resolver<'_, 'py>, reference: &Reference) -> PyResult<Bound<'py, PyAny>> {
    let value = lookup(r, reference, false)?;
    let room = r.max_text.saturating_sub(r.spent);
    // SAFETY: `value` is alive; the walk runs no Python code.
    let size = unsafe { measure(value.as_ptr(), room, MAX_COPY_DEPTH) }.bytes;
    if size > room {
        return Err(value_too_large(reference, r.spent.saturating_add(size), r.max_text));
    }
    r.spent += size;
    deep_copy(value, 0)
}

#[cold]
#[inline(never)]
fn value_too_large(reference: &Reference, size: usize, limit: usize) -> PyErr {
    ResolveError::too_large(size, limit, "the resolved value", &reference.location).into()
}

/// Append `value` as interpolated text: a string as itself, null as nothing, anything else as compact
/// JSON. False when the text cannot be held in UTF-8 (a lone surrogate): the caller joins in Python.
#[inline]
fn write_text(buf: &mut String, value: &Bound<'_, PyAny>) -> PyResult<bool> {
    let ptr = value.as_ptr();
    // SAFETY: `ptr` is alive (held by `value`) and only read.
    unsafe {
        if ffi::PyUnicode_Check(ptr) != 0 {
            return Ok(push_utf8(buf, ptr));
        }
        if ptr == ffi::Py_None() {
            return Ok(true);
        }
        let start = buf.len();
        if write_json(buf, ptr, 0) {
            return Ok(true);
        }
        buf.truncate(start);
    }
    let text = json_dumps(value)?;
    // SAFETY: `text` is a live str.
    Ok(unsafe { push_utf8(buf, text.as_ptr()) })
}

/// Append a str's text; false (and no error left set) when it holds a lone surrogate.
#[inline]
unsafe fn push_utf8(buf: &mut String, ptr: *mut ffi::PyObject) -> bool {
    match utf8(ptr) {
        Some(text) => {
            buf.push_str(text);
            true
        }
        None => false,
    }
}

/// The UTF-8 text of a str (valid as long as the str lives), or None (no error left set) when it holds
/// a lone surrogate.
#[inline]
unsafe fn utf8<'a>(ptr: *mut ffi::PyObject) -> Option<&'a str> {
    let mut size: ffi::Py_ssize_t = 0;
    let data = ffi::PyUnicode_AsUTF8AndSize(ptr, &mut size);
    if data.is_null() {
        ffi::PyErr_Clear();
        return None;
    }
    // SAFETY: CPython hands out valid UTF-8 of `size` bytes, cached in the str object.
    Some(std::str::from_utf8_unchecked(std::slice::from_raw_parts(data.cast(), size as usize)))
}

/// Append a finite float as `float.__repr__` writes it (what `json.dumps` writes). Python's own repr, not
/// Rust's shortest formatting: when two shortest forms are equally close (`562949953421312.25`), Python
/// takes the even last digit and Rust may not.
#[inline(never)]
unsafe fn push_float_repr(buf: &mut String, ptr: *mut ffi::PyObject) -> bool {
    let text = ffi::PyObject_Repr(ptr);
    if text.is_null() {
        ffi::PyErr_Clear();
        return false;
    }
    let pushed = push_utf8(buf, text);
    ffi::Py_DECREF(text);
    pushed
}

/// Write `ptr` as `json.dumps(..., separators=(",", ":"), ensure_ascii=False)` would, for exact JSON
/// types; false (with partial output) for anything else, which the caller hands to Python's `json`.
/// Runs no Python code (only C functions of exact built-in types), so containers cannot change under it.
unsafe fn write_json(buf: &mut String, ptr: *mut ffi::PyObject, depth: u32) -> bool {
    if depth > MAX_JSON_DEPTH {
        return false;
    }
    let ty = ffi::Py_TYPE(ptr);
    if ty == addr_of_mut!(ffi::PyUnicode_Type) {
        match utf8(ptr) {
            Some(text) => write_json_string(buf, text),
            None => return false,
        }
    } else if ty == addr_of_mut!(ffi::PyLong_Type) {
        let mut overflow = 0;
        let n = ffi::PyLong_AsLongLongAndOverflow(ptr, &mut overflow);
        if overflow != 0 || (n == -1 && !ffi::PyErr_Occurred().is_null()) {
            ffi::PyErr_Clear();
            return false;
        }
        let _ = write!(buf, "{n}");
    } else if ty == addr_of_mut!(ffi::PyFloat_Type) {
        let x = capi::float_value(ptr);
        if x.is_nan() {
            buf.push_str("NaN");
        } else if x.is_infinite() {
            buf.push_str(if x > 0.0 { "Infinity" } else { "-Infinity" });
        } else if !push_float_repr(buf, ptr) {
            return false;
        }
    } else if ptr == ffi::Py_True() {
        buf.push_str("true");
    } else if ptr == ffi::Py_False() {
        buf.push_str("false");
    } else if ptr == ffi::Py_None() {
        buf.push_str("null");
    } else if ty == addr_of_mut!(ffi::PyDict_Type) {
        buf.push('{');
        let (mut pos, mut key, mut item) = (0, std::ptr::null_mut(), std::ptr::null_mut());
        let mut first = true;
        while ffi::PyDict_Next(ptr, &mut pos, &mut key, &mut item) != 0 {
            if !first {
                buf.push(',');
            }
            first = false;
            if ffi::Py_TYPE(key) != addr_of_mut!(ffi::PyUnicode_Type) || !write_json(buf, key, depth + 1) {
                return false;
            }
            buf.push(':');
            if !write_json(buf, item, depth + 1) {
                return false;
            }
        }
        buf.push('}');
    } else if ty == addr_of_mut!(ffi::PyList_Type) || ty == addr_of_mut!(ffi::PyTuple_Type) {
        let list = ty == addr_of_mut!(ffi::PyList_Type);
        let n = if list { capi::list_size(ptr) } else { capi::tuple_size(ptr) };
        buf.push('[');
        for i in 0..n {
            if i > 0 {
                buf.push(',');
            }
            let item = if list { capi::list_get(ptr, i) } else { capi::tuple_get(ptr, i) };
            if !write_json(buf, item, depth + 1) {
                return false;
            }
        }
        buf.push(']');
    } else {
        return false;
    }
    true
}

/// `json.dumps(value, separators=(",", ":"), ensure_ascii=False)`, for what `write_json` leaves to
/// Python: foreign types, int and float subclasses, big ints, deep or cyclic values.
#[inline(never)]
fn json_dumps<'py>(value: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyString>> {
    static DUMPS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let py = value.py();
    let dumps = DUMPS.import(py, "json", "dumps")?;
    let kwargs = PyDict::new(py);
    kwargs.set_item("separators", (",", ":"))?;
    kwargs.set_item("ensure_ascii", false)?;
    Ok(dumps.call((value,), Some(&kwargs))?.cast_into::<PyString>()?)
}

/// Interpolation done by Python's `"".join`, for text that UTF-8 cannot hold (lone surrogates).
#[inline(never)]
fn interpolate_slow<'py>(r: &mut Resolver<'_, 'py>, node: &TextNode) -> PyResult<Bound<'py, PyAny>> {
    let py = r.py;
    let mut pieces = Vec::with_capacity(node.parts.len());
    let mut size = 0usize;
    for part in node.parts.iter() {
        pieces.push(match part {
            Part::Literal(text) => PyString::new(py, text).into_any(),
            Part::Reference(reference) => {
                let value = lookup(r, reference, false)?;
                if value.is_instance_of::<PyString>() {
                    value
                } else if value.is_none() {
                    PyString::new(py, "").into_any()
                } else {
                    json_dumps(&value)?.into_any()
                }
            }
        });
        // SAFETY: the piece is a live str; the walk runs no Python code.
        size = size.saturating_add(unsafe { measure(pieces[pieces.len() - 1].as_ptr(), usize::MAX, 0) }.bytes);
        if r.spent.saturating_add(size) > r.max_text {
            return Err(text_too_large(node, r.spent.saturating_add(size), r.max_text));
        }
    }
    r.spent = r.spent.saturating_add(size);
    PyString::new(py, "").call_method1(intern!(py, "join"), (pieces,))
}
