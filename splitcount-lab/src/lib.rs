//! The splitcount lab as a library: the CLI in `main.rs` and the report use
//! the same machinery, so every figure has one implementation.

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
/// and the `valid` values.
pub fn parse_list<T>(
    s: &str,
    what: &str,
    valid: &str,
    parse_one: impl Fn(&str) -> Option<T>,
) -> Result<Vec<T>, String> {
    s.split(',')
        .map(|x| {
            parse_one(x.trim())
                .ok_or_else(|| format!("{what} {:?} is not valid (valid: {valid})", x.trim()))
        })
        .collect()
}
