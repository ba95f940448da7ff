//! The chain table a lookup proxy holds (pushed by the controller with
//! `PUT /chains`, or read from `--chains FILE`): for each rounds class, the
//! chain from this proxy to the egress. The computation itself is
//! `vcdn_policy::chains`; this is only its lookup.

use serde::{Deserialize, Serialize};

use crate::wire::{valid_name, MAX_HOPS};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ChainEntry {
    /// Transfers needing at most this many slow-start rounds take `chain`.
    pub max_rounds: u32,
    /// Location names from this proxy to the egress, both included.
    pub chain: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ChainTable {
    pub version: u64,
    pub egress: String,
    /// Ascending `max_rounds`; the last entry also serves unknown and
    /// larger sizes.
    pub chains: Vec<ChainEntry>,
}

impl ChainTable {
    /// Checks the table for the proxy called `me`.
    pub fn validate(&self, me: &str) -> Result<(), String> {
        if !valid_name(&self.egress) {
            return Err(format!(
                "egress {:?} is not a valid location name",
                self.egress
            ));
        }
        if self.chains.is_empty() {
            return Err("chains is empty".into());
        }
        let mut last = 0;
        for (i, e) in self.chains.iter().enumerate() {
            if i > 0 && e.max_rounds <= last {
                return Err("chains must be in strictly ascending max_rounds".into());
            }
            last = e.max_rounds;
            if e.chain.is_empty() || e.chain.len() > MAX_HOPS {
                return Err(format!("chain {i} must have 1 to {MAX_HOPS} names"));
            }
            if let Some(n) = e.chain.iter().find(|n| !valid_name(n)) {
                return Err(format!("chain {i}: {n:?} is not a valid location name"));
            }
            if e.chain[0] != me {
                return Err(format!("chain {i} must start at this proxy ({me})"));
            }
            if e.chain.last() != Some(&self.egress) {
                return Err(format!(
                    "chain {i} must end at the egress ({})",
                    self.egress
                ));
            }
            if (1..e.chain.len()).any(|j| e.chain[..j].contains(&e.chain[j])) {
                return Err(format!("chain {i} visits a location twice"));
            }
        }
        Ok(())
    }

    /// The chain for a transfer of `rounds` rounds.
    pub fn pick(&self, rounds: u32) -> &[String] {
        let e = self
            .chains
            .iter()
            .find(|e| rounds <= e.max_rounds)
            .or(self.chains.last())
            .expect("validated tables are not empty");
        &e.chain
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(json: &str) -> ChainTable {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn picks_by_rounds_and_validates() {
        let tab = t(
            r#"{"version":1,"egress":"e","chains":[{"max_rounds":2,"chain":["i","e"]},{"max_rounds":6,"chain":["i","m","e"]}]}"#,
        );
        tab.validate("i").unwrap();
        assert_eq!(tab.pick(1), ["i", "e"]);
        assert_eq!(tab.pick(5), ["i", "m", "e"]);
        assert_eq!(tab.pick(u32::MAX), ["i", "m", "e"]);
        assert!(tab.validate("x").is_err());
        for bad in [
            r#"{"version":1,"egress":"e","chains":[]}"#,
            r#"{"version":1,"egress":"e","chains":[{"max_rounds":2,"chain":["i","10.0.0.1:80","e"]}]}"#,
            r#"{"version":1,"egress":"e","chains":[{"max_rounds":2,"chain":["i","x"]}]}"#,
            r#"{"version":1,"egress":"e","chains":[{"max_rounds":2,"chain":["i","e"]},{"max_rounds":2,"chain":["i","e"]}]}"#,
            r#"{"version":1,"egress":"e","chains":[{"max_rounds":2,"chain":["i","e","i","e"]}]}"#,
        ] {
            assert!(t(bad).validate("i").is_err(), "{bad}");
        }
    }
}
