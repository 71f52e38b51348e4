//! Layer 4: *hierarchical usage with limits, and the per-CPU stock.*
//!
//! - [`UsageCounter`]: the kernel's `page_counter` — usage charged at a
//!   counter and all its ancestors, a hard limit that refuses charges, a soft
//!   limit that only counts events, a peak watermark, events.
//! - [`Stock`]: per-CPU slots of pre-charged units for several counters, so
//!   that most charges touch no shared cache line.
//!
//! The charge path that combines them with reclaim and out-of-memory hooks
//! is [`crate::group::Group::charge`].

pub(crate) mod stock;
#[cfg(all(target_os = "linux", target_arch = "x86_64", not(loom)))]
mod stock_rseq;
pub(crate) mod usage;

// The stock and the usage counter are building blocks of groups, public
// under `crate::raw` only.
pub use stock::StockActivity;
pub(crate) use stock::DEFAULT_BUDGET_BATCHES;
pub(crate) use stock::{Consumed, Stock, StockError, StockKey, MAX_STOCK_BATCH, MAX_STOCK_SLOTS};
pub(crate) use usage::UsageCounter;
pub use usage::{Busy, Enforcement, Events, MAX_REQUEST, MAX_USAGE, UNLIMITED};
