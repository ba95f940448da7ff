//! The operator's rules for orders: how far ahead and how long a lease may
//! be, how much one customer may hold, and the base of every service's
//! origin policy. Defaults are in `defaults.toml`; the operator changes them
//! with `PUT /v1/settings`, and per customer with
//! `PUT /v1/customers/{id}/settings`.

use serde::{Deserialize, Serialize};
use vcdn_policy::origin::OriginPolicy;

use crate::types::FieldError;

/// What bounds are sane for the settings themselves (ten years).
const TEN_YEARS_S: u64 = 10 * 365 * 86400;

/// The operator-wide settings.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// The operator's base origin rules, in `OriginPolicy` text form
    /// (`deny non-public`, then exceptions). Every service's policy is
    /// these, then its flavor's and customer's `origin_allow`, then the
    /// platform's own addresses denied.
    pub origin_policy: String,
    pub lease: LeaseLimits,
    /// The quota of a customer without one of its own.
    pub quota: Quota,
    /// How the supervisor reads the instances (absent in settings stored
    /// before it existed: the defaults).
    #[serde(default)]
    pub telemetry: TelemetrySettings,
}

/// How the supervisor learns each instance's counters.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TelemetrySettings {
    /// Poll `GET /stats` of an instance with no fresh `edge.stats` record
    /// (the fallback and liveness check). Off: telemetry alone, and an
    /// instance with no fresh record for the unresponsive window counts
    /// as unresponsive. `vcdn up --no-stats-polling` forces it off.
    pub stats_polling: bool,
}

impl Default for TelemetrySettings {
    fn default() -> Self {
        TelemetrySettings {
            stats_polling: true,
        }
    }
}

/// Limits on leases, so that nobody holds capacity far ahead or for ever.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct LeaseLimits {
    /// A lease may start at most this long after the order.
    pub max_start_ahead_s: u64,
    /// A lease may last at most this long.
    pub max_duration_s: u64,
}

/// What one customer may hold at once (live and scheduled services).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Quota {
    pub max_services: u32,
    /// vCPUs reserved by all of the customer's services, at order time.
    pub max_vcpus: u32,
}

/// Per-customer settings (`/v1/customers/{id}/settings`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct CustomerSettings {
    /// Origin rules this customer is allowed beyond the operator's policy.
    #[serde(default)]
    pub origin_allow: Vec<String>,
    /// Its own quota; absent or null: the operator's default.
    #[serde(default)]
    pub quota: Option<Quota>,
}

impl Settings {
    /// What is wrong with these settings, field by field.
    pub fn check(&self) -> Vec<FieldError> {
        let mut errors = Vec::new();
        if let Err(e) = self.origin_policy.parse::<OriginPolicy>() {
            errors.push(FieldError::new("origin_policy", e));
        }
        if !(1..=TEN_YEARS_S).contains(&self.lease.max_duration_s) {
            errors.push(FieldError::new(
                "lease.max_duration_s",
                format!("give 1 to {TEN_YEARS_S} seconds"),
            ));
        }
        if self.lease.max_start_ahead_s > TEN_YEARS_S {
            errors.push(FieldError::new(
                "lease.max_start_ahead_s",
                format!("give 0 to {TEN_YEARS_S} seconds"),
            ));
        }
        errors
    }
}

/// Checks a list of `origin_allow` rules (named `field` in errors).
pub fn check_origin_allow(field: &str, rules: &[String]) -> Vec<FieldError> {
    rules
        .iter()
        .enumerate()
        .filter_map(|(i, r)| {
            vcdn_policy::origin::Rule::parse_list(r)
                .err()
                .map(|e| FieldError::new(format!("{field}[{i}]"), e))
        })
        .collect()
}

/// Human form of a duration in seconds, for messages.
pub fn human_s(s: u64) -> String {
    if s >= 86400 && s.is_multiple_of(86400) {
        format!("{} days", s / 86400)
    } else if s >= 3600 && s.is_multiple_of(3600) {
        format!("{} hours", s / 3600)
    } else {
        format!("{s} s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_settings_are_valid_and_bad_ones_name_their_field() {
        let s = crate::defaults::Defaults::embedded().settings;
        assert!(s.check().is_empty());
        assert_eq!(s.lease.max_start_ahead_s, 90 * 86400);
        let mut bad = s.clone();
        bad.origin_policy = "permit all".into();
        bad.lease.max_duration_s = 0;
        let fields: Vec<String> = bad.check().into_iter().map(|e| e.field).collect();
        assert_eq!(fields, ["origin_policy", "lease.max_duration_s"]);
        assert_eq!(
            check_origin_allow("origin_allow", &["127.0.0.1:9000".into(), "x".into()])[0].field,
            "origin_allow[1]"
        );
        assert_eq!(human_s(90 * 86400), "90 days");
    }
}
