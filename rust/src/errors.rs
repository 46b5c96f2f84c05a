//! The one error type of the core, and its one conversion to the Python exceptions of `mcpipe.errors`.

use std::fmt;

/// What was found where a path segment could not be followed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// `object`, `array`, `string`, `number`, `boolean`, `null`, `environment` (a missing root), or the
    /// Python type name of a foreign value.
    pub type_name: String,
    /// Up to 10 keys of a mapping.
    pub keys: Option<Vec<String>>,
    /// The length of an array, or the key count of a mapping.
    pub length: Option<usize>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// A template that cannot be compiled (`TemplateSyntaxError`).
    Syntax { reason: String },
    /// A reference whose value is missing at resolve time (`InterpolationError`).
    Missing { reference: String, segment: String, found: Found },
    /// A resolve that would pass its size limit (`OutputTooLargeError`): nothing that big is built.
    /// `what` names the part that passed it (`the interpolated text`, `the resolved value`).
    TooLarge { size: usize, limit: usize, what: &'static str },
}

/// An error of the template core, named by where it is in the template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolveError {
    pub kind: ErrorKind,
    /// Where in the template (`args.items[2]`), prefixed by the location the template was compiled under.
    pub location: String,
}

impl ResolveError {
    #[cold]
    pub fn syntax(reason: String, location: &str) -> ResolveError {
        ResolveError { kind: ErrorKind::Syntax { reason }, location: location.to_owned() }
    }

    #[cold]
    pub fn missing(reference: String, location: &str, segment: String, found: Found) -> ResolveError {
        ResolveError { kind: ErrorKind::Missing { reference, segment, found }, location: location.to_owned() }
    }

    #[cold]
    pub fn too_large(size: usize, limit: usize, what: &'static str, location: &str) -> ResolveError {
        ResolveError { kind: ErrorKind::TooLarge { size, limit, what }, location: location.to_owned() }
    }
}

impl Found {
    /// How messages describe it (the same words as `InterpolationError.describe_found`).
    fn describe(&self) -> String {
        match self.type_name.as_str() {
            kind @ ("object" | "environment") => {
                let keys = self.keys.as_deref().unwrap_or_default();
                let n = self.length.unwrap_or(keys.len());
                if n == 0 {
                    return format!("empty {kind}");
                }
                let mut shown = Vec::with_capacity(keys.len());
                for key in keys {
                    let mut quoted = String::new();
                    crate::text::write_json_string(&mut quoted, key);
                    shown.push(quoted);
                }
                let more = if n > keys.len() { ", ..." } else { "" };
                let plural = if n == 1 { "" } else { "s" };
                format!("{kind} with {n} key{plural}: {}{more}", shown.join(", "))
            }
            "array" => format!("array of length {}", self.length.unwrap_or(0)),
            kind => kind.to_owned(),
        }
    }
}

impl fmt::Display for ResolveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.location.is_empty() {
            write!(f, "{}: ", self.location)?;
        }
        match &self.kind {
            ErrorKind::Syntax { reason } => f.write_str(reason),
            ErrorKind::Missing { reference, segment, found } => {
                write!(f, "cannot resolve `{reference}`: `{segment}` not found in {}", found.describe())
            }
            ErrorKind::TooLarge { size, limit, what } => {
                write!(f, "{what} would take the resolved template to at least {size} bytes; the limit is {limit}")
            }
        }
    }
}

impl std::error::Error for ResolveError {}

#[cfg(feature = "python")]
mod python {
    use pyo3::prelude::*;
    use pyo3::sync::PyOnceLock;
    use pyo3::types::PyType;

    use super::{ErrorKind, ResolveError};

    static SYNTAX_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    static INTERPOLATION_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    static TOO_LARGE_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();

    impl From<ResolveError> for PyErr {
        #[cold]
        #[inline(never)]
        fn from(err: ResolveError) -> PyErr {
            Python::attach(|py| {
                let made = match err.kind {
                    ErrorKind::Syntax { reason } => SYNTAX_ERROR
                        .import(py, "mcpipe.errors", "TemplateSyntaxError")
                        .and_then(|cls| cls.call1((reason, err.location))),
                    ErrorKind::Missing { reference, segment, found } => {
                        INTERPOLATION_ERROR.import(py, "mcpipe.errors", "InterpolationError").and_then(|cls| {
                            cls.call1((reference, err.location, segment, found.type_name, found.keys, found.length))
                        })
                    }
                    ErrorKind::TooLarge { size, limit, what } => {
                        TOO_LARGE_ERROR.import(py, "mcpipe.errors", "OutputTooLargeError").and_then(|cls| {
                            let why = format!(
                                "would take the resolved template to at least {size} bytes; the limit is {limit}"
                            );
                            cls.call1((size, limit, err.location, what, why))
                        })
                    }
                };
                match made {
                    Ok(exception) => PyErr::from_value(exception),
                    Err(failed) => failed,
                }
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(type_name: &str, keys: Option<&[&str]>, length: Option<usize>) -> Found {
        let keys = keys.map(|k| k.iter().map(|s| s.to_string()).collect());
        Found { type_name: type_name.to_owned(), keys, length }
    }

    #[test]
    fn messages_name_the_location_the_reference_and_what_was_found() {
        let err = ResolveError::missing(
            "steps.a.output.x".into(),
            "args.url",
            "x".into(),
            found("object", Some(&["a", "b"]), Some(2)),
        );
        assert_eq!(
            err.to_string(),
            "args.url: cannot resolve `steps.a.output.x`: `x` not found in object with 2 keys: \"a\", \"b\""
        );
        let err = ResolveError::missing("vars.0".into(), "", "0".into(), found("array", None, Some(0)));
        assert_eq!(err.to_string(), "cannot resolve `vars.0`: `0` not found in array of length 0");
        let err = ResolveError::missing("vars".into(), "", "vars".into(), found("environment", Some(&[]), Some(0)));
        assert_eq!(err.to_string(), "cannot resolve `vars`: `vars` not found in empty environment");
        let err = ResolveError::missing("vars.a".into(), "", "a".into(), found("object", Some(&["k"]), Some(12)));
        assert!(err.to_string().ends_with("object with 12 keys: \"k\", ..."));
        let err = ResolveError::syntax("bad".into(), "args");
        assert_eq!(err.to_string(), "args: bad");
    }
}
