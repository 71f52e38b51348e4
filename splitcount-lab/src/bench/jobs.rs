//! What a worker process runs ([`super::worker`]): the one place that
//! knows every suite whose cases run in workers, and hands each request
//! to its suite's slice.
//!
//! | `suite` | `job` | runs |
//! |---|---|---|
//! | `alloc` | an allocator workload ([`super::alloc::Workload`]) | [`super::alloc::workloads::run_slice`], thread `t` in group `t` |
//! | `async` | a request mode ([`super::requests::Mode`]) | [`super::requests::run_slice`], its groups under group 0 |
//! | `noisy` | a noisy-neighbour case ([`super::noisy::Case`]) | [`super::noisy::run_slice`], its groups under group 0 |
//!
//! (`preload` sends `alloc` workloads: its workers differ only by their
//! environment.)

use super::alloc::workloads;
use super::worker::{Context, Request};
use super::{noisy, requests};
use crate::timing::slice::SliceRun;

/// Run one slice of `request` in this worker.
pub fn run(request: &Request, context: &Context) -> Result<SliceRun, String> {
    let first = || context.groups.first().ok_or("the worker has no group");
    match request.suite.as_str() {
        workloads::SUITE => workloads::run_slice(
            request.job()?,
            request.threads,
            request.spec,
            &context.groups,
            &context.doc,
        ),
        requests::SUITE => {
            requests::run_slice(request.job()?, request.threads, request.spec, first()?)
        }
        noisy::SUITE => noisy::run_slice(request.job()?, request.spec, first()?),
        other => Err(format!("no suite {other:?} runs in workers")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timing::slice::SliceSpec;
    use std::time::Duration;

    #[test]
    fn a_request_of_an_unknown_suite_or_case_is_an_error_not_a_panic() {
        let spec = SliceSpec {
            length: Duration::from_millis(1),
            batch: 1,
        };
        let context = Context {
            groups: Vec::new(),
            doc: String::new(),
        };
        let unknown = Request::new("nope", &"small", 1, spec).unwrap();
        assert!(run(&unknown, &context).unwrap_err().contains("nope"));
        let bad = Request::new(workloads::SUITE, &"huge", 1, spec).unwrap();
        assert!(run(&bad, &context)
            .unwrap_err()
            .contains("not a alloc case"));
    }
}
