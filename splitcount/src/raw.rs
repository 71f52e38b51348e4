//! The building blocks under the group API, for benchmarks, tests and users
//! who build their own accounting from them: the per-CPU arena, the stock,
//! a group's usage counter and the individual CPU-id sources.
//!
//! Everything here is public because the lab measures it and a few users
//! need it, not because a server needs it: [`crate::Hierarchy`],
//! [`crate::Group`] and [`crate::Accounted`] are the API. Using these
//! directly can make a group's figures disagree with what it was charged
//! (a [`UsageCounter`] charged around a group's stock, say), so each item
//! says what it is safe for.
//!
//! | item | why it is public |
//! |---|---|
//! | [`percpu`] (`Arena`, `PerCpu`, …) | per-CPU memory with rseq adds: the lab's `bench percpu`, and counters of one's own design; [`crate::counter::Config::arena`] takes an `Arena` |
//! | [`Stock`], [`StockKey`], [`Consumed`], [`Leftovers`], [`StockError`] | the per-CPU pre-charged stock alone: its loom model and the lab's `bench charge` |
//! | [`UsageCounter`], [`usage_counter`] | a group's limit counter without the stock: the lab's `bench charge` baseline and the limit-race stress tests |
//! | [`cpu_id`] | each CPU-id source on its own: the lab's `bench cpu-id` and `machine` |

pub use crate::charge::stock::{
    Consumed, Leftovers, Stock, StockError, StockKey, ADMIT_EVERY, ADMIT_EVERY_MAX,
    DEFAULT_BUDGET_BATCHES, MAX_STOCK_BATCH, MAX_STOCK_SLOTS, RECENT_VICTIMS, WINDOW,
};
pub use crate::charge::usage::UsageCounter;

/// Per-CPU memory: an arena with one region per CPU and allocations at the
/// same offset in every region (see the crate's IMPLEMENTATION.md, §2).
pub mod percpu {
    pub use crate::percpu::{
        default_add_path, rseq_available, AddPath, Arena, ArenaError, ArenaOptions, PerCpu,
        SlotIndex, REGION_BYTES, REGION_SLOTS,
    };
}

/// The CPU-id sources one by one ([`crate::cpu::current_cpu`] picks the
/// best).
pub mod cpu_id {
    pub use crate::cpu::current::{
        cpu_id_source, current_cpu_id, getcpu_syscall, mm_cid, mm_cid_available, rseq_cpu_id,
        rseq_owner, sched_getcpu, thread_index, RseqOwner,
    };
    pub use crate::cpu::{parse_cpu_list, CpuListError, MAX_CPU_ID};
}

/// A group's usage counter (limit, usage, events), charged without the
/// stock: what the group's stock charges in batches. Charging it directly
/// bypasses the group's hooks, events and stock — for benchmarks and
/// stress tests.
pub fn usage_counter(group: &crate::Group) -> &UsageCounter {
    group.usage_counter()
}
