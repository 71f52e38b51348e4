//! tokio: sub-tasks in the caller's group, and idle workers that hold
//! nothing charged.

use crate::group::{Group, OverLimit};
use std::future::Future;

/// Spawn `fut` on the current tokio runtime inside the group the caller runs
/// in ([`Group::current`]): a request's sub-task is charged to the request.
/// Outside any group it is spawned as is (its output wrapped in `Ok`).
///
/// Must be called from within a tokio runtime (as `tokio::spawn`).
pub fn spawn_in_current<F>(fut: F) -> tokio::task::JoinHandle<Result<F::Output, OverLimit>>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    match Group::current() {
        Some(g) => tokio::spawn(g.instrument(fut)),
        None => tokio::spawn(async move { Ok(fut.await) }),
    }
}

/// Make `builder`'s worker threads return their allocator reserve
/// ([`crate::alloc::drain_thread`]) whenever they park, so that idle workers
/// hold nothing charged to any group (each holds at most
/// [`crate::alloc::MAX_THREAD_RESERVE`] bytes while it works).
///
/// It takes the builder's one `on_thread_park` callback: a later
/// `on_thread_park` replaces it (tokio keeps one) and the workers stop
/// draining. A program that needs its own park callback calls
/// [`crate::alloc::drain_thread`] from it instead.
///
/// ```
/// let runtime = splitcount::task::drain_on_park(&mut tokio::runtime::Builder::new_multi_thread())
///     .worker_threads(2)
///     .build()
///     .unwrap();
/// # drop(runtime);
/// ```
pub fn drain_on_park(builder: &mut tokio::runtime::Builder) -> &mut tokio::runtime::Builder {
    builder.on_thread_park(|| {
        crate::alloc::drain_thread();
    })
}
