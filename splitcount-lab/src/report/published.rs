//! Figures the anchors published, for the report's "published" column; the
//! repository's `IMPLEMENTATION.md`, §9 ("Published figures and their
//! sources") names where each was measured. They were measured elsewhere,
//! on other machines and workloads: context for this machine's numbers,
//! never a baseline for them.

use serde::Serialize;

/// One published figure, attached to a case of a suite.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Published {
    /// The suite it belongs to.
    pub suite: &'static str,
    /// The case whose row shows it.
    pub case: &'static str,
    /// For accuracy rows: the simulated CPU count whose row shows it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpus: Option<usize>,
    /// The figure, short enough for a table cell.
    pub figure: &'static str,
    /// Where and how it was measured.
    pub source: &'static str,
    /// Always true: the figure was not measured by this run.
    pub measured_elsewhere: bool,
}

const fn fig(
    suite: &'static str,
    case: &'static str,
    cpus: Option<usize>,
    figure: &'static str,
    source: &'static str,
) -> Published {
    Published {
        suite,
        case,
        cpus,
        figure,
        source,
        measured_elsewhere: true,
    }
}

/// Pages of 4 KiB that `percpu_counter` may be off by on 384 CPUs at the
/// kernel's default batch `max(32, 2·384) = 768`: `384·(768 − 1)`.
pub const PERCPU_COUNTER_384: u64 = 384 * (768 - 1);

/// The kernel's hierarchical counter at batch 32 on 384–512 CPUs: about
/// 49 K units on each side (192 MiB of 4 KiB pages).
pub const KERNEL_TREE_384_512: u64 = 192 * 1024 * 1024 / 4096;

/// Errors observed with CPU-hopping mmap on 256 vCPUs, in 4 KiB pages:
/// 80 MB for the hierarchical counter, 1 GB for `percpu_counter`.
pub const OBSERVED_256: [(&str, u64); 2] = [
    ("tree", 80_000_000 / 4096),
    ("batched", 1_000_000_000 / 4096),
];

/// Every published figure the report shows.
pub const ALL: &[Published] = &[
    fig(
        "counters",
        "shared-atomic",
        None,
        "hundreds of ns/add at 64 threads",
        "the kernel's per-CPU counter history: a single shared atomic under 64 writers, vs a \
         few ns per-CPU (IMPLEMENTATION.md §9)",
    ),
    fig(
        "accuracy",
        "batched",
        Some(384),
        "384·767 = 294,528 (≈1.15 GiB)",
        "kernel percpu_counter, 384 CPUs, batch max(32, 2·384) = 768: bound ncpu·(batch−1) \
         pages of 4 KiB (294,528 pages are 1.12 GiB; published as ≈1.15 GiB)",
    ),
    fig(
        "accuracy",
        "tree",
        Some(384),
        "≈49 K each side (192 MiB)",
        "kernel hierarchical counter, batch 32, 384–512 CPUs",
    ),
    fig(
        "accuracy",
        "tree",
        Some(512),
        "≈49 K each side (192 MiB)",
        "kernel hierarchical counter, batch 32, 384–512 CPUs",
    ),
    fig(
        "watchdog",
        "batched",
        None,
        "≈1 GB observed on 256 vCPUs",
        "percpu_counter RSS drift under CPU-hopping mmap, 256 vCPUs (HPCC v16, 2026)",
    ),
    fig(
        "watchdog",
        "tree",
        None,
        "80 MB observed on 256 vCPUs",
        "hierarchical counter RSS drift under CPU-hopping mmap, 256 vCPUs (HPCC v16, 2026); \
         OOM victim selection over 10,000 processes 80 ms → 7.9 ms",
    ),
    fig(
        "layout",
        "packed-reader",
        None,
        "−27% throughput (≈×1.37 time)",
        "will-it-scale page_fault3, one field move in struct mem_cgroup",
    ),
    fig(
        "charge",
        BASELINE_CHARGE,
        None,
        "40.2 M faults/60 s",
        MEMCG_2009_NONE,
    ),
    fig(
        "charge",
        "usage-counter",
        None,
        "18.4 M faults/60 s (×2.18 time)",
        MEMCG_2009_CHILD,
    ),
    fig(
        "charge",
        "stock",
        None,
        "34.2 M faults/60 s (×1.18 time)",
        MEMCG_2009_STOCK,
    ),
    fig(
        "fault",
        BASELINE_CHARGE,
        None,
        "40.16 M faults/60 s; 27.67 misses/fault",
        MEMCG_2009_NONE,
    ),
    fig(
        "fault",
        "usage-counter",
        None,
        "18.44 M (×0.46); 69.96 misses/fault",
        MEMCG_2009_CHILD,
    ),
    fig(
        "fault",
        "stock",
        None,
        "34.22 M (×0.85); 34.69 misses/fault",
        MEMCG_2009_STOCK,
    ),
    fig(
        "charge",
        "4-tenants-7-slots",
        None,
        "+14% at 6 clients, +145% at 36",
        "kernel 6.16 multi-memcg stock vs one slot, 72 CPUs, netperf, one cgroup per client",
    ),
];

const BASELINE_CHARGE: &str = crate::bench::charge::BASELINE;

/// The rows of the kernel's 2009 table (a map/fault/unmap loop, one task
/// per CPU, faults in 60 s and cache misses per fault), shown by `charge`
/// and `fault`.
const MEMCG_2009_NONE: &str = "kernel memcg, 8 CPUs, 2009: no memcg";
const MEMCG_2009_CHILD: &str = "kernel memcg, 8 CPUs, 2009: child cgroup, no charge coalescing";
const MEMCG_2009_STOCK: &str = "kernel memcg, 8 CPUs, 2009: uncharge+charge coalescing (the stock)";

/// The published figures of `suite`.
pub fn of(suite: &str) -> Vec<Published> {
    ALL.iter().copied().filter(|p| p.suite == suite).collect()
}

/// The figure for a row of `suite`, if one was published.
pub fn cell(suite: &str, case: &str, cpus: Option<usize>) -> String {
    ALL.iter()
        .find(|p| p.suite == suite && p.case == case && p.cpus == cpus)
        .map_or_else(String::new, |p| p.figure.to_owned())
}

/// The notes that name the sources of a suite's published figures.
pub fn notes(suite: &str) -> Vec<String> {
    let mut sources: Vec<&str> = of(suite).iter().map(|p| p.source).collect();
    sources.dedup();
    sources
        .into_iter()
        .map(|s| format!("published, measured elsewhere: {s}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_points_follow_from_their_formulas() {
        assert_eq!(PERCPU_COUNTER_384, 294_528);
        assert_eq!(KERNEL_TREE_384_512, 49_152);
        // 294,528 pages of 4 KiB: 1.12 GiB, the "≈1.15 GiB" of the anchors.
        let gib = PERCPU_COUNTER_384 as f64 * 4096.0 / (1u64 << 30) as f64;
        assert!((1.1..1.2).contains(&gib));
    }

    #[test]
    fn the_fault_suite_shows_the_kernel_table_in_throughput_ratios() {
        // 18.44 / 40.16 and 34.22 / 40.16, as the seed's table reads them.
        assert_eq!(format!("{:.2}", 18.44 / 40.16), "0.46");
        assert_eq!(format!("{:.2}", 34.22 / 40.16), "0.85");
        assert!(cell("fault", "stock", None).starts_with("34.22 M (×0.85)"));
        assert_eq!(notes("fault").len(), 3);
    }

    #[test]
    fn every_figure_is_marked_as_measured_elsewhere() {
        assert!(ALL.iter().all(|p| p.measured_elsewhere));
        assert_eq!(cell("accuracy", "batched", Some(384)), ALL[1].figure);
        assert_eq!(cell("accuracy", "batched", Some(256)), "");
    }
}
