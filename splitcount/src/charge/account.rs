//! [`ByteAccount`]: what an allocation's header points at — the group's
//! usage counter, as seen by the allocator.

use crate::charge::UsageCounter;
use crate::sync::Arc;

/// The allocator's handle on a group's usage counter. One per group that
/// ever entered an allocation scope, created outside the allocator (in
/// `Group::enter` (the allocator integration)) and never freed: allocations record its
/// address in their header and may outlive the group, so it must outlive
/// them all. It is small (a pointer); the usage counter it keeps alive is a
/// few hundred bytes. See the module docs for what this means for programs
/// that create groups without bound.
#[derive(Debug)]
pub struct ByteAccount {
    pub(crate) counter: Arc<UsageCounter>,
    /// Called when an allocation charged here is refused (see
    /// `Group::on_alloc_refusal`): a `RefusalHook` as an address, 0 for
    /// none. An atomic word rather than a mutex, so the refusal path takes
    /// no lock (a lock another thread held at a `fork` would never be
    /// released in the child).
    hook: std::sync::atomic::AtomicUsize,
}

/// A refused allocation: the numbers of the usage counter that refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    /// Bytes requested.
    pub request: u64,
    /// The refusing group's limit.
    pub limit: u64,
    /// The refusing group's usage when it refused.
    pub usage: u64,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "allocation of {} bytes refused: limit {}, usage {}",
            self.request, self.limit, self.usage
        )
    }
}

/// Called (with allocations unaccounted) when an allocation is refused;
/// return `true` if it freed memory worth one more try.
pub type RefusalHook = fn(&Refusal) -> bool;

impl ByteAccount {
    /// A leaked account for `counter`.
    pub(crate) fn leak(counter: Arc<UsageCounter>) -> &'static ByteAccount {
        Box::leak(Box::new(ByteAccount {
            counter,
            hook: std::sync::atomic::AtomicUsize::new(0),
        }))
    }

    /// The usage counter bytes are charged to.
    pub fn counter(&self) -> &UsageCounter {
        &self.counter
    }

    /// Install (or, with `None`, remove) the refusal hook.
    pub(crate) fn set_hook(&self, hook: Option<RefusalHook>) {
        // Release: publishes the hook's address (a function: nothing else
        // to publish, but the pairing is free).
        self.hook.store(
            hook.map_or(0, |h| h as usize),
            std::sync::atomic::Ordering::Release,
        );
    }

    /// The refusal hook, if any.
    pub(crate) fn hook(&self) -> Option<RefusalHook> {
        match self.hook.load(std::sync::atomic::Ordering::Acquire) {
            0 => None,
            // SAFETY: only `set_hook` stores non-zero values, each the
            // address of a `RefusalHook`.
            addr => Some(unsafe { std::mem::transmute::<usize, RefusalHook>(addr) }),
        }
    }
}
