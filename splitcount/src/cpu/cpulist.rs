//! Parsing of the kernel's CPU-list format (`0-3,8-11`), as found in
//! `/sys/devices/system/cpu/possible`, `online`, `node*/cpulist` and
//! `cache/index*/shared_cpu_list`.

use std::fmt;

/// Largest CPU id we accept from a list: the kernel's `NR_CPUS` limit is 8192
/// on common configurations; anything far beyond is a corrupt file, not a
/// machine, and must not make us allocate gigabytes.
pub const MAX_CPU_ID: u32 = 1 << 20;

/// A CPU list that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CpuListError {
    /// The text that was being parsed.
    pub input: String,
    /// What was wrong with it.
    pub reason: &'static str,
}

impl fmt::Display for CpuListError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid CPU list {:?}: {}", self.input, self.reason)
    }
}

impl std::error::Error for CpuListError {}

/// Parse a kernel CPU list such as `"0-3,8-11\n"` into sorted, distinct ids.
///
/// An empty (or all-whitespace) list is a valid, empty set: the kernel writes
/// one for a memory-only NUMA node, or for `offline` when every CPU is online.
///
/// ```
/// use splitcount::cpu::parse_cpu_list;
/// assert_eq!(parse_cpu_list("0-3,8-11\n").unwrap(), vec![0, 1, 2, 3, 8, 9, 10, 11]);
/// assert_eq!(parse_cpu_list("0").unwrap(), vec![0]);
/// assert!(parse_cpu_list("").unwrap().is_empty());
/// assert!(parse_cpu_list("3-1").is_err());
/// ```
pub fn parse_cpu_list(text: &str) -> Result<Vec<u32>, CpuListError> {
    let err = |reason| CpuListError {
        input: text.to_owned(),
        reason,
    };
    let trimmed = text.trim();
    let mut ranges: Vec<(u32, u32)> = Vec::new();
    if trimmed.is_empty() {
        return Ok(Vec::new());
    }
    for part in trimmed.split(',') {
        let part = part.trim();
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (
                parse_id(lo).ok_or(err("not a number"))?,
                parse_id(hi).ok_or(err("not a number"))?,
            ),
            None => {
                let id = parse_id(part).ok_or(err("not a number"))?;
                (id, id)
            }
        };
        if lo > hi {
            return Err(err("range runs backwards"));
        }
        if hi > MAX_CPU_ID {
            return Err(err("CPU id beyond the supported maximum"));
        }
        ranges.push((lo, hi));
    }
    // Ranges merged before they are expanded: ids come out once each, and
    // a short list of wide overlapping ranges costs what its ids do, not
    // its ranges times their width.
    ranges.sort_unstable();
    let mut ids = Vec::new();
    let mut next = 0u32; // the lowest id not yet out
    for (lo, hi) in ranges {
        let from = lo.max(next);
        if from <= hi {
            ids.extend(from..=hi);
            next = hi + 1;
        }
    }
    Ok(ids)
}

fn parse_id(s: &str) -> Option<u32> {
    let s = s.trim();
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_and_repeated_ranges_give_each_id_once() {
        assert_eq!(
            parse_cpu_list("4-6,0-2,1-5,3,9,9").unwrap(),
            [0, 1, 2, 3, 4, 5, 6, 9]
        );
        // A hundred copies of the widest range: one copy's ids, not a
        // hundred copies expanded and then deduplicated.
        let wide = vec![format!("0-{MAX_CPU_ID}"); 100].join(",");
        let ids = parse_cpu_list(&wide).unwrap();
        assert_eq!(ids.len(), MAX_CPU_ID as usize + 1);
        assert!(ids.windows(2).all(|w| w[0] + 1 == w[1]));
    }

    #[test]
    fn sparse_ranges_expand_in_order() {
        assert_eq!(
            parse_cpu_list("0-3,8-11").unwrap(),
            vec![0, 1, 2, 3, 8, 9, 10, 11]
        );
    }

    #[test]
    fn single_cpu() {
        assert_eq!(parse_cpu_list("0\n").unwrap(), vec![0]);
    }

    #[test]
    fn empty_list_is_an_empty_set() {
        assert!(parse_cpu_list("").unwrap().is_empty());
        assert!(parse_cpu_list("\n").unwrap().is_empty());
    }

    #[test]
    fn mixed_singles_and_ranges_are_sorted_and_deduplicated() {
        assert_eq!(parse_cpu_list("5,0-2,2,4").unwrap(), vec![0, 1, 2, 4, 5]);
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for bad in [
            "a",
            "1-",
            "-1",
            "1--2",
            "3-1",
            ",",
            "0,,1",
            "1 2",
            "99999999999",
        ] {
            assert!(parse_cpu_list(bad).is_err(), "{bad:?} should not parse");
        }
    }

    #[test]
    fn huge_ids_are_refused() {
        let e = parse_cpu_list("0-4294967295").unwrap_err();
        assert_eq!(e.reason, "CPU id beyond the supported maximum");
    }
}
