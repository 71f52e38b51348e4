//! `splitcount-lab machine`: the detected shape, the CPU and its host, and
//! where the CPU id comes from.

pub mod host;
pub mod memory;

use serde::Serialize;
use splitcount::cpu::{self, CpuIdSource, Topology, TopologySource};
use splitcount::raw::cpu_id::{self, RseqOwner};
use splitcount::raw::percpu::{AddPath, Arena};

/// What `machine --json` prints (and `report.json` embeds).
#[derive(Debug, Clone, Serialize)]
pub struct MachineInfo {
    /// Number of possible CPUs (size of per-CPU arrays).
    pub possible_cpus: usize,
    /// Kernel ids of the possible CPUs, as a CPU list.
    pub possible_cpu_list: String,
    /// Number of CPUs online when detected.
    pub online_cpus: usize,
    /// NUMA nodes that have CPUs.
    pub numa_nodes: usize,
    /// Where the current CPU id comes from.
    pub cpu_id_source: CpuIdSource,
    /// Whether the rseq concurrency id is readable.
    pub mm_cid_available: bool,
    /// Who registered the rseq area in use.
    pub rseq_registered_by: RseqOwner,
    /// How the host arena adds to this CPU's slot: `rseq` or `atomic`.
    pub percpu_add: AddPath,
    /// Where the shape came from.
    pub topology_source: TopologySource,
    /// Cache levels: how many domains and how many CPUs share each.
    pub caches: Vec<CacheSummary>,
    /// The kernel release (`uname -r`).
    pub kernel: String,
    /// The dense index of the CPU this command ran on.
    pub current_cpu: usize,
    /// The CPU vendor, from `/proc/cpuinfo`.
    pub cpu_vendor: String,
    /// The CPU model, from `/proc/cpuinfo`.
    pub cpu_model: String,
    /// Hypervisor or container, as far as detectable.
    pub virtualization: String,
    /// Whether hardware performance counters can be read here.
    pub perf_counters: String,
    /// Where the lab pins two threads, and whether they share a core.
    pub two_threads: String,
    /// A cache line's round trip between the two CPUs two threads are
    /// pinned to, in ns (`None` with one CPU).
    pub line_round_trip_ns: Option<f64>,
}

/// One cache level, summarized.
#[derive(Debug, Clone, Serialize)]
pub struct CacheSummary {
    /// Level (1, 2, 3).
    pub level: u32,
    /// Data, Instruction or Unified.
    pub kind: String,
    /// Number of separate caches at this level.
    pub domains: usize,
    /// CPUs sharing the largest one.
    pub cpus_per_domain: usize,
}

impl MachineInfo {
    /// Detect the host.
    pub fn detect() -> MachineInfo {
        let t = Topology::host();
        let model = host::cpu_model();
        MachineInfo {
            possible_cpus: t.cpus(),
            possible_cpu_list: cpu_list(t.possible_ids()),
            online_cpus: t.online().len(),
            numa_nodes: t.nodes(),
            cpu_id_source: cpu_id::cpu_id_source(),
            mm_cid_available: cpu_id::mm_cid_available(),
            rseq_registered_by: cpu_id::rseq_owner(),
            percpu_add: Arena::host().add_path(),
            topology_source: t.source(),
            caches: t
                .caches()
                .iter()
                .map(|c| CacheSummary {
                    level: c.level,
                    kind: c.kind.clone(),
                    domains: c.domains.len(),
                    cpus_per_domain: c.domains.iter().map(Vec::len).max().unwrap_or(0),
                })
                .collect(),
            kernel: kernel_release(),
            current_cpu: cpu::current_cpu(),
            cpu_vendor: model.vendor,
            cpu_model: model.model,
            virtualization: host::virtualization(),
            perf_counters: host::perf_counters(),
            two_threads: host::two_thread_placement(),
            line_round_trip_ns: host::line_round_trip_ns(),
        }
    }

    /// Print a readable summary.
    pub fn print(&self) {
        outln!("machine");
        outln!("  CPU             {} ({})", self.cpu_model, self.cpu_vendor);
        outln!("  virtualisation  {}", self.virtualization);
        outln!("  perf counters   {}", self.perf_counters);
        outln!("  2 threads       {}", self.two_threads);
        if let Some(ns) = self.line_round_trip_ns {
            outln!("  line round trip {ns:.0} ns between those two CPUs");
        }
        outln!(
            "  CPUs            {} possible ({}), {} online",
            self.possible_cpus,
            self.possible_cpu_list,
            self.online_cpus
        );
        outln!("  NUMA nodes      {}", self.numa_nodes);
        outln!("  CPU id source   {}", self.cpu_id_source.name());
        outln!("  rseq area       registered by {}", self.rseq_owner_name());
        outln!(
            "  mm_cid          {}",
            if self.mm_cid_available {
                "available"
            } else {
                "not available"
            }
        );
        for c in &self.caches {
            outln!(
                "  L{} {:<12} {} domain(s), up to {} CPU(s) each",
                c.level,
                c.kind,
                c.domains,
                c.cpus_per_domain
            );
        }
        outln!("  kernel          {}", self.kernel);
        outln!("  topology from   {}", name_of(&self.topology_source));
    }

    /// Who registered the rseq area, in words (`glibc`, `splitcount`, or
    /// no one).
    pub fn rseq_owner_name(&self) -> String {
        match self.rseq_registered_by {
            RseqOwner::None => "no one (no rseq area)".to_owned(),
            other => name_of(&other),
        }
    }

    /// How per-CPU adds are made, in words (`rseq`, `atomic`).
    pub fn percpu_add_name(&self) -> String {
        name_of(&self.percpu_add)
    }

    /// Where the topology came from, in words (`sysfs`, `fallback`).
    pub fn topology_source_name(&self) -> String {
        name_of(&self.topology_source)
    }
}

/// A value's name as the machine's JSON writes it (the library's serde
/// names: `glibc`, `rseq`, `sysfs`), not Rust's `Debug` (`Glibc`, `Rseq`).
fn name_of<T: Serialize + std::fmt::Debug>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|j| j.as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("{v:?}"))
}

/// Format sorted ids back into the kernel's list format.
fn cpu_list(ids: &[u32]) -> String {
    let mut out = Vec::new();
    let mut i = 0;
    while i < ids.len() {
        let mut j = i;
        while j + 1 < ids.len() && ids[j + 1] == ids[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            ids[i].to_string()
        } else {
            format!("{}-{}", ids[i], ids[j])
        });
        i = j + 1;
    }
    out.join(",")
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| std::env::consts::OS.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_round_trip_through_the_kernel_format() {
        assert_eq!(cpu_list(&[0, 1, 2, 3, 8, 9, 10, 11]), "0-3,8-11");
        assert_eq!(cpu_list(&[0]), "0");
        assert_eq!(cpu_list(&[]), "");
        assert_eq!(cpu_list(&[1, 3, 4]), "1,3-4");
    }
}
