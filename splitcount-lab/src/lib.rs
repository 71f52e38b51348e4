//! The splitcount lab as a library: the CLI in `main.rs` and the report use
//! the same machinery, so every figure has one implementation.

#[macro_use]
pub mod output;
pub mod accuracy;
pub mod alloc_switch;
pub mod bench;
pub mod drift;
pub mod footprint;
pub mod machine;
pub mod replay;
pub mod report;
mod rng;
pub mod timing;
pub mod watchdog;

/// Parse a comma-separated list with `parse_one`, naming the bad element
/// and the `valid` values. A value given twice is kept once, where it
/// first came.
pub fn parse_list<T: PartialEq>(
    s: &str,
    what: &str,
    valid: &str,
    parse_one: impl Fn(&str) -> Option<T>,
) -> Result<Vec<T>, String> {
    let mut out: Vec<T> = Vec::new();
    for x in s.split(',') {
        let v = parse_one(x.trim())
            .ok_or_else(|| format!("{what} {:?} is not valid (valid: {valid})", x.trim()))?;
        if !out.contains(&v) {
            out.push(v);
        }
    }
    Ok(out)
}
