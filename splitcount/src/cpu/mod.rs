//! Layer 1: *where am I, and what machine is this.*
//!
//! - [`current_cpu`] / [`current_cpu_id`]: the CPU the calling thread runs on,
//!   read from the rseq area (see [`CpuIdSource`] for the fallbacks). The
//!   answer is a hint — the thread can migrate right after — so every per-CPU
//!   update in splitcount stays correct when it is stale.
//! - [`mm_cid`]: the rseq concurrency id (Linux ≥ 6.3), a compact id bounded
//!   by the number of threads that actually run at once.
//! - [`Topology`]: possible and online CPUs (sparse kernel ids mapped to dense
//!   indices), NUMA nodes, cache sharing; read from sysfs with a fallback.
//! - [`Machine`]: the host or a simulated machine, accepted wherever per-CPU
//!   state is created.

mod cpulist;
mod current;
mod machine;
mod rseq;
mod topology;

pub use cpulist::{parse_cpu_list, CpuListError, MAX_CPU_ID};
pub use current::{
    cpu_id_source, current_cpu, current_cpu_id, getcpu_syscall, mm_cid, mm_cid_available,
    rseq_cpu_id, rseq_owner, sched_getcpu, thread_index, CpuIdSource, RseqOwner,
};
pub use machine::{Machine, MachineError};

#[cfg(target_os = "linux")]
pub(crate) use current::area as rseq_area;
#[cfg(all(target_os = "linux", target_arch = "x86_64", not(loom)))]
pub(crate) use current::glibc_fs_offset;
#[cfg(all(target_os = "linux", target_arch = "x86_64", not(loom)))]
pub(crate) use rseq::{CPU_ID_OFFSET, MM_CID_OFFSET};
pub use topology::{CacheLevel, Topology, TopologyError, TopologySource, MAX_CPUS, MAX_NODES};
