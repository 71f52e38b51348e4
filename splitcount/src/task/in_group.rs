//! [`InGroup`]: a future that runs inside a group (tracing's `Instrument`,
//! Saluki's `Track`).

use crate::group::{AccountKey, Group, OverLimit};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// A future whose every poll runs inside a group: allocations made while it
/// is polled — on any worker thread — are charged to that group, and none
/// of another task's are. After each poll it checks the group
/// ([`Group::check`]); on a breach it drops the inner future (freeing what
/// it held) and resolves to `Err(OverLimit)`. A future that completes in
/// the poll that breached resolves to its output: finished work is not
/// thrown away.
///
/// Made by [`Group::instrument`]. `Send` when the inner future is; no
/// allocation and no atomic instruction per poll (it holds its group's
/// allocator account for its whole life). Polling it after it completed
/// panics, as for most futures.
#[must_use = "futures do nothing unless polled"]
pub struct InGroup<F> {
    group: Group,
    account: AccountKey,
    inner: Option<F>,
}

impl<F> std::fmt::Debug for InGroup<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InGroup")
            .field("group", &self.group.path())
            .field("done", &self.inner.is_none())
            .finish()
    }
}

impl<F> InGroup<F> {
    /// The group the future runs in.
    pub fn group(&self) -> &Group {
        &self.group
    }
}

impl<F: Future> Future for InGroup<F> {
    type Output = Result<F::Output, OverLimit>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: `inner` is structurally pinned: it is never moved out of
        // the `Option` (only polled through a pinned reference and dropped
        // in place by `Pin::set`); the other fields are not pinned.
        let this = unsafe { self.get_unchecked_mut() };
        let mut inner = unsafe { Pin::new_unchecked(&mut this.inner) };
        let Some(fut) = inner.as_mut().as_pin_mut() else {
            panic!("InGroup polled after it completed");
        };
        if let Err(over) = this.group.check() {
            inner.set(None);
            return Poll::Ready(Err(over));
        }
        let polled = {
            let _in_group = crate::alloc::enter_held(this.account);
            fut.poll(cx)
        };
        match polled {
            Poll::Ready(out) => {
                inner.set(None);
                Poll::Ready(Ok(out))
            }
            Poll::Pending => match this.group.check() {
                Ok(()) => Poll::Pending,
                Err(over) => {
                    inner.set(None);
                    Poll::Ready(Err(over))
                }
            },
        }
    }
}

impl<F> Drop for InGroup<F> {
    fn drop(&mut self) {
        self.account.release(1);
    }
}

impl Group {
    /// Run `fut` inside this group: see [`InGroup`].
    ///
    /// ```
    /// use splitcount::group::Hierarchy;
    /// let h = Hierarchy::default();
    /// let request = h.root().child("request").unwrap();
    /// let fut = request.instrument(async { 6 * 7 });
    /// # let out = futures_lite_block_on(fut);
    /// # assert_eq!(out, Ok(42));
    /// # fn futures_lite_block_on<F: std::future::Future>(f: F) -> F::Output {
    /// #     use std::task::{Context, Poll, Waker};
    /// #     let mut f = std::pin::pin!(f);
    /// #     let mut cx = Context::from_waker(Waker::noop());
    /// #     loop { if let Poll::Ready(v) = f.as_mut().poll(&mut cx) { return v; } }
    /// # }
    /// ```
    pub fn instrument<F: Future>(&self, fut: F) -> InGroup<F> {
        let account = self.account();
        account.retain(1);
        InGroup {
            group: self.clone(),
            account,
            inner: Some(fut),
        }
    }

    /// The group the calling code runs in: the group of the innermost
    /// [`Group::enter`] scope or [`InGroup`] poll on this thread, `None`
    /// outside any (allocations then charge the attached hierarchy's root).
    ///
    /// ```
    /// use splitcount::group::{Group, Hierarchy};
    /// let h = Hierarchy::default();
    /// let g = h.root().child("g").unwrap();
    /// assert!(Group::current().is_none());
    /// g.scope(|| assert_eq!(Group::current().unwrap(), g));
    /// ```
    pub fn current() -> Option<Group> {
        crate::alloc::current().and_then(|a| a.group())
    }
}
