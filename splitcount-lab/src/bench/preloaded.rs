//! Whether the libraries an environment's `LD_PRELOAD` names are loaded
//! in a process the lab started.
//!
//! The dynamic loader does not fail a program whose `LD_PRELOAD` library
//! cannot be loaded (a file that is not a library, a missing dependency):
//! it prints `ERROR: ld.so: object … cannot be preloaded … ignored` and
//! runs the program without it. A worker started that way would measure
//! the allocator alone under the preload's case name, and its ratio would
//! read as a preload at no cost. So every worker and server started with
//! `LD_PRELOAD` is checked: each library must be among its mappings.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// The libraries of `LD_PRELOAD` in `env` (none without it): the loader's
/// list, separated by spaces or colons.
pub fn libraries(env: &[(&str, &OsStr)]) -> Vec<PathBuf> {
    env.iter()
        .filter(|(k, _)| *k == "LD_PRELOAD")
        .flat_map(|(_, v)| {
            v.to_string_lossy()
                .split([' ', ':'])
                .filter(|s| !s.is_empty())
                .map(PathBuf::from)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Check that process `pid`, started with `env`, has every library of its
/// `LD_PRELOAD` mapped; the error names the first one it lacks.
pub fn check(pid: u32, env: &[(&str, &OsStr)]) -> Result<(), String> {
    let wanted = libraries(env);
    if wanted.is_empty() {
        return Ok(());
    }
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .map_err(|e| format!("cannot read the mappings of process {pid}: {e}"))?;
    match wanted.iter().find(|lib| !mapped(&maps, lib)) {
        None => Ok(()),
        Some(lib) => Err(format!(
            "{} (LD_PRELOAD) is not loaded in process {pid}: the dynamic loader could not \
             load it and ran the program without it (see its message above); a case measured \
             that way would be the allocator alone",
            lib.display()
        )),
    }
}

/// Whether `/proc/PID/maps` text `maps` maps `lib` (by its path as given,
/// or the file it resolves to).
fn mapped(maps: &str, lib: &Path) -> bool {
    let resolved = std::fs::canonicalize(lib).ok();
    maps.lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .map(Path::new)
        .any(|path| path == lib || resolved.as_deref() == Some(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loaders_list_is_split_on_spaces_and_colons() {
        let v = OsStr::new("/a/x.so /b/y.so:/c/z.so");
        assert_eq!(
            libraries(&[("HOME", OsStr::new("/h")), ("LD_PRELOAD", v)]),
            [
                PathBuf::from("/a/x.so"),
                PathBuf::from("/b/y.so"),
                PathBuf::from("/c/z.so")
            ]
        );
        assert!(libraries(&[("HOME", OsStr::new("/h"))]).is_empty());
    }

    #[test]
    fn a_library_is_found_among_the_mappings_by_its_path() {
        let maps = "7f00-7f01 r-xp 00000000 08:01 42  /usr/lib/libc.so.6\n\
                    7f02-7f03 rw-p 00000000 00:00 0 \n";
        assert!(mapped(maps, Path::new("/usr/lib/libc.so.6")));
        assert!(!mapped(maps, Path::new("/tmp/libsplitcount_preload.so")));
    }

    #[test]
    fn a_process_without_its_preload_is_refused() {
        let me = std::process::id();
        let missing = OsStr::new("/nonexistent/libnothing.so");
        let err = check(me, &[("LD_PRELOAD", missing)]).unwrap_err();
        assert!(err.contains("/nonexistent/libnothing.so"), "{err}");
        assert!(check(me, &[]).is_ok());
    }
}
