//! mcpipe's Rust core: templates compiled once into plans and resolved many times.
//!
//! `path`, `pattern`, `template`, `text`, `jsoncap`, `http1` and `errors` are pure Rust (tested with `cargo test
//! --no-default-features`); `plan`, `resolve` and `binding` are the Python layer. This file only
//! declares modules and registers the Python module.

pub mod errors;
pub mod http1;
pub mod jsoncap;
pub mod path;
pub mod pattern;
pub mod template;
pub mod text;

#[cfg(feature = "python")]
mod binding;
#[cfg(feature = "python")]
mod capi;
#[cfg(feature = "python")]
mod dict;
#[cfg(all(feature = "python", target_os = "linux"))]
mod forkserver;
#[cfg(feature = "python")]
mod measure;
#[cfg(feature = "python")]
mod plan;
#[cfg(feature = "python")]
mod resolve;
#[cfg(all(feature = "python", target_os = "linux"))]
mod sandbox;

#[cfg(feature = "python")]
use pyo3::prelude::*;

#[cfg(feature = "python")]
#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<binding::Template>()?;
    m.add_class::<binding::Regex>()?;
    m.add_class::<binding::ArrayCap>()?;
    m.add_function(wrap_pyfunction!(binding::json_measure, m)?)?;
    m.add_function(wrap_pyfunction!(binding::http1_head, m)?)?;
    #[cfg(target_os = "linux")]
    sandbox::register(m)?;
    dict::enable(m.py())?;
    Ok(())
}
