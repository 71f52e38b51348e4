//! A group's state in the cgroup v2 memory controller's file formats, so
//! that scripts and dashboards written for `/sys/fs/cgroup` read groups as
//! they are:
//!
//! | file | content |
//! |---|---|
//! | `memory.current` | the usage |
//! | `memory.max`, `memory.high` | the limit, or `max` when there is none |
//! | `memory.peak` | the peak usage |
//! | `memory.events` | `low`, `high`, `max`, `oom`, `oom_kill`, `oom_group_kill` counts of the group and its subtree |
//! | `memory.events.local` | the same, of the group alone |
//! | `memory.stat` | `name value` lines: see [`crate::group::Group::memory_stat`] |
//!
//! Each file is one number or `key value` lines, each ending in a newline,
//! as the kernel writes them. splitcount has no `low` protection and kills
//! nothing, so `low`, `oom_kill` and `oom_group_kill` are always 0; `max`
//! counts charges refused (or let through as a cooperative over-charge) by
//! the group's limit, `oom` the times the charge path reached its OOM
//! stage, `high` crossings of `high`. Units are the hierarchy's (bytes when
//! an allocator is attached).
//!
//! ```
//! use splitcount::group::Hierarchy;
//! let h = Hierarchy::default();
//! let tenant = h.root().child("tenant").unwrap();
//! tenant.set_max(4096).unwrap();
//! assert_eq!(tenant.cgroup_file("memory.max").unwrap(), "4096\n");
//! assert_eq!(tenant.cgroup_file("memory.high").unwrap(), "max\n");
//! assert!(tenant.cgroup_file("memory.events").unwrap().starts_with("low 0\nhigh 0\nmax 0\n"));
//! assert!(tenant.cgroup_file("cpu.max").is_err());
//! ```

use super::{Group, GroupError};
use crate::charge::{Events, UNLIMITED};
use std::io;
use std::path::Path;

/// The files [`Group::cgroup_file`] knows, in the order [`write_tree`]
/// writes them.
pub const FILES: [&str; 7] = [
    "memory.current",
    "memory.max",
    "memory.high",
    "memory.peak",
    "memory.events",
    "memory.events.local",
    "memory.stat",
];

/// A limit as the kernel writes it: `max` when there is none.
fn limit(v: u64) -> String {
    if v == UNLIMITED {
        "max\n".to_owned()
    } else {
        format!("{v}\n")
    }
}

/// `memory.events` lines of `e`.
fn events(e: Events) -> String {
    format!(
        "low 0\nhigh {}\nmax {}\noom {}\noom_kill 0\noom_group_kill 0\n",
        e.high, e.max, e.oom
    )
}

impl Group {
    /// The content of cgroup v2 file `name` (one of [`FILES`]) for this
    /// group, in the kernel's format (see the [module docs](self)).
    pub fn cgroup_file(&self, name: &str) -> Result<String, GroupError> {
        Ok(match name {
            "memory.current" => format!("{}\n", self.usage()),
            "memory.max" => limit(self.max()),
            "memory.high" => limit(self.high()),
            "memory.peak" => format!("{}\n", self.peak()),
            "memory.events" => events(self.subtree_events()),
            "memory.events.local" => events(self.events()),
            "memory.stat" => self.memory_stat(),
            other => {
                return Err(GroupError::Config(format!(
                    "no cgroup file {other:?} (known: {})",
                    FILES.join(", ")
                )))
            }
        })
    }
}

/// Write `group`'s subtree under `dir` as a directory tree shaped like
/// `/sys/fs/cgroup`: `dir` holds the group's [`FILES`], `dir/NAME` each
/// child's, and so on down (group names are valid file names: no `/`, not
/// `.` or `..`). Directories are created as needed; files are replaced.
/// Returns the number of groups written. Walks without recursion.
///
/// Written again into the same `dir` (a script's periodic refresh), the
/// tree is the subtree as it is now: a directory of a group removed since
/// — a directory beside the groups' files that holds a `memory.current`
/// and names no child now — is removed with what is under it; anything
/// else in `dir` (a file or directory of the user's, without a
/// `memory.current`) is left alone. (They stayed, and a script reading the
/// tree saw groups long gone.)
///
/// A group named like one of the [`FILES`] (`memory.max`: a valid group
/// name, which the kernel refuses for a cgroup) cannot be a directory
/// beside that file: the tree is checked first, and such a group is an
/// `InvalidInput` error naming it, with nothing written.
///
/// ```
/// use splitcount::group::{cgroup, Hierarchy};
/// let h = Hierarchy::default();
/// h.root().child("tenant").unwrap().child("query").unwrap().charge(10).unwrap();
/// let dir = std::env::temp_dir().join(format!("splitcount-doc-{}", std::process::id()));
/// assert_eq!(cgroup::write_tree(&h.root(), &dir).unwrap(), 3);
/// let current = std::fs::read_to_string(dir.join("tenant/query/memory.current")).unwrap();
/// assert_eq!(current.trim().parse::<u64>().unwrap(), h.root().usage());
/// # std::fs::remove_dir_all(&dir).unwrap();
/// ```
pub fn write_tree(group: &Group, dir: &Path) -> io::Result<usize> {
    let mut stack = vec![group.clone()];
    while let Some(g) = stack.pop() {
        for c in g.children() {
            if FILES.contains(&c.name()) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "group {} has the name of a cgroup file: it cannot be written as a \
                         directory beside that file (nothing was written)",
                        c.path()
                    ),
                ));
            }
            stack.push(c);
        }
    }
    group.flush(true);
    let mut written = 0;
    let mut stack = vec![(group.clone(), dir.to_path_buf())];
    while let Some((g, at)) = stack.pop() {
        std::fs::create_dir_all(&at)?;
        for name in FILES {
            let content = g
                .cgroup_file(name)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
            std::fs::write(at.join(name), content)?;
        }
        written += 1;
        let children = g.children();
        remove_gone(&at, &children)?;
        for c in children {
            let sub = at.join(c.name());
            stack.push((c, sub));
        }
    }
    Ok(written)
}

/// Remove the directories under `at` that an earlier [`write_tree`] made
/// for groups that are not among `children` now (see there).
fn remove_gone(at: &Path, children: &[Group]) -> io::Result<()> {
    for entry in std::fs::read_dir(at)? {
        let entry = entry?;
        if !entry.file_type()?.is_dir() {
            continue;
        }
        let name = entry.file_name();
        let gone = !children.iter().any(|c| name == c.name());
        if gone && entry.path().join("memory.current").is_file() {
            std::fs::remove_dir_all(entry.path())?;
        }
    }
    Ok(())
}
