//! The patterns of JSON Schemas (`pattern`, the keys of `patternProperties`), matched in time linear in the
//! text: the `regex` crate builds an automaton, so no input makes a match backtrack (`^(a+)+$` against 28
//! characters froze a backtracking engine for seconds). Pure Rust; the binding is `binding::Regex`.
//!
//! A pattern the crate does not take (lookaround, backreferences: ECMA-262 features without a linear-time
//! algorithm) or whose automaton would pass the size bounds is refused here; the Python side then matches
//! it under a deadline, off the event loop.

use regex::{Regex, RegexBuilder};

/// The most bytes a compiled pattern's program may take (`a{1000}{1000}` is refused, not built).
pub const MAX_PROGRAM_BYTES: usize = 2 * 1024 * 1024;

/// The most bytes of lazily built automaton states a pattern may cache while matching.
pub const MAX_CACHE_BYTES: usize = 4 * 1024 * 1024;

/// Compile `pattern`, or say why the linear-time engine does not take it.
pub fn compile(pattern: &str) -> Result<Regex, String> {
    RegexBuilder::new(pattern)
        .size_limit(MAX_PROGRAM_BYTES)
        .dfa_size_limit(MAX_CACHE_BYTES)
        .build()
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn nested_quantifiers_match_in_linear_time() {
        let re = compile("^(a+)+$").unwrap();
        let text = "a".repeat(100_000) + "!";
        let t0 = Instant::now();
        assert!(!re.is_match(&text));
        assert!(re.is_match(&"a".repeat(100_000)));
        assert!(t0.elapsed().as_secs() < 5);
    }

    #[test]
    fn lookaround_backreferences_and_huge_repetitions_are_refused() {
        assert!(compile("(?=a)b").is_err());
        assert!(compile(r"(a)\1").is_err());
        assert!(compile("a{1000}{1000}").is_err());
    }

    #[test]
    fn a_pattern_is_searched_for_not_anchored() {
        let re = compile("[0-9]{3}").unwrap();
        assert!(re.is_match("ab123cd"));
        assert!(!compile("^[0-9]{3}$").unwrap().is_match("ab123cd"));
        assert!(compile(r"^\p{L}+$").unwrap().is_match("héllo"));
    }
}
