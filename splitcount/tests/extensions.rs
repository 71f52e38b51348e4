//! Typed user data on a group (`Group::extensions`): one value per type,
//! shared as `Arc<T>`, dropped when the group is removed or freed.

use splitcount::group::{GroupError, Hierarchy};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

#[derive(Debug, PartialEq)]
struct Plan(&'static str);

/// Counts its drops.
struct Tracked(Arc<AtomicUsize>);

impl Drop for Tracked {
    fn drop(&mut self) {
        self.0.fetch_add(1, SeqCst);
    }
}

#[test]
fn one_value_per_type_shared_by_every_handle() {
    let h = Hierarchy::default();
    let g = h.root().child("t").unwrap();
    assert!(g.extensions().is_empty());
    assert_eq!(g.extensions().insert(Plan("gold")).unwrap(), None);
    assert_eq!(g.extensions().insert(7u32).unwrap(), None);
    let other = h.lookup("/t").unwrap();
    assert_eq!(*other.extensions().get::<Plan>().unwrap(), Plan("gold"));
    assert_eq!(*other.extensions().get::<u32>().unwrap(), 7);
    assert!(other.extensions().get::<u64>().is_none(), "types are keys");
    assert_eq!(other.extensions().len(), 2);
    assert!(h.root().extensions().is_empty(), "per group");
}

#[test]
fn insert_returns_the_value_it_replaced() {
    let h = Hierarchy::default();
    let g = h.root().child("t").unwrap();
    g.extensions().insert(Plan("free")).unwrap();
    let old = g.extensions().insert(Plan("gold")).unwrap().unwrap();
    assert_eq!(*old, Plan("free"));
    assert_eq!(*g.extensions().get::<Plan>().unwrap(), Plan("gold"));
    assert_eq!(*g.extensions().remove::<Plan>().unwrap(), Plan("gold"));
    assert!(!g.extensions().contains::<Plan>());
}

#[test]
fn get_or_insert_with_makes_the_value_once() {
    let h = Hierarchy::default();
    let g = h.root().child("t").unwrap();
    let made = AtomicUsize::new(0);
    let values: Vec<Arc<u64>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|i| {
                let (g, made) = (&g, &made);
                s.spawn(move || {
                    g.extensions()
                        .get_or_insert_with(|| {
                            made.fetch_add(1, SeqCst);
                            i
                        })
                        .unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(
        values.iter().all(|v| Arc::ptr_eq(v, &values[0])),
        "all get the stored one"
    );
    assert!(made.load(SeqCst) >= 1);
}

#[test]
fn removing_the_group_drops_its_values_and_refuses_new_ones() {
    let h = Hierarchy::default();
    let g = h.root().child("t").unwrap();
    let drops = Arc::new(AtomicUsize::new(0));
    g.extensions().insert(Tracked(drops.clone())).unwrap();
    let kept = g
        .extensions()
        .insert(Plan("gold"))
        .map(|_| g.extensions().get::<Plan>());
    g.remove().unwrap();
    assert_eq!(
        drops.load(SeqCst),
        1,
        "dropped at removal, not when the handle goes"
    );
    assert!(g.extensions().is_empty());
    assert_eq!(
        g.extensions().insert(1u8),
        Err(GroupError::Removed { path: "/t".into() })
    );
    assert!(g.extensions().get_or_insert_with(|| 1u8).is_err());
    assert_eq!(
        *kept.unwrap().unwrap(),
        Plan("gold"),
        "an Arc taken before stays valid"
    );
}

#[test]
fn values_of_a_group_never_removed_go_with_the_hierarchy() {
    let drops = Arc::new(AtomicUsize::new(0));
    {
        let h = Hierarchy::default();
        let g = h.root().child("a").unwrap().child("b").unwrap();
        g.extensions().insert(Tracked(drops.clone())).unwrap();
        h.root()
            .extensions()
            .insert(Tracked(drops.clone()))
            .unwrap();
    }
    assert_eq!(drops.load(SeqCst), 2);
}

#[test]
fn clear_drops_every_value_and_the_group_takes_new_ones() {
    let h = Hierarchy::default();
    let g = h.root().child("t").unwrap();
    let drops = Arc::new(AtomicUsize::new(0));
    g.extensions().insert(Tracked(drops.clone())).unwrap();
    g.extensions().clear();
    assert_eq!(drops.load(SeqCst), 1);
    g.extensions().insert(3i32).unwrap();
    assert_eq!(g.extensions().len(), 1);
}

#[test]
fn a_values_drop_may_use_the_group() {
    struct UsesGroup(splitcount::group::Group);
    impl Drop for UsesGroup {
        fn drop(&mut self) {
            // Dropped outside the store's lock: no deadlock.
            assert!(self.0.extensions().get::<u8>().is_none());
        }
    }
    let h = Hierarchy::default();
    let g = h.root().child("t").unwrap();
    g.extensions().insert(UsesGroup(h.root())).unwrap();
    g.remove().unwrap();
}

#[test]
fn debug_lists_the_type_names() {
    let h = Hierarchy::default();
    let g = h.root().child("t").unwrap();
    g.extensions().insert(5u16).unwrap();
    assert_eq!(
        format!("{:?}", g.extensions()),
        r#"Extensions { group: "/t", types: ["u16"] }"#
    );
}
