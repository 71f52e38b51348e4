//! The environment the preload reads once, at load: parsed strictly, a
//! bad value named on stderr and ignored (never a crash).

use splitcount::charge::Enforcement;

/// What the environment asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Settings {
    /// `SPLITCOUNT_PRELOAD_MAX`: the limit of `/preload`, in bytes.
    pub(crate) max: Option<u64>,
    /// `SPLITCOUNT_PRELOAD_ENFORCE`: refuse (default) or cooperative.
    pub(crate) enforcement: Enforcement,
    /// `SPLITCOUNT_PRELOAD_REPORT=1`: print the numbers at exit.
    pub(crate) report: bool,
    /// What was wrong with the environment.
    pub(crate) warnings: Vec<String>,
}

/// An environment variable, without std's environment lock (this runs
/// before `main`, or inside `malloc`).
fn var(name: &std::ffi::CStr) -> Option<String> {
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

/// A size in bytes: digits, optionally followed by one of K, M, G, T
/// (powers of 1024). Nothing else: no spaces, signs, fractions or units
/// such as "MB".
pub(crate) fn parse_bytes(s: &str) -> Result<u64, String> {
    let (digits, shift) = match s.as_bytes().last() {
        Some(b'K') => (&s[..s.len() - 1], 10),
        Some(b'M') => (&s[..s.len() - 1], 20),
        Some(b'G') => (&s[..s.len() - 1], 30),
        Some(b'T') => (&s[..s.len() - 1], 40),
        _ => (s, 0),
    };
    let bad = || {
        format!(
            "{s:?} is not a size in bytes (digits, optionally followed by K, M, G or T: \
             1048576, 512M, 2G)"
        )
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let n: u64 = digits.parse().map_err(|_| bad())?;
    n.checked_mul(1 << shift).ok_or_else(bad)
}

impl Settings {
    pub(crate) fn from_env() -> Settings {
        Settings::parse(
            var(c"SPLITCOUNT_PRELOAD_MAX"),
            var(c"SPLITCOUNT_PRELOAD_ENFORCE"),
            var(c"SPLITCOUNT_PRELOAD_REPORT"),
        )
    }

    pub(crate) fn parse(
        max: Option<String>,
        enforce: Option<String>,
        report: Option<String>,
    ) -> Settings {
        let mut warnings = Vec::new();
        let max = max.and_then(|m| {
            parse_bytes(&m)
                .map_err(|e| warnings.push(format!("SPLITCOUNT_PRELOAD_MAX={m}: {e}; no limit")))
                .ok()
        });
        let enforcement = match enforce.as_deref() {
            None | Some("refuse") => Enforcement::Refuse,
            Some("cooperative") => Enforcement::Cooperative,
            Some(other) => {
                warnings.push(format!(
                    "SPLITCOUNT_PRELOAD_ENFORCE={other}: not \"refuse\" or \"cooperative\"; \
                     refusing"
                ));
                Enforcement::Refuse
            }
        };
        let report = match report.as_deref() {
            None | Some("0") | Some("") => false,
            Some("1") => true,
            Some(other) => {
                warnings.push(format!(
                    "SPLITCOUNT_PRELOAD_REPORT={other}: not 1 or 0; no report"
                ));
                false
            }
        };
        Settings {
            max,
            enforcement,
            report,
            warnings,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_digits_with_an_optional_binary_suffix() {
        assert_eq!(parse_bytes("1048576"), Ok(1 << 20));
        assert_eq!(parse_bytes("512M"), Ok(512 << 20));
        assert_eq!(parse_bytes("2G"), Ok(2 << 30));
        assert_eq!(parse_bytes("0"), Ok(0));
        for bad in [
            "",
            "M",
            "-1",
            "1.5G",
            " 10",
            "10 ",
            "10MB",
            "0x10",
            "99999999999999999999",
        ] {
            assert!(parse_bytes(bad).is_err(), "{bad:?}");
        }
        assert!(parse_bytes("16777216T").is_err(), "overflows u64");
    }

    #[test]
    fn bad_values_are_named_and_ignored() {
        let s = Settings::parse(
            Some("lots".into()),
            Some("maybe".into()),
            Some("yes".into()),
        );
        assert_eq!(s.max, None);
        assert_eq!(s.enforcement, Enforcement::Refuse);
        assert!(!s.report);
        assert_eq!(s.warnings.len(), 3, "{:?}", s.warnings);
        assert!(s.warnings[0].contains("SPLITCOUNT_PRELOAD_MAX=lots"));
    }

    #[test]
    fn refusal_is_the_default_and_cooperative_is_asked_for() {
        let s = Settings::parse(Some("64M".into()), None, Some("1".into()));
        assert_eq!(
            (s.max, s.enforcement, s.report),
            (Some(64 << 20), Enforcement::Refuse, true)
        );
        let c = Settings::parse(None, Some("cooperative".into()), None);
        assert_eq!(c.enforcement, Enforcement::Cooperative);
        assert!(c.warnings.is_empty());
    }
}
