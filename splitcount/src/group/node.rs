//! The state of one group and its memory layout.
//!
//! ```text
//!  UsageCounter (own allocation)        Node
//!  ┌ line: usage, watermark ┐ hot        ┌ line: usage ptr, parent, removed ┐ read-mostly
//!  ├ line: max, high       ┤ read-most. ├ id, path                          ┤ cold
//!  └ line: event counts    ┘ slow path  └ hooks (mutex)                     ┘ cold
//! ```
//!
//! Write-hot fields (usage, watermark), read-mostly fields (limits, parent,
//! the removed flag) and cold ones (name, hooks, events) sit on separate
//! 128-byte-aligned lines (`CachePadded`; 128 on x86_64 because the spatial
//! prefetcher fetches lines in pairs), so a charge on one CPU never
//! invalidates the line another CPU reads a limit from. The lab's `layout`
//! suite shows what the packed alternative costs.

use super::hooks::Hooks;
use crate::charge::{ByteAccount, UsageCounter};
use crate::stat::StatGroup;
use crate::sync::{
    AtomicBool, Mutex,
    Ordering::{Acquire, Release},
};
use crossbeam_utils::CachePadded;
use std::sync::Arc;

/// Read-mostly: read by every charge.
pub(crate) struct Hot {
    pub(crate) usage: crate::sync::Arc<UsageCounter>,
    pub(crate) stats: Arc<StatGroup>,
    pub(crate) parent: Option<Arc<Node>>,
    removed: AtomicBool,
}

pub(crate) struct Node {
    read: CachePadded<Hot>,
    pub(crate) id: u64,
    pub(crate) path: String,
    pub(crate) hooks: Mutex<Hooks>,
    /// The allocator integration's account of this group, made on first
    /// `enter()`.
    pub(crate) alloc_account: std::sync::OnceLock<&'static ByteAccount>,
}

impl std::ops::Deref for Node {
    type Target = Hot;
    fn deref(&self) -> &Hot {
        &self.read
    }
}

impl Node {
    pub(crate) fn new(
        id: u64,
        parent: Option<Arc<Node>>,
        path: String,
        usage: crate::sync::Arc<UsageCounter>,
        stats: Arc<StatGroup>,
    ) -> Node {
        Node {
            read: CachePadded::new(Hot {
                usage,
                stats,
                parent,
                removed: AtomicBool::new(false),
            }),
            id,
            path,
            hooks: Mutex::new(Hooks::default()),
            alloc_account: std::sync::OnceLock::new(),
        }
    }

    #[inline]
    pub(crate) fn is_removed(&self) -> bool {
        // Acquire: pairs with `mark_removed`; a charger that sees the flag
        // also sees the tree change that preceded it.
        self.removed.load(Acquire)
    }

    pub(crate) fn mark_removed(&self) {
        self.removed.store(true, Release);
    }

    /// The node whose usage counter is `counter`: this one or an ancestor.
    pub(crate) fn find(self: &Arc<Self>, counter: &UsageCounter) -> Arc<Node> {
        let mut n = self.clone();
        loop {
            if std::ptr::eq(&*n.usage, counter) {
                return n;
            }
            n = match n.parent.clone() {
                Some(p) => p,
                None => return self.clone(),
            };
        }
    }
}

impl Drop for Node {
    /// Drop the chain of parents this node held the last reference to one
    /// by one, instead of recursively: a chain of tens of thousands of
    /// groups must not overflow the stack when its last handle goes.
    fn drop(&mut self) {
        let mut next = self.read.parent.take();
        while let Some(parent) = next {
            match Arc::try_unwrap(parent) {
                Ok(mut node) => next = node.read.parent.take(),
                Err(_) => break, // someone else keeps it (and its parents)
            }
        }
    }
}
