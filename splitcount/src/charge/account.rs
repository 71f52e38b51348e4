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
}

impl ByteAccount {
    /// A leaked account for `counter`.
    pub(crate) fn leak(counter: Arc<UsageCounter>) -> &'static ByteAccount {
        Box::leak(Box::new(ByteAccount { counter }))
    }

    /// The usage counter bytes are charged to.
    pub fn counter(&self) -> &UsageCounter {
        &self.counter
    }
}
