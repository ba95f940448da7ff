//! The embedded defaults (`defaults.toml`): regions, hosts and flavors a
//! fresh data directory starts with, and the operator's settings until the
//! operator changes them.

use serde::Deserialize;

use crate::settings::Settings;
use crate::types::{Flavor, Host, Region};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Defaults {
    pub regions: Vec<Region>,
    pub hosts: Vec<Host>,
    pub flavors: Vec<Flavor>,
    pub settings: Settings,
}

impl Defaults {
    pub fn embedded() -> Defaults {
        toml::from_str(include_str!("defaults.toml")).expect("embedded defaults parse")
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn embedded_defaults_parse_and_hosts_name_known_regions() {
        let d = super::Defaults::embedded();
        assert_eq!(d.regions.len(), 3);
        for h in &d.hosts {
            assert!(d.regions.iter().any(|r| r.name == h.region), "{}", h.name);
        }
        assert!(d.flavors.iter().any(|f| f.name == "elastic"));
    }
}
