//! What a series of per-round values says: its median, its range, and
//! whether its two halves agree.
//!
//! The values are kept in the order they were measured. A figure is
//! **stable** when the median of the first half of the rounds and the
//! median of the second half are within [`STABILITY_TOLERANCE`] of each
//! other: a drift during the run (a compile starting on a shared host, a
//! CPU clocking down) shows up as two halves that disagree, and the reader
//! is told not to trust that figure.

use serde::Serialize;

/// How far apart (relative to the smaller) the two halves' medians may be
/// for a figure to count as stable.
pub const STABILITY_TOLERANCE: f64 = 0.10;

/// Median, range and halves of a series of positive values.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Spread {
    /// The median of all values.
    pub median: f64,
    /// The smallest value.
    pub low: f64,
    /// The largest value.
    pub high: f64,
    /// How many values.
    pub n: usize,
    /// Medians of the first `n/2` values and of the rest, in measured order.
    pub halves: (f64, f64),
}

impl Spread {
    /// The spread of `values` (in measured order); `None` if there are none
    /// or one is not a finite number.
    pub fn of(values: &[f64]) -> Option<Spread> {
        if values.is_empty() || values.iter().any(|v| !v.is_finite()) {
            return None;
        }
        let (first, second) = values.split_at(values.len() / 2);
        let second_median = median(second);
        Some(Spread {
            median: median(values),
            low: values.iter().copied().fold(f64::INFINITY, f64::min),
            high: values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            n: values.len(),
            halves: (
                if first.is_empty() {
                    second_median
                } else {
                    median(first)
                },
                second_median,
            ),
        })
    }

    /// How far apart the halves' medians are, relative to the smaller one
    /// (0.1 = 10%).
    pub fn halves_apart(&self) -> f64 {
        let (a, b) = self.halves;
        let small = a.abs().min(b.abs());
        if a == b {
            0.0
        } else if small == 0.0 {
            f64::INFINITY
        } else {
            (a - b).abs() / small
        }
    }

    /// Whether there are two halves and they agree within
    /// [`STABILITY_TOLERANCE`].
    pub fn stable(&self) -> bool {
        self.n >= 2 && self.halves_apart() <= STABILITY_TOLERANCE
    }
}

/// The median of `values` (the mean of the middle two for an even count);
/// NaN for none.
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_ignores_one_outlier() {
        let s = Spread::of(&[1.0, 1.1, 9.0, 1.05, 0.95]).unwrap();
        assert_eq!(s.median, 1.05);
        assert_eq!((s.low, s.high), (0.95, 9.0));
        assert_eq!(s.n, 5);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
    }

    #[test]
    fn halves_within_ten_percent_are_stable() {
        let s = Spread::of(&[2.0, 2.1, 1.9, 2.05, 1.95, 2.1]).unwrap();
        assert!(s.stable(), "{s:?}");
    }

    #[test]
    fn a_drift_between_the_halves_is_unstable() {
        // The second half of the run is 30% slower: the median alone
        // would hide it.
        let s = Spread::of(&[1.0, 1.0, 1.0, 1.3, 1.3, 1.3]).unwrap();
        assert_eq!(s.halves, (1.0, 1.3));
        assert!(!s.stable());
        assert!((s.halves_apart() - 0.3).abs() < 1e-9);
    }

    #[test]
    fn odd_counts_put_the_extra_round_in_the_second_half() {
        let s = Spread::of(&[1.0, 2.0, 2.0]).unwrap();
        assert_eq!(s.halves, (1.0, 2.0));
        let one = Spread::of(&[1.0]).unwrap();
        assert_eq!(one.halves, (1.0, 1.0));
        assert!(!one.stable(), "one round cannot show stability");
    }

    #[test]
    fn nothing_or_not_a_number_has_no_spread() {
        assert_eq!(Spread::of(&[]), None);
        assert_eq!(Spread::of(&[1.0, f64::NAN]), None);
    }
}
