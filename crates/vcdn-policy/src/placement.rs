//! Placement: instances of one region onto the region's hosts (the
//! service orchestrator's VNF placement, CDNaaS paper §III-B3 and §V-A:
//! consolidating on few hosts costs less, spreading across hosts survives
//! a host failure better; the flavor chooses).

/// Free capacity of one host.
#[derive(Debug, Clone, PartialEq)]
pub struct HostFree {
    pub vcpus: u32,
    pub memory_mib: u64,
    /// How many more instances it takes whatever their size; `None`: as
    /// many as fit. A node whose caches use its own network (host-network
    /// pods) takes one: every cache of a region listens on the same port,
    /// the one DNS answers cannot change.
    pub slots: Option<u32>,
}

/// Resources of one instance.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    pub vcpus: u32,
    pub memory_mib: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// Fill the fullest host that still fits (best fit): fewer hosts on.
    #[default]
    Consolidate,
    /// Put each instance on the emptiest host (worst fit): a host failure
    /// takes out as little as possible.
    Spread,
}

/// How much is missing when instances do not fit.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{placed} of {wanted} instances fit; {missing_vcpus} vCPUs and {missing_memory_mib} MiB more are needed{}", full_note(*.full_hosts))]
pub struct Shortage {
    pub wanted: usize,
    pub placed: usize,
    pub missing_vcpus: u32,
    pub missing_memory_mib: u64,
    /// Hosts with room for one more that take no more instances (their
    /// slots are used).
    pub full_hosts: usize,
}

fn full_note(full_hosts: usize) -> String {
    if full_hosts == 0 {
        return String::new();
    }
    format!(", and {full_hosts} hosts with room take no more instances")
}

/// Chooses a host (index into `hosts`) for each of `count` instances.
/// Deterministic: ties go to the lower index.
pub fn place(
    count: usize,
    shape: Shape,
    hosts: &[HostFree],
    strategy: Strategy,
) -> Result<Vec<usize>, Shortage> {
    let mut free = hosts.to_vec();
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let room = |h: &HostFree| h.vcpus >= shape.vcpus && h.memory_mib >= shape.memory_mib;
        let fits = |h: &HostFree| room(h) && h.slots != Some(0);
        let pick = free
            .iter()
            .enumerate()
            .filter(|(_, h)| fits(h))
            .min_by_key(|(i, h)| match strategy {
                Strategy::Consolidate => (h.vcpus as i64, *i),
                Strategy::Spread => (-(h.vcpus as i64), *i),
            })
            .map(|(i, _)| i);
        match pick {
            Some(i) => {
                free[i].vcpus -= shape.vcpus;
                free[i].memory_mib -= shape.memory_mib;
                if let Some(n) = &mut free[i].slots {
                    *n -= 1;
                }
                out.push(i);
            }
            None => {
                let left = (count - out.len()) as u32;
                let have_v: u32 = free.iter().map(|h| h.vcpus).sum();
                let have_m: u64 = free.iter().map(|h| h.memory_mib).sum();
                return Err(Shortage {
                    wanted: count,
                    placed: out.len(),
                    missing_vcpus: (left * shape.vcpus)
                        .saturating_sub(have_v)
                        .max(shape.vcpus.min(1)),
                    missing_memory_mib: (left as u64 * shape.memory_mib).saturating_sub(have_m),
                    full_hosts: free.iter().filter(|h| room(h)).count(),
                });
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts() -> Vec<HostFree> {
        vec![
            HostFree {
                vcpus: 4,
                memory_mib: 4096,
                slots: None,
            },
            HostFree {
                vcpus: 2,
                memory_mib: 4096,
                slots: None,
            },
            HostFree {
                vcpus: 4,
                memory_mib: 4096,
                slots: None,
            },
        ]
    }
    const ONE: Shape = Shape {
        vcpus: 1,
        memory_mib: 256,
    };

    #[test]
    fn consolidate_fills_the_fullest_host_first() {
        assert_eq!(
            place(3, ONE, &hosts(), Strategy::Consolidate).unwrap(),
            vec![1, 1, 0]
        );
    }

    #[test]
    fn spread_uses_the_emptiest_host_each_time() {
        assert_eq!(
            place(4, ONE, &hosts(), Strategy::Spread).unwrap(),
            vec![0, 2, 0, 2]
        );
    }

    #[test]
    fn a_shortage_says_how_much_is_missing() {
        let e = place(12, ONE, &hosts(), Strategy::Spread).unwrap_err();
        assert_eq!((e.placed, e.missing_vcpus), (10, 2));
        let big = Shape {
            vcpus: 1,
            memory_mib: 5000,
        };
        let e = place(1, big, &hosts(), Strategy::Consolidate).unwrap_err();
        assert_eq!(e.placed, 0);
        assert!(e.to_string().contains("0 of 1 instances fit"), "{e}");
    }

    #[test]
    fn a_host_with_one_slot_takes_one_instance_whatever_its_room() {
        let mut h = hosts();
        h[0].slots = Some(1);
        h[2].slots = Some(0);
        assert_eq!(
            place(3, ONE, &h, Strategy::Spread).unwrap(),
            vec![0, 1, 1],
            "host 0 once, host 2 never"
        );
        let e = place(4, ONE, &h, Strategy::Spread).unwrap_err();
        assert_eq!(e.placed, 3);
        assert!(
            e.to_string()
                .contains("2 hosts with room take no more instances"),
            "{e}"
        );
    }
}
