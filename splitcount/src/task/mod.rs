//! Async: a request's allocations charged to its group across `.await`
//! points and worker threads, and its limit turned into a clean failure.
//!
//! A future's polls run on whatever worker thread the runtime picks, and
//! other tasks run on the same thread in between; a thread-bound scope
//! ([`crate::group::Group::enter`]) cannot follow it (its guard is not
//! `Send`, and under a `LocalSet` it would charge whichever task runs next
//! to the suspended one's group).
//! [`Group::instrument`](crate::group::Group::instrument) wraps the future
//! instead: every poll runs inside the group, and a breach of a cooperative
//! limit ([`crate::charge::Enforcement::Cooperative`]) ends it with
//! `Err(OverLimit)` at the next poll — one request fails alone.
//!
//! ```no_run
//! # async fn handler() -> usize { 0 }
//! # async fn serve(memory: splitcount::group::Hierarchy) -> Result<(), splitcount::group::GroupError> {
//! let request = memory.root().child("request-17")?;
//! request.set_max(64 << 20)?;
//! match request.instrument(handler()).await {
//!     Ok(bytes) => println!("served {bytes} bytes"),
//!     Err(over) => println!("request failed alone: {over}"),
//! }
//! request.remove()?;
//! # Ok(()) }
//! ```
//!
//! With the `tokio` feature, [`spawn_in_current`] spawns sub-tasks in the
//! caller's group and [`drain_on_park`] returns an idle worker's reserve;
//! with `tower`, [`GroupLayer`] gives every request of a service a group.

mod in_group;
#[cfg(feature = "tower")]
mod layer;
#[cfg(feature = "tokio")]
mod runtime;

pub use in_group::InGroup;
#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub use layer::{GroupLayer, GroupService, ResponseFuture};
#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
pub use runtime::{drain_on_park, spawn_in_current};
