//! The global registration table (IncBricks 4.4): indexed by key hash, replicated on every
//! switch, it names the root a key is cached at on its way between two racks. With the
//! client's ToR and the key's home ToR, which cache always, that makes the key's designated
//! switches and its deterministic path. A controller replaces the whole table, under a new
//! version, when a switch fails or comes back; until then traffic to a failed root takes
//! another one and is cached nowhere on the way.

use std::collections::BTreeSet;
use std::fmt;

use super::SwitchId;

/// Most buckets a table has.
pub const MAX_BUCKETS: usize = 1 << 16;

/// A table of designated roots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    version: u64,
    /// Per bucket (key hash modulo the length), the designated root.
    roots: Vec<SwitchId>,
    /// Switches the controller found failed: no key is designated there, and their copies
    /// are gone.
    failed: BTreeSet<SwitchId>,
}

/// Why a table cannot be built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistrationError {
    NoBuckets,
    TooManyBuckets(usize),
    /// A bucket names a switch the same table says failed.
    FailedRoot(SwitchId),
}

impl fmt::Display for RegistrationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegistrationError::NoBuckets => write!(f, "the table has no buckets"),
            RegistrationError::TooManyBuckets(n) => {
                write!(f, "{n} buckets: at most {MAX_BUCKETS}")
            }
            RegistrationError::FailedRoot(id) => {
                write!(f, "a bucket names switch {id}, which the table says failed")
            }
        }
    }
}

impl std::error::Error for RegistrationError {}

/// A key's designated switches between a client's ToR and its home's ToR, in path order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Path {
    pub client_tor: SwitchId,
    /// The designated root; `None` within one rack.
    pub root: Option<SwitchId>,
    pub home_tor: SwitchId,
}

impl Path {
    /// The designated switches, client side first, each once.
    pub fn switches(&self) -> impl Iterator<Item = SwitchId> + '_ {
        let home = (self.home_tor != self.client_tor).then_some(self.home_tor);
        std::iter::once(self.client_tor)
            .chain(self.root)
            .chain(home)
    }
}

impl Registration {
    /// A table from explicit buckets.
    pub fn new(
        version: u64,
        roots: Vec<SwitchId>,
        failed: BTreeSet<SwitchId>,
    ) -> Result<Registration, RegistrationError> {
        if roots.is_empty() {
            return Err(RegistrationError::NoBuckets);
        }
        if roots.len() > MAX_BUCKETS {
            return Err(RegistrationError::TooManyBuckets(roots.len()));
        }
        if let Some(&bad) = roots.iter().find(|r| failed.contains(r)) {
            return Err(RegistrationError::FailedRoot(bad));
        }
        Ok(Registration {
            version,
            roots,
            failed,
        })
    }

    /// The table a controller installs: `buckets` buckets spread in turn over the roots not
    /// in `failed`. `None` when every root failed.
    pub fn spread(
        version: u64,
        roots: &[SwitchId],
        failed: &BTreeSet<SwitchId>,
        buckets: usize,
    ) -> Option<Registration> {
        let alive: Vec<SwitchId> = roots
            .iter()
            .copied()
            .filter(|r| !failed.contains(r))
            .collect();
        if alive.is_empty() || buckets == 0 || buckets > MAX_BUCKETS {
            return None;
        }
        let table = (0..buckets).map(|i| alive[i % alive.len()]).collect();
        Some(Registration {
            version,
            roots: table,
            failed: failed.clone(),
        })
    }

    pub fn version(&self) -> u64 {
        self.version
    }

    pub fn buckets(&self) -> &[SwitchId] {
        &self.roots
    }

    pub fn failed(&self) -> &BTreeSet<SwitchId> {
        &self.failed
    }

    pub fn is_failed(&self, id: SwitchId) -> bool {
        self.failed.contains(&id)
    }

    /// The root a key is designated at.
    pub fn root(&self, key_hash: u32) -> SwitchId {
        self.roots[key_hash as usize % self.roots.len()]
    }

    /// The designated path of a key from a client's ToR to its home's ToR.
    pub fn path(&self, key_hash: u32, client_tor: SwitchId, home_tor: SwitchId) -> Path {
        Path {
            client_tor,
            root: (client_tor != home_tor).then(|| self.root(key_hash)),
            home_tor,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_spread_over_the_live_roots_only() {
        let none = BTreeSet::new();
        let t = Registration::spread(1, &[4, 5], &none, 8).unwrap();
        assert_eq!(t.buckets(), &[4, 5, 4, 5, 4, 5, 4, 5]);
        assert_eq!(t.root(3), 5);
        assert_eq!(t.root(8 + 2), 4);
        let failed = BTreeSet::from([5]);
        let t = Registration::spread(2, &[4, 5], &failed, 8).unwrap();
        assert!(t.buckets().iter().all(|&r| r == 4));
        assert!(t.is_failed(5));
        assert!(Registration::spread(3, &[5], &failed, 8).is_none());
    }

    #[test]
    fn a_path_within_a_rack_has_no_root() {
        let t = Registration::spread(1, &[4, 5], &BTreeSet::new(), 2).unwrap();
        let p = t.path(1, 0, 0);
        assert_eq!(p.switches().collect::<Vec<_>>(), vec![0]);
        let p = t.path(1, 0, 2);
        assert_eq!(p.root, Some(5));
        assert_eq!(p.switches().collect::<Vec<_>>(), vec![0, 5, 2]);
        // The same key between the same racks always takes the same root.
        assert_eq!(t.path(1, 2, 0).root, Some(5));
    }

    #[test]
    fn bad_tables_are_refused() {
        assert_eq!(
            Registration::new(1, vec![], BTreeSet::new()),
            Err(RegistrationError::NoBuckets)
        );
        assert_eq!(
            Registration::new(1, vec![4, 5], BTreeSet::from([5])),
            Err(RegistrationError::FailedRoot(5))
        );
        assert!(Registration::new(1, vec![4; MAX_BUCKETS + 1], BTreeSet::new()).is_err());
    }
}
