//! Layer 6: *the public facade — a tree of named groups.*
//!
//! A [`Hierarchy`] is a tree of [`Group`]s. Each group has a usage counter
//! with a hard limit (`max`), a soft limit (`high`), a peak and events; the
//! hierarchy keeps per-CPU stocks of pre-charged units so that most charges
//! touch no shared cache line. See [`Group::charge`] for the charge path.
//!
//! ```
//! use splitcount::group::Hierarchy;
//!
//! let h = Hierarchy::default();
//! let tenant = h.root().child("tenant-a").unwrap();
//! tenant.set_max(256).unwrap();
//! let query = tenant.child("query-17").unwrap();
//! query.charge(200).unwrap();
//! let err = query.charge(100).unwrap_err();
//! assert_eq!(err.group(), "/tenant-a");
//! query.uncharge(200);
//! h.drain_stocks();
//! assert_eq!(tenant.usage(), 0);
//! ```

mod account;
pub mod cgroup;
mod error;
mod events;
mod extensions;
mod flusher;
mod handle;
mod hierarchy;
mod hooks;
mod name;
mod node;
mod reclaim;
mod reservation;
mod snapshot;

pub(crate) use account::AccountKey;
pub use error::{
    ChargeError, ChargeErrorKind, Consumer, GroupError, OverLimit, Refusal, ThreadError,
    TOP_CONSUMERS,
};
pub(crate) use events::emit as emit_event;
pub use events::{EventHook, EventKind, EventReceiver, GroupEvent};
pub use extensions::Extensions;
pub use handle::Group;
pub(crate) use hierarchy::{Bytes, Shared};
pub use hierarchy::{Hierarchy, HierarchyConfig, DEFAULT_FLUSH_PERIOD, MIN_FLUSH_PERIOD};
pub(crate) use hooks::run as run_hook;
pub use hooks::{AllocRefusalHook, OomHook, PressureHook, ReclaimHook};
#[doc(hidden)]
pub use name::cut_for_message;
pub use name::{validate_name, MAX_NAME_LEN};
pub use node::BreachMode;
pub(crate) use node::{mark_breached, Node};
pub use reclaim::MAX_RECLAIM_RETRIES;
pub use reservation::{Reservation, ReservationMode};
pub use snapshot::{GroupSnapshot, Snapshot, SnapshotOptions};
