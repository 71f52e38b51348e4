//! The environment the preload reads once, at load, parsed strictly: a
//! value it cannot parse **stops the program** (see [`BAD_CONFIG_EXIT`]),
//! so that a mistyped limit never runs a program unlimited.
//!
//! Sizes (`SPLITCOUNT_PRELOAD_MAX`): whole bytes, optionally followed by a
//! unit, case-insensitive; every unit is a power of 1024:
//!
//! | unit | × |
//! |---|---|
//! | none, `B` | 1 |
//! | `K`, `KiB`, `KB` | 2¹⁰ |
//! | `M`, `MiB`, `MB` | 2²⁰ |
//! | `G`, `GiB`, `GB` | 2³⁰ |
//! | `T`, `TiB`, `TB` | 2⁴⁰ |
//!
//! `KB`, `MB`, `GB`, `TB` are read as 1024-based, like the units without a
//! `B` (and like `docker run --memory`, which reads `512m`, `512MB` and
//! `512MiB` alike): one number for all the spellings an operator may
//! write, rather than the SI reading (10⁶ for `MB`) for one of them.
//! `max` and `unlimited` mean no limit. No fractions (`1.5G`: write
//! `1536M`), signs, spaces or other units.

use crate::heap::Inner;
use splitcount::charge::Enforcement;

/// The exit status of a program stopped at load for a bad
/// `SPLITCOUNT_PRELOAD_*` value: `EX_CONFIG` of `<sysexits.h>`,
/// "configuration error".
pub(crate) const BAD_CONFIG_EXIT: i32 = 78;

/// Where the exit report goes (`SPLITCOUNT_PRELOAD_REPORT`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Report {
    /// No report (unset, empty or `0`).
    Off,
    /// To stderr (`1`).
    Stderr,
    /// To the file `<path>.<pid>` (a value with a `/` in it).
    File(String),
}

/// What the environment asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Settings {
    /// `SPLITCOUNT_PRELOAD_MAX`: the limit of `/preload`, in bytes (`None`:
    /// unset, `max` or `unlimited`).
    pub(crate) max: Option<u64>,
    /// `SPLITCOUNT_PRELOAD_ENFORCE`: refuse (default) or cooperative.
    pub(crate) enforcement: Enforcement,
    /// `SPLITCOUNT_PRELOAD_REPORT`: where the exit report goes.
    pub(crate) report: Report,
    /// `SPLITCOUNT_PRELOAD_SIGNAL`: the signal that writes a live snapshot
    /// (`None`: none).
    pub(crate) snapshot_signal: Option<i32>,
    /// `SPLITCOUNT_PRELOAD_INNER`: where the program's blocks come from.
    pub(crate) inner: Inner,
    /// `SPLITCOUNT_PRELOAD_CHARGE=footprint`: blocks are charged what they
    /// take from the heap, not their usable size.
    pub(crate) footprint: bool,
    /// `SPLITCOUNT_PRELOAD_TAGS`: whether blocks carry a tag (`on`, the
    /// default) or none (`off`: every block charged to `/preload`).
    pub(crate) tags: bool,
}

/// An environment variable, without std's environment lock (this runs
/// before `main`, or inside `malloc`).
pub(crate) fn var(name: &std::ffi::CStr) -> Option<String> {
    // SAFETY: a NUL-terminated name; the result is null or a
    // NUL-terminated string, copied at once.
    let v = unsafe { libc::getenv(name.as_ptr()) };
    // SAFETY: see above.
    (!v.is_null()).then(|| {
        unsafe { std::ffi::CStr::from_ptr(v) }
            .to_string_lossy()
            .into_owned()
    })
}

/// A size in bytes: digits, optionally followed by a unit (see the module
/// docs). Nothing else.
pub(crate) fn parse_bytes(s: &str) -> Result<u64, String> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    if digits.is_empty() {
        return Err("it does not start with a number".to_owned());
    }
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        // `1,000` or `1,5G`: a separator of thousands, or a decimal comma.
        _ if unit.starts_with(',') && unit[1..].starts_with(|c: char| c.is_ascii_digit()) => {
            return Err("no separators or fractions: digits alone, then a unit \
                 (1000, 1536M; not 1,000 or 1,5G)"
                .to_owned())
        }
        _ if unit.starts_with(['.', ',']) => {
            return Err(
                "fractions are not accepted: write a whole number of a smaller unit \
                 (1536M, not 1.5G)"
                    .to_owned(),
            )
        }
        _ => return Err(format!("{unit:?} is not a unit (K, M, G, T, KiB…, KB…)")),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .ok_or_else(|| "more bytes than 2^64".to_owned())
}

/// A limit: a size ([`parse_bytes`]), or `max` / `unlimited` (`None`).
pub(crate) fn parse_limit(s: &str) -> Result<Option<u64>, String> {
    if s.eq_ignore_ascii_case("max") || s.eq_ignore_ascii_case("unlimited") {
        return Ok(None);
    }
    parse_bytes(s).map(Some).map_err(|why| {
        format!(
            "not a limit: {why}. Write whole bytes with an optional unit, every unit a power \
             of 1024 (1048576, 512M, 512MiB, 512MB, 2G), or max / unlimited"
        )
    })
}

/// The inner allocator: `glibc` (also unset or empty), `jemalloc` or
/// `mimalloc`, any case.
pub(crate) fn parse_inner(s: Option<&str>) -> Result<Inner, String> {
    match s.map(str::to_ascii_lowercase).as_deref() {
        None | Some("") | Some("glibc") => Ok(Inner::Glibc),
        Some("jemalloc") => Ok(Inner::Jemalloc),
        Some("mimalloc") => Ok(Inner::Mimalloc),
        Some(_) => Err("not glibc, jemalloc or mimalloc".to_owned()),
    }
}

/// What a block is charged: `usable` (also unset or empty: its usable
/// size, what `malloc_usable_size` says) or `footprint` (what it takes
/// from the heap), any case; whether footprints.
pub(crate) fn parse_charge(s: Option<&str>) -> Result<bool, String> {
    match s {
        None | Some("") => Ok(false),
        Some(s) if s.eq_ignore_ascii_case("usable") => Ok(false),
        Some(s) if s.eq_ignore_ascii_case("footprint") => Ok(true),
        Some(_) => Err("not usable or footprint".to_owned()),
    }
}

/// Whether blocks carry tags: `on` (also unset or empty) or `off`, any
/// case (`untagged` reads the mode the same way, with no allocation,
/// before anything else).
pub(crate) fn parse_tags(s: Option<&str>) -> Result<bool, String> {
    match s {
        None | Some("") => Ok(true),
        Some(s) if s.eq_ignore_ascii_case("on") => Ok(true),
        Some(s) if s.eq_ignore_ascii_case("off") => Ok(false),
        Some(_) => Err("not on or off".to_owned()),
    }
}

/// The live snapshot's signal: `USR1` or `USR2` (`SIGUSR1`, `SIGUSR2`,
/// any case); unset, empty or `0`: none. Nothing else: the other signals
/// have meanings a program relies on.
pub(crate) fn parse_signal(s: Option<&str>) -> Result<Option<i32>, String> {
    let Some(s) = s else { return Ok(None) };
    let upper = s.to_ascii_uppercase();
    match upper.strip_prefix("SIG").unwrap_or(&upper) {
        "" | "0" => Ok(None),
        "USR1" => Ok(Some(libc::SIGUSR1)),
        "USR2" => Ok(Some(libc::SIGUSR2)),
        _ => Err("not USR1 or USR2 (SIGUSR1, SIGUSR2), or 0 for none".to_owned()),
    }
}

/// Read and parse one more variable into `settings`: its value set where
/// all is well so far, its error added to the others (`name="value": why`).
fn also<T>(
    settings: &mut Result<Settings, Vec<String>>,
    name: &std::ffi::CStr,
    parse: impl FnOnce(Option<&str>) -> Result<T, String>,
    set: impl FnOnce(&mut Settings, T),
) {
    let value = var(name);
    let name = name.to_string_lossy();
    match (parse(value.as_deref()), &mut *settings) {
        (Ok(v), Ok(s)) => set(s, v),
        (Ok(_), Err(_)) => {}
        (Err(why), result) => {
            let message = format!("{name}={:?}: {why}", value.unwrap_or_default());
            match result {
                Ok(_) => *settings = Err(vec![message]),
                Err(errors) => errors.push(message),
            }
        }
    }
}

impl Settings {
    /// The settings of this process's environment; `Err` with one message
    /// per bad variable, each naming the variable and its value.
    pub(crate) fn from_env() -> Result<Settings, Vec<String>> {
        let mut settings = Settings::parse(
            var(c"SPLITCOUNT_PRELOAD_MAX"),
            var(c"SPLITCOUNT_PRELOAD_ENFORCE"),
            var(c"SPLITCOUNT_PRELOAD_REPORT"),
        );
        also(
            &mut settings,
            c"SPLITCOUNT_PRELOAD_INNER",
            parse_inner,
            |s, i| s.inner = i,
        );
        also(
            &mut settings,
            c"SPLITCOUNT_PRELOAD_CHARGE",
            parse_charge,
            |s, f| s.footprint = f,
        );
        also(
            &mut settings,
            c"SPLITCOUNT_PRELOAD_TAGS",
            parse_tags,
            |s, t| s.tags = t,
        );
        also(
            &mut settings,
            c"SPLITCOUNT_PRELOAD_SIGNAL",
            parse_signal,
            |s, sig| s.snapshot_signal = sig,
        );
        settings
    }

    pub(crate) fn parse(
        max: Option<String>,
        enforce: Option<String>,
        report: Option<String>,
    ) -> Result<Settings, Vec<String>> {
        let mut errors = Vec::new();
        let mut bad = |name: &str, value: &str, why: &str| {
            errors.push(format!("{name}={value:?}: {why}"));
        };
        let max = match max.as_deref().map(parse_limit) {
            None => None,
            Some(Ok(max)) => max,
            Some(Err(why)) => {
                bad("SPLITCOUNT_PRELOAD_MAX", max.as_deref().unwrap(), &why);
                None
            }
        };
        let enforcement = match enforce.as_deref() {
            None => Enforcement::Refuse,
            Some(e) if e.eq_ignore_ascii_case("refuse") => Enforcement::Refuse,
            Some(e) if e.eq_ignore_ascii_case("cooperative") => Enforcement::Cooperative,
            Some(other) => {
                bad(
                    "SPLITCOUNT_PRELOAD_ENFORCE",
                    other,
                    "not \"refuse\" or \"cooperative\"",
                );
                Enforcement::Refuse
            }
        };
        let report = match report.as_deref() {
            None | Some("0") | Some("") => Report::Off,
            Some("1") => Report::Stderr,
            Some(dir) if dir.ends_with('/') => {
                // `dir/` would have written the hidden file `dir/.<pid>`.
                bad(
                    "SPLITCOUNT_PRELOAD_REPORT",
                    dir,
                    "a directory: name a file in it (dir/report: the report goes to \
                     dir/report.<pid>)",
                );
                Report::Off
            }
            Some(path) if path.contains('/') => Report::File(path.to_owned()),
            Some(other) => {
                bad(
                    "SPLITCOUNT_PRELOAD_REPORT",
                    other,
                    "not 1 (stderr), 0 (none) or a path with a / in it (./report: the \
                     report goes to ./report.<pid>)",
                );
                Report::Off
            }
        };
        if errors.is_empty() {
            Ok(Settings {
                max,
                enforcement,
                report,
                snapshot_signal: None,
                inner: Inner::Glibc,
                footprint: false,
                tags: true,
            })
        } else {
            Err(errors)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_whole_bytes_with_an_optional_unit_of_a_power_of_1024() {
        let cases: [(&str, u64); 17] = [
            ("1048576", 1 << 20),
            ("0", 0),
            ("7B", 7),
            ("512M", 512 << 20),
            ("512m", 512 << 20),
            ("512MiB", 512 << 20),
            ("512mib", 512 << 20),
            ("512MB", 512 << 20),
            ("512mb", 512 << 20),
            ("10K", 10 << 10),
            ("10KiB", 10 << 10),
            ("10kB", 10 << 10),
            ("2G", 2 << 30),
            ("2GiB", 2 << 30),
            ("2gb", 2 << 30),
            ("3T", 3 << 40),
            ("3TiB", 3 << 40),
        ];
        for (s, n) in cases {
            assert_eq!(parse_bytes(s), Ok(n), "{s}");
        }
        assert_eq!(parse_bytes("16777215T"), Ok(16_777_215 << 40));
    }

    #[test]
    fn anything_else_is_not_a_size() {
        for bad in [
            "", "M", "MiB", "-1", "+1", "1.5G", "1,5G", "0.5", " 10", "10 ", "10 M", "0x10", "1e6",
            "10MX", "10Mi", "10MiBs", "10P", "10PB", "10iB", "1_000", "１０",
        ] {
            assert!(parse_bytes(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn sizes_past_2_to_the_64_are_refused_not_wrapped() {
        assert_eq!(parse_bytes("18446744073709551615"), Ok(u64::MAX));
        assert!(parse_bytes("18446744073709551616").is_err());
        assert!(parse_bytes("16777216T").is_err(), "2^64");
        assert!(parse_bytes("17179869184G").is_err(), "2^64");
    }

    #[test]
    fn a_fraction_is_refused_with_the_way_to_write_it() {
        let e = parse_bytes("1.5G").unwrap_err();
        assert!(e.contains("1536M"), "{e}");
    }

    #[test]
    fn max_and_unlimited_mean_no_limit() {
        for s in ["max", "MAX", "unlimited", "Unlimited"] {
            assert_eq!(parse_limit(s), Ok(None), "{s}");
        }
        assert_eq!(parse_limit("64K"), Ok(Some(64 << 10)));
        assert!(parse_limit("none").is_err());
        assert!(parse_limit("").is_err(), "set but empty is not unset");
    }

    #[test]
    fn blocks_are_charged_usable_sizes_or_footprints() {
        assert_eq!(parse_charge(None), Ok(false));
        assert_eq!(parse_charge(Some("usable")), Ok(false));
        assert_eq!(parse_charge(Some("footprint")), Ok(true));
        assert_eq!(parse_charge(Some("FootPrint")), Ok(true));
        assert_eq!(parse_charge(Some("USABLE")), Ok(false));
        assert!(parse_charge(Some("requested")).is_err());
    }

    #[test]
    fn tags_are_on_or_off_in_any_case() {
        for (v, tags) in [
            ("", true),
            ("on", true),
            ("ON", true),
            ("off", false),
            ("Off", false),
        ] {
            assert_eq!(parse_tags(Some(v)), Ok(tags), "{v:?}");
        }
        assert_eq!(parse_tags(None), Ok(true));
        for bad in ["no", "0", "false", " off"] {
            assert!(parse_tags(Some(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_inner_allocator_is_named() {
        assert_eq!(parse_inner(None), Ok(Inner::Glibc));
        assert_eq!(parse_inner(Some("")), Ok(Inner::Glibc));
        assert_eq!(parse_inner(Some("GLIBC")), Ok(Inner::Glibc));
        assert_eq!(parse_inner(Some("jemalloc")), Ok(Inner::Jemalloc));
        assert_eq!(parse_inner(Some("MiMalloc")), Ok(Inner::Mimalloc));
        for bad in ["je", "tcmalloc", "system", " glibc"] {
            assert!(parse_inner(Some(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_snapshot_signal_is_usr1_or_usr2() {
        assert_eq!(parse_signal(None), Ok(None));
        assert_eq!(parse_signal(Some("")), Ok(None));
        assert_eq!(parse_signal(Some("0")), Ok(None));
        for usr2 in ["USR2", "usr2", "SIGUSR2", "sigusr2"] {
            assert_eq!(parse_signal(Some(usr2)), Ok(Some(libc::SIGUSR2)), "{usr2}");
        }
        assert_eq!(parse_signal(Some("SIGUSR1")), Ok(Some(libc::SIGUSR1)));
        for bad in ["12", "TERM", "SIGHUP", "USR3", " USR2"] {
            assert!(parse_signal(Some(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn every_bad_value_is_named_with_its_variable() {
        let errors = Settings::parse(
            Some("10MX".into()),
            Some("maybe".into()),
            Some("yes".into()),
        )
        .unwrap_err();
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(errors[0].starts_with("SPLITCOUNT_PRELOAD_MAX=\"10MX\": not a limit"));
        assert!(errors[1].starts_with("SPLITCOUNT_PRELOAD_ENFORCE=\"maybe\""));
        assert!(errors[2].starts_with("SPLITCOUNT_PRELOAD_REPORT=\"yes\""));
        for dir in ["/", "/var/log/", "./"] {
            let e = Settings::parse(None, None, Some(dir.into())).unwrap_err();
            assert!(e[0].contains("a directory: name a file in it"), "{e:?}");
        }
        let comma = Settings::parse(Some("1,000".into()), None, None).unwrap_err();
        assert!(comma[0].contains("not 1,000"), "{comma:?}");
        for mistyped in ["512m ", "10MBs", "1.5G", "lots", "1,5G"] {
            let e = Settings::parse(Some(mistyped.into()), None, None).unwrap_err();
            assert!(e[0].contains(&format!("{mistyped:?}")), "{e:?}");
        }
    }

    #[test]
    fn refusal_is_the_default_and_cooperative_is_asked_for() {
        let s = Settings::parse(Some("64M".into()), None, Some("1".into())).unwrap();
        assert_eq!(
            (s.max, s.enforcement, s.report),
            (Some(64 << 20), Enforcement::Refuse, Report::Stderr)
        );
        let c = Settings::parse(None, Some("cooperative".into()), None).unwrap();
        assert_eq!((c.max, c.enforcement), (None, Enforcement::Cooperative));
        let upper = Settings::parse(None, Some("Cooperative".into()), None).unwrap();
        assert_eq!(upper.enforcement, Enforcement::Cooperative);
        let refuse = Settings::parse(None, Some("REFUSE".into()), None).unwrap();
        assert_eq!(refuse.enforcement, Enforcement::Refuse);
        assert!(
            Settings::parse(None, Some(String::new()), None).is_err(),
            "set but empty"
        );
        let u = Settings::parse(Some("unlimited".into()), None, Some("0".into())).unwrap();
        assert_eq!((u.max, u.report), (None, Report::Off));
    }

    #[test]
    fn a_report_path_has_a_slash() {
        for (v, r) in [
            ("", Report::Off),
            ("0", Report::Off),
            ("1", Report::Stderr),
            ("./sc", Report::File("./sc".into())),
            ("/tmp/sc", Report::File("/tmp/sc".into())),
        ] {
            assert_eq!(
                Settings::parse(None, None, Some(v.into())).unwrap().report,
                r
            );
        }
        assert!(Settings::parse(None, None, Some("report.txt".into())).is_err());
    }
}
