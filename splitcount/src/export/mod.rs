//! Exporters: a group hierarchy's figures in the formats operators already
//! read, each behind a cargo feature so the core stays lean.
//!
//! - [`prometheus`] (feature `prometheus`): a `prometheus-client`
//!   collector over a hierarchy (or a subtree), with a cap on cardinality.
//! - [`metrics`] (feature `metrics`): a recorder for the `metrics` facade
//!   whose counters are split counters; with `prometheus` too, its
//!   contents are exported through the same registry.
//!
//! The cgroup v2 file formats need no feature: see
//! [`crate::group::cgroup`].

#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;
#[cfg(feature = "prometheus")]
#[cfg_attr(docsrs, doc(cfg(feature = "prometheus")))]
pub mod prometheus;
