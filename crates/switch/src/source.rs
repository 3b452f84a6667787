//! The source-address check of the switch's ports (`switch.source_check`): an IPv4 source
//! address is accepted on one port only, the port configured for it or the first port it was
//! seen on, for as long as it keeps being seen there. A frame from a bound address on another
//! port is spoofed. Pure: the time comes from the caller, and the table is bounded.

use std::collections::HashMap;
use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;
use std::time::Duration;

use kv::Instant;

/// An IPv4 prefix such as `10.0.0.0/24`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prefix {
    pub addr: Ipv4Addr,
    pub len: u8,
}

impl Prefix {
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        let mask = match self.len {
            0 => 0,
            len => u32::MAX << (32 - u32::from(len.min(32))),
        };
        u32::from(ip) & mask == u32::from(self.addr) & mask
    }
}

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl FromStr for Prefix {
    type Err = PrefixError;

    /// `a.b.c.d/len`, or a bare address (a /32).
    fn from_str(s: &str) -> Result<Prefix, PrefixError> {
        let (addr, len) = match s.split_once('/') {
            Some((a, l)) => (a, l),
            None => (s, "32"),
        };
        let addr: Ipv4Addr = addr
            .parse()
            .map_err(|_| PrefixError::Address(s.to_owned()))?;
        let len: u8 = len
            .parse()
            .ok()
            .filter(|l| *l <= 32)
            .ok_or_else(|| PrefixError::Length(s.to_owned()))?;
        Ok(Prefix { addr, len })
    }
}

/// Text that is not an IPv4 prefix; each variant holds the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrefixError {
    /// The part before the `/` is not an IPv4 address.
    #[error("`{0}` is not an IPv4 prefix such as 10.0.0.0/24")]
    Address(String),
    /// The part after the `/` is not a number from 0 to 32.
    #[error("`{0}`: the prefix length must be 0 to 32")]
    Length(String),
}

/// What the check makes of one source address on one port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    Accept,
    /// Bound to another port, or outside the prefixes configured for this one.
    Spoofed,
    /// New, and the table (or this port's share of it) is full.
    TableFull,
}

/// The bound addresses.
pub struct SourceGuard {
    /// Per port, the prefixes configured for it; an empty list: learned addresses only.
    prefixes: Vec<Vec<Prefix>>,
    /// The bound addresses: looked up, counted, and pruned binding by binding.
    bound: HashMap<Ipv4Addr, Binding>,
    /// Addresses bound to each port.
    per_port: Vec<usize>,
    capacity: usize,
    /// Most addresses one port may hold, so that one port's made-up addresses cannot fill the
    /// table for every other.
    port_share: usize,
    age: Duration,
}

struct Binding {
    port: u16,
    seen: Instant,
}

impl SourceGuard {
    /// `prefixes[p]` are the prefixes configured for port `p` (ports beyond the list have
    /// none); at most `capacity` addresses are learned, no port more than its share of them;
    /// a learned address not seen for `age` is forgotten.
    pub fn new(ports: usize, prefixes: Vec<Vec<Prefix>>, capacity: usize, age: Duration) -> Self {
        let mut prefixes = prefixes;
        prefixes.resize(ports.max(prefixes.len()), Vec::new());
        SourceGuard {
            per_port: vec![0; prefixes.len()],
            prefixes,
            bound: HashMap::new(),
            capacity,
            port_share: capacity.div_ceil(ports.max(1)).max(1),
            age,
        }
    }

    /// Checks `ip` arriving on `port` at `now`, learning it if it is new, and refreshing it if
    /// it is seen where it is bound. An address bound elsewhere but not seen there for the
    /// ageing time moves to `port` (a host that moved).
    pub fn check(&mut self, port: u16, ip: Ipv4Addr, now: Instant) -> Check {
        let p = usize::from(port);
        match self.by_prefixes(port, ip) {
            Some(true) => return Check::Accept,
            Some(false) => return Check::Spoofed,
            None => {}
        }
        let share_left = self.per_port.get(p).is_some_and(|n| *n < self.port_share);
        match self.bound.get_mut(&ip) {
            Some(b) if b.port == port => {
                b.seen = now;
                Check::Accept
            }
            Some(b) if now.saturating_duration_since(b.seen) > self.age => {
                if !share_left {
                    return Check::TableFull;
                }
                let old = usize::from(b.port);
                b.port = port;
                b.seen = now;
                if let Some(n) = self.per_port.get_mut(old) {
                    *n = n.saturating_sub(1);
                }
                self.per_port[p] += 1;
                Check::Accept
            }
            Some(_) => Check::Spoofed,
            None => {
                if !share_left || self.bound.len() >= self.capacity {
                    return Check::TableFull;
                }
                self.bound.insert(ip, Binding { port, seen: now });
                self.per_port[p] += 1;
                Check::Accept
            }
        }
    }

    /// Whether [`SourceGuard::check`] would accept `ip` on `port` now without learning or moving
    /// anything: a prefix of the port holds it, or it is bound there.
    pub fn accepts(&self, port: u16, ip: Ipv4Addr) -> bool {
        self.by_prefixes(port, ip)
            .unwrap_or_else(|| self.bound.get(&ip).is_some_and(|b| b.port == port))
    }

    /// The port whose configured prefixes hold `ip`, if one does.
    pub fn configured_port(&self, ip: Ipv4Addr) -> Option<u16> {
        let p = self
            .prefixes
            .iter()
            .position(|list| list.iter().any(|x| x.contains(ip)))?;
        u16::try_from(p).ok()
    }

    /// The ageing time: how long an address (or a station) must be silent on its port before
    /// another port may take it.
    pub fn age(&self) -> Duration {
        self.age
    }

    /// What the configured prefixes decide of `ip` on `port`: accepted when the port has
    /// prefixes and one holds it, refused when the port's prefixes do not hold it or another
    /// port's do; `None` when they leave it to the bindings.
    fn by_prefixes(&self, port: u16, ip: Ipv4Addr) -> Option<bool> {
        let p = usize::from(port);
        match self.prefixes.get(p) {
            Some(own) if !own.is_empty() => Some(own.iter().any(|x| x.contains(ip))),
            _ => self
                .prefixes
                .iter()
                .enumerate()
                .any(|(q, list)| q != p && list.iter().any(|x| x.contains(ip)))
                .then_some(false),
        }
    }

    /// Forgets addresses not seen for the ageing time. Each binding is judged on its own and
    /// the per-port counts only go down, so the outcome does not depend on the map's order.
    pub fn expire(&mut self, now: Instant) {
        let age = self.age;
        let per_port = &mut self.per_port;
        self.bound.retain(|_, b| {
            let keep = now.saturating_duration_since(b.seen) <= age;
            if !keep {
                if let Some(n) = per_port.get_mut(usize::from(b.port)) {
                    *n = n.saturating_sub(1);
                }
            }
            keep
        });
    }

    /// Addresses learned.
    pub fn len(&self) -> usize {
        self.bound.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bound.is_empty()
    }
}

/// Whether `ip` can be a host's own address: not 0.0.0.0, broadcast, multicast, loopback or
/// reserved (240.0.0.0/4). Only such addresses are bound to ports.
pub fn is_host_address(ip: Ipv4Addr) -> bool {
    !(ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_loopback()
        || ip.octets()[0] >= 240)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    const B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

    #[test]
    fn prefixes_parse_and_match() {
        let p: Prefix = "10.0.0.0/30".parse().unwrap();
        assert!(p.contains(Ipv4Addr::new(10, 0, 0, 3)));
        assert!(!p.contains(Ipv4Addr::new(10, 0, 0, 4)));
        assert_eq!("10.0.0.7".parse::<Prefix>().unwrap().len, 32);
        assert!("0.0.0.0/0".parse::<Prefix>().unwrap().contains(A));
        for bad in ["10.0.0/8", "10.0.0.0/33", "x/1", "10.0.0.0/"] {
            assert!(bad.parse::<Prefix>().is_err(), "{bad}");
        }
        assert_eq!(
            "10.0.0/8".parse::<Prefix>(),
            Err(PrefixError::Address("10.0.0/8".into()))
        );
        let e = "10.0.0.0/33".parse::<Prefix>().unwrap_err();
        assert_eq!(e, PrefixError::Length("10.0.0.0/33".into()));
        assert_eq!(
            e.to_string(),
            "`10.0.0.0/33`: the prefix length must be 0 to 32"
        );
    }

    #[test]
    fn first_port_wins_until_the_address_ages_out() {
        let now = Instant::from_secs(1_000);
        let mut g = SourceGuard::new(2, vec![], 10, Duration::from_secs(60));
        assert_eq!(g.check(0, A, now), Check::Accept);
        assert_eq!(g.check(1, A, now), Check::Spoofed);
        // Still seen on port 0: the binding holds.
        let later = now + Duration::from_secs(50);
        assert_eq!(g.check(0, A, later), Check::Accept);
        assert_eq!(
            g.check(1, A, later + Duration::from_secs(50)),
            Check::Spoofed
        );
        // Silent on port 0 for longer than the ageing time: it may move.
        let moved = later + Duration::from_secs(61);
        assert_eq!(g.check(1, A, moved), Check::Accept);
        assert_eq!(g.check(0, A, moved), Check::Spoofed);
        g.expire(moved + Duration::from_secs(61));
        assert!(g.is_empty());
    }

    #[test]
    fn table_is_bounded_per_port_and_in_all() {
        let now = Instant::from_secs(1_000);
        let mut g = SourceGuard::new(2, vec![], 4, Duration::from_secs(60));
        for i in 0..2 {
            assert_eq!(g.check(0, Ipv4Addr::new(10, 1, 0, i), now), Check::Accept);
        }
        // Port 0 has used its share; port 1 still has its own.
        assert_eq!(
            g.check(0, Ipv4Addr::new(10, 1, 0, 9), now),
            Check::TableFull
        );
        assert_eq!(g.check(1, B, now), Check::Accept);
        assert_eq!(g.len(), 3);
        g.expire(now + Duration::from_secs(61));
        assert_eq!(g.check(0, Ipv4Addr::new(10, 1, 0, 9), now), Check::Accept);
    }

    #[test]
    fn configured_prefixes_bind_their_addresses() {
        let now = Instant::from_secs(1_000);
        let own = vec![vec!["10.0.0.0/31".parse().unwrap()], vec![]];
        let mut g = SourceGuard::new(2, own, 10, Duration::from_secs(60));
        assert_eq!(g.check(0, A, now), Check::Accept);
        assert_eq!(g.check(1, A, now), Check::Spoofed);
        // Port 0 accepts nothing outside its prefixes.
        assert_eq!(g.check(0, B, now), Check::Spoofed);
        assert_eq!(g.check(1, B, now), Check::Accept);
        assert_eq!(g.len(), 1, "configured addresses are not learned");
    }
}
