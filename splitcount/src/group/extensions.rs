//! [`Extensions`]: typed user data on a group, like `http::Extensions` on a
//! request — at most one value per type, shared as `Arc<T>`.
//!
//! The values live in the group's node behind a mutex of their own (no
//! charge path, lookup or child-map lock ever takes it). They are dropped
//! when the group is removed ([`Group::remove`]) or, for a group never
//! removed, when its node is freed (its last handle and its hierarchy are
//! gone). Values are dropped outside the mutex, so a value's `Drop` may use
//! the group. An `Arc<T>` obtained before the removal keeps its value alive
//! as long as the caller holds it.
//!
//! A value that holds a [`Group`] handle on its own group keeps the node
//! alive through a cycle until the group is removed; hold a parent's handle
//! or remove the group when done.

use super::{Group, GroupError};
use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

type Value = Arc<dyn Any + Send + Sync>;

/// The node's store: type → (type name for `Debug`, value).
#[derive(Default)]
pub(crate) struct Store {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    map: HashMap<TypeId, (&'static str, Value)>,
    /// The group was removed: no value is kept any more.
    closed: bool,
}

impl Store {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Drop every value and refuse new ones (the group was removed).
    pub(crate) fn close(&self) {
        let old = {
            let mut inner = self.lock();
            inner.closed = true;
            std::mem::take(&mut inner.map)
        };
        drop(old); // outside the mutex: a value's `Drop` may use the group
    }
}

/// Typed user data attached to a group ([`Group::extensions`]): at most
/// one value of each type, `Send + Sync + 'static`, handed out as `Arc<T>`.
///
/// ```
/// use splitcount::group::Hierarchy;
///
/// struct Tenant { plan: &'static str }
///
/// let h = Hierarchy::default();
/// let g = h.root().child("tenant-a").unwrap();
/// assert!(g.extensions().insert(Tenant { plan: "gold" }).unwrap().is_none());
/// // Anyone with a handle, e.g. one found by path, reads it back.
/// let found = h.lookup("tenant-a").unwrap();
/// assert_eq!(found.extensions().get::<Tenant>().unwrap().plan, "gold");
/// assert!(found.extensions().get::<u32>().is_none());
///
/// // Removing the group drops its values; new ones are refused.
/// g.remove().unwrap();
/// assert!(g.extensions().get::<Tenant>().is_none());
/// assert!(g.extensions().insert(7u32).is_err());
/// ```
#[derive(Clone, Copy)]
pub struct Extensions<'a> {
    group: &'a Group,
}

impl<'a> Extensions<'a> {
    fn store(&self) -> &'a Store {
        &self.group.node().extensions
    }

    /// Attach `value`, replacing (and returning) the value of the same type
    /// the group had. `Err(Removed)` once the group is removed (the value
    /// is dropped).
    pub fn insert<T: Send + Sync + 'static>(&self, value: T) -> Result<Option<Arc<T>>, GroupError> {
        let value: Value = Arc::new(value);
        let old = {
            let mut inner = self.store().lock();
            if inner.closed {
                None
            } else {
                Some(
                    inner
                        .map
                        .insert(TypeId::of::<T>(), (std::any::type_name::<T>(), value)),
                )
            }
        };
        match old {
            None => Err(GroupError::Removed {
                path: self.group.path().to_owned(),
            }),
            Some(old) => Ok(old.map(|(_, v)| downcast(v))),
        }
    }

    /// The value of type `T`, if the group has one.
    pub fn get<T: Send + Sync + 'static>(&self) -> Option<Arc<T>> {
        let v = self.store().lock().map.get(&TypeId::of::<T>())?.1.clone();
        Some(downcast(v))
    }

    /// The value of type `T`, made with `make` (outside the lock) if the
    /// group has none; when two callers race, both get the first one
    /// stored. `Err(Removed)` once the group is removed.
    pub fn get_or_insert_with<T: Send + Sync + 'static>(
        &self,
        make: impl FnOnce() -> T,
    ) -> Result<Arc<T>, GroupError> {
        if let Some(v) = self.get::<T>() {
            return Ok(v);
        }
        let made: Value = Arc::new(make());
        let mut inner = self.store().lock();
        if inner.closed {
            drop(inner);
            return Err(GroupError::Removed {
                path: self.group.path().to_owned(),
            });
        }
        let v = inner
            .map
            .entry(TypeId::of::<T>())
            .or_insert((std::any::type_name::<T>(), made))
            .1
            .clone();
        drop(inner);
        Ok(downcast(v))
    }

    /// Take the value of type `T` off the group.
    pub fn remove<T: Send + Sync + 'static>(&self) -> Option<Arc<T>> {
        let v = self.store().lock().map.remove(&TypeId::of::<T>())?.1;
        Some(downcast(v))
    }

    /// Whether the group has a value of type `T`.
    pub fn contains<T: Send + Sync + 'static>(&self) -> bool {
        self.store().lock().map.contains_key(&TypeId::of::<T>())
    }

    /// How many values the group has.
    pub fn len(&self) -> usize {
        self.store().lock().map.len()
    }

    /// Whether the group has no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drop every value (new ones are still accepted).
    pub fn clear(&self) {
        let old = std::mem::take(&mut self.store().lock().map);
        drop(old);
    }
}

/// The map is keyed by `TypeId`, so the value under `T`'s key is a `T`.
fn downcast<T: Send + Sync + 'static>(v: Value) -> Arc<T> {
    match v.downcast::<T>() {
        Ok(v) => v,
        Err(_) => unreachable!("stored under the TypeId of its own type"),
    }
}

impl fmt::Debug for Extensions<'_> {
    /// The group's path and the type names of its values.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut types: Vec<&'static str> =
            self.store().lock().map.values().map(|(n, _)| *n).collect();
        types.sort_unstable();
        f.debug_struct("Extensions")
            .field("group", &self.group.path())
            .field("types", &types)
            .finish()
    }
}

impl Group {
    /// The group's typed user data (see [`Extensions`]): e.g. a tenant's
    /// plan or a query's cancellation token, found by whoever finds the
    /// group.
    pub fn extensions(&self) -> Extensions<'_> {
        Extensions { group: self }
    }
}
