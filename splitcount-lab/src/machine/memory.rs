//! The memory this process may still take: what the kernel says is
//! available (`MemAvailable`), and — in a container or a service with a
//! memory limit — its memory cgroup's limit less its usage, whichever is
//! smaller.

use std::path::Path;

/// Bytes this process may still take, as far as the kernel tells (`None`
/// where nothing can be read: then nothing is refused on its account).
pub fn available() -> Option<u64> {
    let system = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|info| mem_available(&info));
    let cgroup = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|groups| cgroup_room(&groups, Path::new("/sys/fs/cgroup")));
    match (system, cgroup) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes.
fn mem_available(info: &str) -> Option<u64> {
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024))
}

/// The room left under the memory cgroup of a `/proc/self/cgroup` text,
/// its hierarchies mounted under `root`: cgroup v2 (`0::/path`:
/// `memory.max` less `memory.current`) or v1 (`N:memory:/path`, under
/// `root/memory`: `memory.limit_in_bytes` less `memory.usage_in_bytes`).
/// `None` without a limit ("max", or v1's page-rounded `i64::MAX`) or where
/// the files cannot be read.
fn cgroup_room(groups: &str, root: &Path) -> Option<u64> {
    let read = |dir: &Path, limit: &str, usage: &str| -> Option<u64> {
        let number = |f: &str| -> Option<u64> {
            std::fs::read_to_string(dir.join(f))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        let limit = number(limit)?;
        // v1 says "no limit" with `i64::MAX` rounded down to a page.
        if limit >= (i64::MAX as u64) / 2 {
            return None;
        }
        Some(limit.saturating_sub(number(usage).unwrap_or(0)))
    };
    let rooted = |path: &str| root.join(path.trim_start_matches('/'));
    for line in groups.lines() {
        let mut fields = line.splitn(3, ':');
        let (id, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        if id == "0" && controllers.is_empty() {
            if let Some(room) = read(&rooted(path), "memory.max", "memory.current") {
                return Some(room);
            }
        } else if controllers.split(',').any(|c| c == "memory") {
            let dir = root.join("memory").join(path.trim_start_matches('/'));
            if let Some(room) = read(&dir, "memory.limit_in_bytes", "memory.usage_in_bytes") {
                return Some(room);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_available_is_read_in_bytes() {
        let info = "MemTotal:       24576000 kB\nMemAvailable:   1024 kB\n";
        assert_eq!(mem_available(info), Some(1024 * 1024));
        assert_eq!(mem_available("MemTotal: 1 kB\n"), None);
    }

    /// A cgroup tree named `name` under a temporary directory, with
    /// `files` written.
    fn tree(name: &str, files: &[(&str, &str)]) -> std::path::PathBuf {
        let root = std::env::temp_dir().join(format!(
            "splitcount-lab-memory-{}-{name}",
            std::process::id()
        ));
        for (path, text) in files {
            let file = root.join(path);
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(file, text).unwrap();
        }
        root
    }

    #[test]
    fn a_cgroup_limit_leaves_its_room_and_no_limit_none() {
        let v2 = tree(
            "v2",
            &[
                ("svc/memory.max", "1073741824\n"),
                ("svc/memory.current", "73741824\n"),
            ],
        );
        assert_eq!(cgroup_room("0::/svc\n", &v2), Some(1_000_000_000));
        let unlimited = tree(
            "unlimited",
            &[("u/memory.max", "max\n"), ("u/memory.current", "5\n")],
        );
        assert_eq!(cgroup_room("0::/u\n", &unlimited), None);
        let v1 = tree(
            "v1",
            &[
                ("memory/box/memory.limit_in_bytes", "2000\n"),
                ("memory/box/memory.usage_in_bytes", "500\n"),
                ("memory/big/memory.limit_in_bytes", "9223372036854771712\n"),
            ],
        );
        assert_eq!(cgroup_room("4:memory:/box\n0::/\n", &v1), Some(1500));
        assert_eq!(cgroup_room("4:memory:/big\n", &v1), None);
        for dir in [v2, unlimited, v1] {
            std::fs::remove_dir_all(dir).unwrap();
        }
    }

    #[test]
    fn this_machine_says_how_much_is_available() {
        if cfg!(target_os = "linux") {
            assert!(available().is_some_and(|b| b > 0));
        }
    }
}
