//! Compile a Python template value into a plan: constants, typed references, interpolated strings,
//! objects and arrays. String scanning and path parsing happen here, once; every key a path follows is
//! kept as an interned Python string so resolving never builds one.

use std::collections::HashMap;

use pyo3::exceptions::{PyRecursionError, PyTypeError};
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList, PyString, PyType};

use crate::dict;
use crate::errors::ResolveError;
use crate::path::{ArrayIndex, Literal, Path, SegmentKind, StepIds};
use crate::resolve::deep_copy;
use crate::template::{has_opener, index_location, key_location, parse_ref, parse_string, ParsedString, Piece};

/// One step of a compiled path.
pub enum Step {
    /// Follow a key on an object, or (when the segment is an integer) an index on an array.
    Key { key: Py<PyString>, index: ArrayIndex },
    /// Map the rest of the path over every element.
    Star,
}

/// A reference ready to follow: the root and segment keys as Python strings, plus the parsed path and
/// location that errors report.
pub struct Reference {
    pub root_key: Py<PyString>,
    pub steps: Box<[Step]>,
    /// The deepest node of the plan's prefix table on this path (`NO_PREFIX`: none, the walk starts
    /// at the root), and how many steps it stands for (the walk goes on from there).
    pub prefix: u32,
    pub prefix_len: usize,
    pub path: Path,
    pub location: Box<str>,
    /// What the reference gives when its path cannot be followed or ends at null (`?? value`, or the
    /// `default` of `{"$ref": ..., "default": ...}`); deep-copied when it is a container.
    pub default: Option<Py<PyAny>>,
}

/// A node of the prefix table: the references of a plan share their common prefixes
/// (`steps.s1.structured.a` and `steps.s1.structured.b` share `steps.s1.structured`), so one resolve
/// looks each prefix up once. Only prefixes that two or more references go through are in the table;
/// the rest of each path is walked by its reference alone.
pub struct PrefixNode {
    /// The parent node, or `NO_PARENT` for a root (looked up in the environment).
    pub parent: u32,
    pub key: Py<PyString>,
    pub index: ArrayIndex,
}

pub const NO_PARENT: u32 = u32::MAX;
pub const NO_PREFIX: u32 = u32::MAX;

pub enum Part {
    Literal(Box<str>),
    Reference(Reference),
}

pub struct TextNode {
    pub parts: Box<[Part]>,
    /// The length of the literal text: a first guess at the result's size.
    pub literal_len: usize,
    /// Whether every literal piece is ASCII (then an ASCII result can be built without decoding).
    pub literal_ascii: bool,
    /// How many parts are references.
    pub references: usize,
    /// The first part whose references are percent-encoded as URL components (a URL template's values
    /// after its scheme's `://`), or `NO_ENCODING`.
    pub encode_from: usize,
}

/// A text none of whose references are percent-encoded.
pub const NO_ENCODING: usize = usize::MAX;

pub struct ObjectNode {
    pub keys: Box<[Py<PyAny>]>,
    pub values: Box<[Node]>,
    /// The keys in order with None values: a result copies it and fills the values in (`dict`).
    pub skeleton: Option<Py<PyDict>>,
}

pub enum Node {
    /// An immutable constant (string, number, ...): shared by every result.
    Atom(Py<PyAny>),
    /// A constant container, owned by the plan: deep-copied on every resolve.
    Container(Py<PyAny>),
    Reference(Box<Reference>),
    Text(Box<TextNode>),
    Object(Box<ObjectNode>),
    Array(Box<[Node]>),
}

impl Node {
    /// Call `f` on every reference of the plan, text parts included.
    fn for_each_reference(&mut self, f: &mut impl FnMut(&mut Reference)) {
        match self {
            Node::Atom(_) | Node::Container(_) => {}
            Node::Reference(reference) => f(reference),
            Node::Text(text) => {
                for part in text.parts.iter_mut() {
                    if let Part::Reference(reference) = part {
                        f(reference);
                    }
                }
            }
            Node::Object(object) => object.values.iter_mut().for_each(|value| value.for_each_reference(f)),
            Node::Array(items) => items.iter_mut().for_each(|item| item.for_each_reference(f)),
        }
    }

    fn is_constant(&self) -> bool {
        matches!(self, Node::Atom(_) | Node::Container(_))
    }

    /// The value of a constant node, for folding it into its parent's constant.
    fn constant_value(self) -> Py<PyAny> {
        match self {
            Node::Atom(value) | Node::Container(value) => value,
            _ => unreachable!("only constants fold"),
        }
    }
}

/// A compiled template: its plan and the references it makes, in template order.
pub struct Plan {
    pub root: Node,
    pub sites: Vec<(String, String)>,
    pub prefixes: Box<[PrefixNode]>,
    /// The most bytes an interpolated string of this plan may have (checked before it is built).
    pub max_text: usize,
}

/// Compile `value` under `location`, mapping `{{stepN}}` through `ids`. With `url`, a string with
/// placeholders is a URL template: the references after the literal text's first `://` resolve
/// percent-encoded as URL components (`resolve::url_component`).
pub fn compile(value: &Bound<'_, PyAny>, ids: &StepIds, location: &str, max_text: usize, url: bool) -> PyResult<Plan> {
    let mut compiler = Compiler {
        ids,
        sites: Vec::new(),
        prefixes: Vec::new(),
        prefix_ids: HashMap::new(),
        uses: Vec::new(),
        parents: Vec::new(),
        depth: 0,
    };
    let mut root = compiler.node(value, location)?;
    if url {
        if let Node::Text(text) = &mut root {
            text.encode_from = url_encode_from(&text.parts);
        }
    }
    // Keep the shared nodes only (a parent is shared by at least the references of its children, and
    // comes before them), renumbered, and start each reference from its deepest shared node.
    let mut renumbered = vec![NO_PREFIX; compiler.prefixes.len()];
    let mut shared = Vec::new();
    for (id, node) in compiler.prefixes.into_iter().enumerate() {
        if compiler.uses[id] > 1 {
            renumbered[id] = shared.len() as u32;
            let parent = if node.parent == NO_PARENT { NO_PARENT } else { renumbered[node.parent as usize] };
            shared.push(PrefixNode { parent, ..node });
        }
    }
    let parents = &compiler.parents;
    root.for_each_reference(&mut |reference| {
        let (mut id, mut len) = (reference.prefix, reference.prefix_len + 1);
        while id != NO_PARENT && renumbered[id as usize] == NO_PREFIX {
            id = parents[id as usize];
            len -= 1;
        }
        (reference.prefix, reference.prefix_len) =
            if id == NO_PARENT { (NO_PREFIX, 0) } else { (renumbered[id as usize], len - 1) };
    });
    Ok(Plan { root, sites: compiler.sites, prefixes: shared.into_boxed_slice(), max_text })
}

/// The first part of a URL template whose references are percent-encoded: the one after the literal text
/// that writes the scheme's `://` (a reference before it, a scheme or a host, is left as it is); without
/// such a literal, every reference but one that opens the template (a base URL given as a value).
fn url_encode_from(parts: &[Part]) -> usize {
    let mut literal = String::new();
    for (i, part) in parts.iter().enumerate() {
        if let Part::Literal(text) = part {
            literal.push_str(text);
            if literal.contains("://") {
                return i + 1;
            }
        }
    }
    usize::from(matches!(parts.first(), Some(Part::Reference(_))))
}

/// The literal text before the first percent-encoded reference of a URL template, when every part before
/// it is literal (its base: what no value can change); None otherwise.
pub fn url_base(root: &Node) -> Option<String> {
    let Node::Text(text) = root else { return None };
    if text.encode_from == NO_ENCODING {
        return None;
    }
    let mut base = String::new();
    for (i, part) in text.parts.iter().enumerate() {
        match part {
            Part::Literal(literal) => base.push_str(literal),
            Part::Reference(_) if i >= text.encode_from => return Some(base),
            Part::Reference(_) => return None,
        }
    }
    Some(base)
}

struct Compiler<'a> {
    ids: &'a StepIds,
    sites: Vec<(String, String)>,
    prefixes: Vec<PrefixNode>,
    prefix_ids: HashMap<(u32, String, ArrayIndex), u32>,
    /// How many references go through each prefix node, and each node's parent.
    uses: Vec<u32>,
    parents: Vec<u32>,
    /// How many containers deep the compiler is.
    depth: u32,
}

/// Templates nested deeper than this are refused (RecursionError), as the recursive oracle would.
const MAX_TEMPLATE_DEPTH: u32 = 1000;

impl Compiler<'_> {
    fn node(&mut self, value: &Bound<'_, PyAny>, loc: &str) -> PyResult<Node> {
        if self.depth >= MAX_TEMPLATE_DEPTH {
            return Err(PyRecursionError::new_err("maximum nesting depth exceeded while compiling a template"));
        }
        self.depth += 1;
        let node = self.node_inner(value, loc);
        self.depth -= 1;
        node
    }

    fn node_inner(&mut self, value: &Bound<'_, PyAny>, loc: &str) -> PyResult<Node> {
        let py = value.py();
        if let Ok(dict) = value.cast::<PyDict>() {
            if dict.len() == 1 {
                if let Some(target) = dict.get_item(intern!(py, "$ref"))? {
                    return self.reference(&target, loc);
                }
                if let Some(literal) = dict.get_item(intern!(py, "$literal"))? {
                    return constant(deep_copy(literal, 0)?);
                }
            }
            if dict.len() == 2 {
                if let (Some(target), Some(default)) =
                    (dict.get_item(intern!(py, "$ref"))?, dict.get_item(intern!(py, "default"))?)
                {
                    let mut node = self.reference(&target, loc)?;
                    if let Node::Reference(reference) = &mut node {
                        reference.default = Some(deep_copy(default, 0)?.unbind());
                    }
                    return Ok(node);
                }
            }
            return self.object(dict, loc);
        }
        if value.is_instance_of::<PyList>() || value.is_instance_of::<pyo3::types::PyTuple>() {
            let mut nodes = Vec::new();
            for (i, item) in value.try_iter()?.enumerate() {
                nodes.push(self.node(&item?, &index_location(loc, i))?);
            }
            if nodes.iter().all(Node::is_constant) {
                let items = nodes.into_iter().map(|n| n.constant_value().into_bound(py));
                return Ok(Node::Container(PyList::new(py, items)?.into_any().unbind()));
            }
            return Ok(Node::Array(nodes.into_boxed_slice()));
        }
        if let Ok(text) = value.cast::<PyString>() {
            return self.string(text, loc);
        }
        Ok(Node::Atom(value.clone().unbind()))
    }

    fn object(&mut self, dict: &Bound<'_, PyDict>, loc: &str) -> PyResult<Node> {
        let py = dict.py();
        let items = if dict.is_exact_instance_of::<PyDict>() {
            dict.items().into_any()
        } else {
            dict.call_method0(intern!(py, "items"))?
        };
        let mut keys = Vec::with_capacity(dict.len());
        let mut values = Vec::with_capacity(dict.len());
        for item in items.try_iter()? {
            let (key, value): (Bound<'_, PyAny>, Bound<'_, PyAny>) = item?.extract()?;
            let child = match key.cast::<PyString>() {
                Ok(key) => key_location(loc, &key.to_string_lossy()),
                Err(_) => index_location(loc, key.str()?.to_string_lossy()),
            };
            values.push(self.node(&value, &child)?);
            keys.push(key.unbind());
        }
        if values.iter().all(Node::is_constant) {
            let folded = PyDict::new(py);
            for (key, value) in keys.into_iter().zip(values) {
                folded.set_item(key, value.constant_value())?;
            }
            return Ok(Node::Container(folded.into_any().unbind()));
        }
        let skeleton = dict::skeleton(py, &keys)?;
        Ok(Node::Object(Box::new(ObjectNode {
            keys: keys.into_boxed_slice(),
            values: values.into_boxed_slice(),
            skeleton,
        })))
    }

    fn reference(&mut self, target: &Bound<'_, PyAny>, loc: &str) -> PyResult<Node> {
        let Ok(target) = target.cast::<PyString>() else {
            return Err(ResolveError::syntax("`$ref` takes a path string".to_owned(), loc).into());
        };
        let Ok(text) = target.to_str() else {
            let reason = "invalid `$ref` path: not valid Unicode (it contains a lone surrogate)";
            return Err(ResolveError::syntax(reason.to_owned(), loc).into());
        };
        let path = parse_ref(text, self.ids).map_err(|reason| ResolveError::syntax(reason, loc))?;
        Ok(Node::Reference(Box::new(self.compile_path(target.py(), path, loc))))
    }

    fn string(&mut self, value: &Bound<'_, PyString>, loc: &str) -> PyResult<Node> {
        let py = value.py();
        let Ok(text) = value.to_str() else {
            // A lone surrogate cannot be scanned as text; it may stay only in a plain string.
            if has_opener(&value.to_string_lossy()) {
                let reason = "string is not valid Unicode (it contains a lone surrogate) and cannot hold placeholders";
                return Err(ResolveError::syntax(reason.to_owned(), loc).into());
            }
            return Ok(Node::Atom(exact_str(value)?));
        };
        match parse_string(text, self.ids).map_err(|reason| ResolveError::syntax(reason, loc))? {
            ParsedString::Constant(constant) if constant == text => Ok(Node::Atom(exact_str(value)?)),
            ParsedString::Constant(constant) => Ok(Node::Atom(PyString::new(py, &constant).into_any().unbind())),
            ParsedString::Reference(path) => Ok(Node::Reference(Box::new(self.compile_path(py, path, loc)))),
            ParsedString::Text(pieces) => {
                let mut literal_len = 0;
                let mut literal_ascii = true;
                let parts = pieces
                    .into_iter()
                    .map(|piece| match piece {
                        Piece::Literal(text) => {
                            literal_len += text.len();
                            literal_ascii &= text.is_ascii();
                            Part::Literal(text.into_boxed_str())
                        }
                        Piece::Reference(path) => Part::Reference(self.compile_path(py, path, loc)),
                    })
                    .collect();
                let parts: Box<[Part]> = parts;
                let references = parts.iter().filter(|part| matches!(part, Part::Reference(_))).count();
                Ok(Node::Text(Box::new(TextNode {
                    parts,
                    literal_len,
                    literal_ascii,
                    references,
                    encode_from: NO_ENCODING,
                })))
            }
        }
    }

    fn compile_path(&mut self, py: Python<'_>, path: Path, loc: &str) -> Reference {
        self.sites.push((loc.to_owned(), path.normalized()));
        let steps = path
            .segments
            .iter()
            .map(|segment| match segment.kind {
                SegmentKind::Star => Step::Star,
                _ => Step::Key { key: PyString::intern(py, &segment.text).unbind(), index: segment.array_index() },
            })
            .collect();
        let root_key = PyString::intern(py, path.root.name()).unbind();
        let default = path.default.as_ref().map(|literal| literal_value(py, literal));
        let mut prefix = self.prefix_node(py, NO_PARENT, path.root.name(), ArrayIndex::NotIndex);
        let mut prefix_len = 0;
        for segment in path.segments.iter().take_while(|s| s.kind != SegmentKind::Star) {
            prefix = self.prefix_node(py, prefix, &segment.text, segment.array_index());
            prefix_len += 1;
        }
        Reference { root_key, steps, prefix, prefix_len, path, location: loc.into(), default }
    }

    fn prefix_node(&mut self, py: Python<'_>, parent: u32, text: &str, index: ArrayIndex) -> u32 {
        let next = self.prefixes.len() as u32;
        let id = *self.prefix_ids.entry((parent, text.to_owned(), index)).or_insert(next);
        if id == next {
            self.prefixes.push(PrefixNode { parent, key: PyString::intern(py, text).unbind(), index });
            self.uses.push(0);
            self.parents.push(parent);
        }
        self.uses[id as usize] += 1;
        id
    }
}

/// The Python value of a default written in a placeholder (a number as Python reads its JSON text).
fn literal_value(py: Python<'_>, literal: &Literal) -> Py<PyAny> {
    let value = match literal {
        Literal::Null => py.None().into_bound(py),
        Literal::Bool(b) => pyo3::types::PyBool::new(py, *b).to_owned().into_any(),
        Literal::String(text) => PyString::new(py, text).into_any(),
        Literal::Number(text) => {
            let float = text.contains(['.', 'e', 'E']);
            let parsed = if float {
                text.parse::<f64>().map(|f| pyo3::types::PyFloat::new(py, f).into_any()).ok()
            } else {
                text.parse::<i64>().ok().and_then(|n| n.into_pyobject(py).map(|v| v.into_any()).ok())
            };
            // A number past i64: Python's own int() of its digits (the parser checked its grammar).
            parsed.unwrap_or_else(|| {
                py.get_type::<pyo3::types::PyInt>()
                    .call1((text.as_str(),))
                    .unwrap_or_else(|_| PyString::new(py, text).into_any())
            })
        }
    };
    value.unbind()
}

fn constant(value: Bound<'_, PyAny>) -> PyResult<Node> {
    let container = value.is_instance_of::<PyDict>() || value.is_instance_of::<PyList>();
    Ok(if container { Node::Container(value.unbind()) } else { Node::Atom(value.unbind()) })
}

/// The string itself when it is an exact `str`, else a plain `str` copy of a subclass instance.
fn exact_str(value: &Bound<'_, PyString>) -> PyResult<Py<PyAny>> {
    if value.is_exact_instance_of::<PyString>() {
        return Ok(value.clone().into_any().unbind());
    }
    // SAFETY: `value` is a live str; PyUnicode_FromObject returns a new reference or NULL with an error.
    unsafe { Ok(Bound::from_owned_ptr_or_err(value.py(), ffi::PyUnicode_FromObject(value.as_ptr()))?.unbind()) }
}

/// Read `step_ids`: a sequence of ids (the first is step 1) or a mapping {N: id}.
pub fn step_ids(value: Option<&Bound<'_, PyAny>>) -> PyResult<StepIds> {
    static MAPPING: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    let mut ids = StepIds::default();
    let Some(value) = value else { return Ok(ids) };
    let py = value.py();
    let mut add = |n: Bound<'_, PyAny>, id: Bound<'_, PyAny>| -> PyResult<()> {
        if !n.is_instance_of::<pyo3::types::PyInt>() {
            let found = n.get_type().name()?;
            return Err(PyTypeError::new_err(format!("step_ids keys must be integers, not {found}")));
        }
        let Ok(id) = id.cast::<PyString>() else {
            let found = id.get_type().name()?;
            return Err(PyTypeError::new_err(format!("step ids must be strings, not {found}")));
        };
        // SAFETY: `n` is a live int; PyNumber_Long returns a new reference or NULL with an error.
        let n = unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyNumber_Long(n.as_ptr()))? };
        ids.insert(n.str()?.to_str()?.to_owned(), id.to_string_lossy().into_owned());
        Ok(())
    };
    if value.is_instance(MAPPING.import(py, "collections.abc", "Mapping")?)? {
        for item in value.call_method0(intern!(py, "items"))?.try_iter()? {
            let (n, id) = item?.extract()?;
            add(n, id)?;
        }
    } else {
        let mut count = 0;
        for (i, id) in value.try_iter()?.enumerate() {
            add((i + 1).into_pyobject(py)?.into_any(), id?)?;
            count = i + 1;
        }
        ids.set_count(count);
    }
    Ok(ids)
}
