//! The Python classes `mcpipe._core.Template` (a thin shell over `plan` (compile) and `resolve`) and
//! `mcpipe._core.Regex` (over `pattern`).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyList, PyString, PyTuple};

use crate::http1;
use crate::jsoncap;
use crate::measure;
use crate::pattern;
use crate::plan::{self, Plan};
use crate::resolve;

/// The default bound on one interpolated string (16 MiB), when the caller names none.
pub const DEFAULT_MAX_TEXT: usize = 16 * 1024 * 1024;

/// A template compiled once, resolved many times (see `_core.pyi` for the Python documentation).
#[pyclass(frozen, module = "mcpipe._core", name = "Template")]
pub struct Template {
    plan: Plan,
}

#[pymethods]
impl Template {
    #[new]
    #[pyo3(signature = (value, *, step_ids = None, location = "", max_text_bytes = DEFAULT_MAX_TEXT, item = None, url = false))]
    fn new(
        value: &Bound<'_, PyAny>,
        step_ids: Option<&Bound<'_, PyAny>>,
        location: &str,
        max_text_bytes: usize,
        item: Option<&str>,
        url: bool,
    ) -> PyResult<Self> {
        let mut ids = plan::step_ids(step_ids)?;
        ids.item_alias = item.map(str::to_owned);
        Ok(Template { plan: plan::compile(value, &ids, location, max_text_bytes, url)? })
    }

    fn resolve<'py>(&self, env: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        resolve::resolve(&mut resolve::Resolver::new(&self.plan, env), &self.plan.root)
    }

    #[getter]
    fn references<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.plan.sites.iter().map(|(_, reference)| reference))
    }

    #[getter]
    fn reference_sites<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, &self.plan.sites)
    }

    #[getter]
    fn url_base(&self) -> Option<String> {
        plan::url_base(&self.plan.root)
    }

    #[getter]
    fn is_constant(&self) -> bool {
        self.plan.sites.is_empty()
    }

    fn __repr__(&self) -> String {
        let references: Vec<&str> = self.plan.sites.iter().map(|(_, r)| r.as_str()).collect();
        format!("<Template references={references:?}>")
    }
}

/// `(bytes, depth)` of `value` as JSON, stopping past either limit (see `_core.pyi`).
#[pyfunction]
#[pyo3(signature = (value, *, max_bytes = usize::MAX, max_depth = u32::MAX, wire = false))]
pub fn json_measure(value: &Bound<'_, PyAny>, max_bytes: usize, max_depth: u32, wire: bool) -> (usize, u32) {
    // SAFETY: `value` is alive for the call and the walk runs no Python code.
    let found = unsafe {
        if wire {
            measure::measure_wire(value.as_ptr(), max_bytes, max_depth)
        } else {
            measure::measure(value.as_ptr(), max_bytes, max_depth)
        }
    };
    (found.bytes, found.depth)
}

/// A pattern matched in time linear in the text (see `_core.pyi`).
#[pyclass(frozen, module = "mcpipe._core", name = "Regex")]
pub struct Regex {
    re: regex::Regex,
}

#[pymethods]
impl Regex {
    #[new]
    fn new(pattern: &str) -> PyResult<Self> {
        pattern::compile(pattern).map(|re| Regex { re }).map_err(PyValueError::new_err)
    }

    fn search(&self, text: &str) -> bool {
        self.re.is_match(text)
    }

    #[getter]
    fn pattern(&self) -> &str {
        self.re.as_str()
    }

    fn __repr__(&self) -> String {
        format!("<Regex {:?}>", self.re.as_str())
    }
}

/// A JSON-RPC answer's `result.tools` cut to its first elements as its bytes stream past (see `_core.pyi`).
#[pyclass(module = "mcpipe._core", name = "ArrayCap")]
pub struct ArrayCap {
    inner: jsoncap::ArrayCap,
}

#[pymethods]
impl ArrayCap {
    #[new]
    fn new(max_items: usize) -> Self {
        ArrayCap { inner: jsoncap::ArrayCap::new(max_items) }
    }

    fn feed<'py>(&mut self, py: Python<'py>, data: &[u8]) -> Bound<'py, PyBytes> {
        let mut out = Vec::with_capacity(data.len());
        self.inner.feed(data, &mut out);
        PyBytes::new(py, &out)
    }

    #[getter]
    fn total(&self) -> usize {
        self.inner.total()
    }
}

/// The request head at the start of `data` (`http1::parse`): `None` while it is unfinished, `False` when
/// it is not plain (hypercorn's protocol reads it), else `(method, target, http_version, headers, head_len,
/// content_length, flags)` with the method upper-cased and the header names lower-cased, as hypercorn's
/// scope has them.
#[pyfunction]
pub fn http1_head<'py>(py: Python<'py>, data: &[u8], max_head: usize) -> PyResult<Bound<'py, PyAny>> {
    let head = match http1::parse(data, max_head) {
        http1::Parsed::Partial => return Ok(py.None().into_bound(py)),
        http1::Parsed::Other => return Ok(PyBool::new(py, false).to_owned().into_any()),
        http1::Parsed::Plain(head) => head,
    };
    let method = &data[head.method.0..head.method.1];
    let method = match method {
        b"POST" => pyo3::intern!(py, "POST").clone(),
        b"GET" => pyo3::intern!(py, "GET").clone(),
        b"DELETE" => pyo3::intern!(py, "DELETE").clone(),
        b"HEAD" => pyo3::intern!(py, "HEAD").clone(),
        b"OPTIONS" => pyo3::intern!(py, "OPTIONS").clone(),
        _ => PyString::new(py, &String::from_utf8_lossy(method).to_ascii_uppercase()),
    };
    let headers = PyList::empty(py);
    for ((n0, n1), (v0, v1)) in &head.headers {
        let name = PyBytes::new_with(py, n1 - n0, |out| {
            out.copy_from_slice(&data[*n0..*n1]);
            out.make_ascii_lowercase();
            Ok(())
        })?;
        headers.append(PyTuple::new(py, [name, PyBytes::new(py, &data[*v0..*v1])])?)?;
    }
    let version = if head.minor == 0 { pyo3::intern!(py, "1.0") } else { pyo3::intern!(py, "1.1") };
    let parts: [Bound<'py, PyAny>; 7] = [
        method.into_any(),
        PyBytes::new(py, &data[head.target.0..head.target.1]).into_any(),
        version.clone().into_any(),
        headers.into_any(),
        head.len.into_pyobject(py)?.into_any(),
        head.content_length.into_pyobject(py)?.into_any(),
        head.flags.into_pyobject(py)?.into_any(),
    ];
    Ok(PyTuple::new(py, parts)?.into_any())
}
