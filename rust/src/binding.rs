//! The Python class `mcpipe._core.Template`: a thin shell over `plan` (compile) and `resolve`.

use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::plan::{self, Plan};
use crate::resolve;

/// A template compiled once, resolved many times (see `_core.pyi` for the Python documentation).
#[pyclass(frozen, module = "mcpipe._core", name = "Template")]
pub struct Template {
    plan: Plan,
}

#[pymethods]
impl Template {
    #[new]
    #[pyo3(signature = (value, *, step_ids = None, location = "", item = None))]
    fn new(
        value: &Bound<'_, PyAny>,
        step_ids: Option<&Bound<'_, PyAny>>,
        location: &str,
        item: Option<&str>,
    ) -> PyResult<Self> {
        let mut ids = plan::step_ids(step_ids)?;
        ids.item_alias = item.map(str::to_owned);
        Ok(Template { plan: plan::compile(value, &ids, location)? })
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
    fn is_constant(&self) -> bool {
        self.plan.sites.is_empty()
    }

    fn __repr__(&self) -> String {
        let references: Vec<&str> = self.plan.sites.iter().map(|(_, r)| r.as_str()).collect();
        format!("<Template references={references:?}>")
    }
}
