//! [`GroupLayer`]: a tower layer that gives every request of a service a
//! group of its own.

use super::InGroup;
use crate::group::{Group, OverLimit};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower_layer::Layer;
use tower_service::Service;

/// Runs every request of the wrapped service in a group: `make` maps the
/// request to its group (typically a new child of the tenant's group, e.g.
/// `/tenants/{tenant}/req-{id}` with [`Group::child_or_create`] for the
/// tenant); the service builds and runs its response future inside it
/// ([`Group::instrument`]); when the response is ready — or the request is
/// dropped unfinished, a client hanging up — the group is removed
/// (ignored if the handler gave it children of its own). A request that goes
/// over a cooperative limit is stopped at its next poll and answered by
/// `on_breach` (e.g. a 503 or 507 response) while the others carry on.
///
/// `make` returning `None` runs the request outside any group — **outside
/// every limit**: map a request it cannot place (a missing or invalid
/// tenant name, which [`Group::child_or_create`] refuses) to a catch-all
/// group with a limit of its own, unless running it unlimited is meant
/// (`examples/tenant_server.rs` sends such requests to
/// `/tenants-unidentified`). The group
/// covers building the response; a body that the server streams after the
/// response future completed is produced outside it (the bytes the response
/// already holds stay charged to the removed group's ancestors until
/// freed).
///
/// ```
/// use splitcount::group::{Hierarchy, OverLimit};
/// use splitcount::task::GroupLayer;
/// use std::sync::atomic::{AtomicU64, Ordering};
///
/// let memory = Hierarchy::default();
/// let tenants = memory.root().child("tenants").unwrap();
/// let next = AtomicU64::new(0);
/// let layer = GroupLayer::new(
///     move |tenant: &String| {
///         let t = tenants.child_or_create(tenant).ok()?;
///         let req = t.child(&format!("req-{}", next.fetch_add(1, Ordering::Relaxed))).ok()?;
///         req.set_max(16 << 20).ok()?;
///         Some(req)
///     },
///     |over: OverLimit| format!("507 Insufficient Storage: {over}"),
/// );
/// # let _ = layer;
/// ```
pub struct GroupLayer<M, B> {
    make: Arc<M>,
    on_breach: Arc<B>,
}

impl<M, B> GroupLayer<M, B> {
    /// A layer that runs each request in the group `make` gives it, and
    /// answers a breach with `on_breach`.
    pub fn new(make: M, on_breach: B) -> GroupLayer<M, B> {
        GroupLayer {
            make: Arc::new(make),
            on_breach: Arc::new(on_breach),
        }
    }
}

impl<M, B> Clone for GroupLayer<M, B> {
    fn clone(&self) -> Self {
        GroupLayer {
            make: self.make.clone(),
            on_breach: self.on_breach.clone(),
        }
    }
}

impl<M, B> std::fmt::Debug for GroupLayer<M, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupLayer").finish_non_exhaustive()
    }
}

impl<S, M, B> Layer<S> for GroupLayer<M, B> {
    type Service = GroupService<S, M, B>;

    fn layer(&self, inner: S) -> Self::Service {
        GroupService {
            inner,
            make: self.make.clone(),
            on_breach: self.on_breach.clone(),
        }
    }
}

/// The service [`GroupLayer`] makes.
pub struct GroupService<S, M, B> {
    inner: S,
    make: Arc<M>,
    on_breach: Arc<B>,
}

impl<S: Clone, M, B> Clone for GroupService<S, M, B> {
    fn clone(&self) -> Self {
        GroupService {
            inner: self.inner.clone(),
            make: self.make.clone(),
            on_breach: self.on_breach.clone(),
        }
    }
}

impl<S, M, B> std::fmt::Debug for GroupService<S, M, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupService").finish_non_exhaustive()
    }
}

impl<S, M, B, Req> Service<Req> for GroupService<S, M, B>
where
    S: Service<Req>,
    M: Fn(&Req) -> Option<Group>,
    B: Fn(OverLimit) -> S::Response,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        match (self.make)(&req) {
            Some(group) => {
                // Building the future may allocate too: inside the group.
                let fut = group.scope(|| self.inner.call(req));
                ResponseFuture {
                    state: State::Grouped(group.instrument(fut)),
                    group: Some(group),
                    on_breach: self.on_breach.clone(),
                }
            }
            None => ResponseFuture {
                state: State::Plain(self.inner.call(req)),
                group: None,
                on_breach: self.on_breach.clone(),
            },
        }
    }
}

enum State<F> {
    Grouped(InGroup<F>),
    Plain(F),
}

/// The response future of [`GroupService`]: the service's, run in the
/// request's group, which is removed when it completes or is dropped.
pub struct ResponseFuture<F, B> {
    state: State<F>,
    group: Option<Group>,
    on_breach: Arc<B>,
}

impl<F, B> std::fmt::Debug for ResponseFuture<F, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("group", &self.group.as_ref().map(Group::path))
            .finish_non_exhaustive()
    }
}

impl<F, B, R, E> Future for ResponseFuture<F, B>
where
    F: Future<Output = Result<R, E>>,
    B: Fn(OverLimit) -> R,
{
    type Output = Result<R, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: `state` is structurally pinned (never moved out; dropped
        // in place with the struct); `group` and `on_breach` are not pinned.
        let this = unsafe { self.get_unchecked_mut() };
        let out = match &mut this.state {
            // SAFETY: projection of the pinned field, as above.
            State::Plain(f) => match unsafe { Pin::new_unchecked(f) }.poll(cx) {
                Poll::Ready(r) => r,
                Poll::Pending => return Poll::Pending,
            },
            State::Grouped(f) => match unsafe { Pin::new_unchecked(f) }.poll(cx) {
                Poll::Ready(Ok(r)) => r,
                Poll::Ready(Err(over)) => Ok((this.on_breach)(over)),
                Poll::Pending => return Poll::Pending,
            },
        };
        if let Some(g) = this.group.take() {
            let _ = g.remove();
        }
        Poll::Ready(out)
    }
}

impl<F, B> Drop for ResponseFuture<F, B> {
    fn drop(&mut self) {
        if let Some(g) = self.group.take() {
            let _ = g.remove();
        }
    }
}
