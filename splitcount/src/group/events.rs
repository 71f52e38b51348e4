//! Being told when a group's state changes: its usage crossed `high` (up or
//! back down), the charge path reached its OOM stage, a charge was refused,
//! or an allocation went over a cooperative limit.
//!
//! Each is delivered **once per crossing**, not once per charge: a group
//! hammered at its limit reports one refusal until an uncharge takes its
//! usage back below `max`, one breach until [`Group::clear_breach`], one
//! crossing of `high` until the usage is back at or below it.
//!
//! ```
//! use splitcount::group::{EventKind, Hierarchy};
//!
//! let h = Hierarchy::default();
//! let tenant = h.root().child("tenant").unwrap();
//! tenant.set_high(100);
//! let events = tenant.event_channel(16).unwrap();
//! tenant.charge(200).unwrap();           // crosses high (the stock batch charges the counter)
//! tenant.uncharge(200);
//! h.drain_stocks();                      // back under high
//! let kinds: Vec<EventKind> = events.try_iter().map(|e| e.kind).collect();
//! assert_eq!(kinds, [EventKind::HighCrossed, EventKind::BackUnderHigh]);
//! ```
//!
//! **Where and when.** Subscribers run on the thread whose charge or
//! uncharge made the transition, right after it — also inside the global
//! allocator, so always with allocator accounting off (what they allocate is
//! not charged), and under `catch_unwind` (a panicking subscriber is
//! skipped). Keep them short; an [`EventReceiver`] hands events to a thread
//! of your own.
//!
//! **Ordering.** Transitions are detected where the usage counter is
//! charged or uncharged, which the per-CPU stock batches: a crossing is seen
//! when a batch reaches the counter, not at the exact unit. Each event
//! carries a sequence number, per group, in the order the transitions won
//! their flags; two threads may deliver two events of one group
//! concurrently, so a subscriber that needs the order sorts by `seq`.
//!
//! **What may be missed.** A channel that is full drops the event and
//! counts it ([`EventReceiver::dropped`]). A charge and an uncharge racing
//! around `high` may report one crossing twice (never none). Events of a
//! group are delivered to its own subscribers only (subscribe on an
//! ancestor for the ancestor's limits).

use super::node::Node;
use super::Group;
use crate::charge::usage::CounterEvent;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// What happened to a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EventKind {
    /// A charge took the usage above `high` (from at or below it). `limit`
    /// is `high`.
    HighCrossed,
    /// An uncharge took the usage back to or below `high`. `limit` is
    /// `high`.
    BackUnderHigh,
    /// A charge did not fit after reclaim and draining: the OOM hooks ran.
    /// `limit` is `max`.
    Oom,
    /// A charge was refused by `max` (a `Group::charge` error, or a null
    /// from the allocator). `limit` is `max`.
    MaxRefused,
    /// An allocation went over a cooperative limit and was let through
    /// (the group is breached until [`Group::clear_breach`]). `limit` is
    /// `max`.
    Breached,
}

/// One event of a group.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct GroupEvent {
    /// What happened.
    pub kind: EventKind,
    /// The group it happened to (the group whose limit is concerned).
    pub group: Group,
    /// Its usage at the transition.
    pub usage: u64,
    /// The limit concerned (see [`EventKind`]).
    pub limit: u64,
    /// Its number among the group's events, in the order they were
    /// detected.
    pub seq: u64,
}

/// A subscriber to a group's events.
pub type EventHook = Arc<dyn Fn(&GroupEvent) + Send + Sync>;

/// The receiving end of [`Group::event_channel`]: a bounded queue of events;
/// when it is full, new events are dropped and counted.
#[derive(Debug)]
pub struct EventReceiver {
    rx: Receiver<GroupEvent>,
    dropped: Arc<AtomicU64>,
}

impl EventReceiver {
    /// The next event, waiting for one; `None` once the group and its
    /// hierarchy are gone.
    pub fn recv(&self) -> Option<GroupEvent> {
        self.rx.recv().ok()
    }

    /// The next event if one is queued.
    pub fn try_recv(&self) -> Option<GroupEvent> {
        self.rx.try_recv().ok()
    }

    /// The next event, waiting at most `timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Option<GroupEvent> {
        self.rx.recv_timeout(timeout).ok()
    }

    /// Every event queued now.
    pub fn try_iter(&self) -> impl Iterator<Item = GroupEvent> + '_ {
        self.rx.try_iter()
    }

    /// Events dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Relaxed)
    }
}

/// A subscriber that queues events on a bounded channel (no allocation
/// per event: the channel's buffer is allocated up front).
pub(crate) fn channel(capacity: usize) -> (EventHook, EventReceiver) {
    let (tx, rx): (SyncSender<GroupEvent>, _) = std::sync::mpsc::sync_channel(capacity);
    let dropped = Arc::new(AtomicU64::new(0));
    let counted = dropped.clone();
    let hook: EventHook = Arc::new(move |e: &GroupEvent| {
        if let Err(TrySendError::Full(_)) = tx.try_send(e.clone()) {
            counted.fetch_add(1, Relaxed);
        }
    });
    (hook, EventReceiver { rx, dropped })
}

/// Deliver an event of `node` to its subscribers (with accounting off, each
/// under `catch_unwind`). Does nothing without subscribers.
pub(crate) fn emit(
    shared: &Arc<super::hierarchy::Shared>,
    node: &Arc<Node>,
    kind: EventKind,
    usage: u64,
    limit: u64,
    seq: Option<u64>,
) {
    let Some(hooks) = node.hooks() else { return };
    if hooks.events.is_empty() {
        return;
    }
    crate::alloc::without_accounting(|| {
        let event = GroupEvent {
            kind,
            group: Group::new(shared.clone(), node.clone()),
            usage,
            limit,
            seq: seq.unwrap_or_else(|| node.usage.next_seq()),
        };
        for hook in &hooks.events {
            super::hooks::run((), || hook(&event));
        }
    });
}

/// Make `node`'s usage counter tell the group layer about crossings of
/// `high` (installed with the group's first event subscriber).
pub(crate) fn listen(shared: &Arc<super::hierarchy::Shared>, node: &Arc<Node>) {
    let (shared, weak): (Weak<_>, Weak<Node>) = (Arc::downgrade(shared), Arc::downgrade(node));
    node.usage.set_listener(Box::new(move |e: CounterEvent| {
        if let (Some(shared), Some(node)) = (shared.upgrade(), weak.upgrade()) {
            let kind = if e.above {
                EventKind::HighCrossed
            } else {
                EventKind::BackUnderHigh
            };
            emit(&shared, &node, kind, e.usage, e.high, Some(e.seq));
        }
    }));
}
