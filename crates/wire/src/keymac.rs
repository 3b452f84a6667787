//! SwitchKV's key encoding (its section 3.1.1): a client puts a query's key in the
//! destination MAC, a two-byte prefix and the 32-bit hash of the key the pool routes by, and
//! the key's backend in the destination IP. The prefix tells the switch what the query is:
//! [`Kind::Get`] for a client's read, which a rule for its key may send to a cache node;
//! [`Kind::Other`] for everything else (writes, and a read a cache node sends on), which
//! goes to the backend in the destination IP.
//!
//! Both prefixes are locally administered unicast addresses (bit 1 of the first byte set,
//! bit 0 clear), so no vendor's card carries them.

use crate::ethernet::Mac;

/// The prefix of a client's read.
pub const GET_PREFIX: [u8; 2] = [0x02, 0x4b];
/// The prefix of every other query.
pub const OTHER_PREFIX: [u8; 2] = [0x06, 0x4b];

/// What a query's prefix says it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A client's read: a cache node may answer it.
    Get,
    /// Anything else: only the key's backend may.
    Other,
}

/// The destination MAC of a query of `kind` for a key that hashes to `hash`.
pub fn encode(kind: Kind, hash: u32) -> Mac {
    let prefix = match kind {
        Kind::Get => GET_PREFIX,
        Kind::Other => OTHER_PREFIX,
    };
    let h = hash.to_be_bytes();
    Mac([prefix[0], prefix[1], h[0], h[1], h[2], h[3]])
}

/// The kind and key hash a destination MAC encodes, or `None` for any other address.
pub fn decode(mac: Mac) -> Option<(Kind, u32)> {
    let m = mac.0;
    let kind = match [m[0], m[1]] {
        GET_PREFIX => Kind::Get,
        OTHER_PREFIX => Kind::Other,
        _ => return None,
    };
    Some((kind, u32::from_be_bytes([m[2], m[3], m[4], m[5]])))
}

/// Whether `mac` carries the other prefix: a query no cache node may answer, such as a read a
/// cache node sends back through the switch.
pub fn is_other(mac: Mac) -> bool {
    decode(mac).is_some_and(|(kind, _)| kind == Kind::Other)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_mac_gives_back_its_kind_and_hash() {
        for (kind, hash) in [
            (Kind::Get, 0),
            (Kind::Other, u32::MAX),
            (Kind::Get, 0xdead_beef),
        ] {
            let mac = encode(kind, hash);
            assert!(mac.is_unicast(), "{mac:?}");
            assert_eq!(decode(mac), Some((kind, hash)));
            assert_eq!(is_other(mac), kind == Kind::Other);
        }
        assert_eq!(encode(Kind::Get, 0x0102_0304).0, [0x02, 0x4b, 1, 2, 3, 4]);
    }

    #[test]
    fn other_addresses_are_not_queries() {
        for mac in [
            Mac([0x02, 0x4c, 1, 2, 3, 4]),
            Mac([0x06, 0x4a, 1, 2, 3, 4]),
            Mac::BROADCAST,
            Mac([0; 6]),
        ] {
            assert_eq!(decode(mac), None, "{mac:?}");
            assert!(!is_other(mac), "{mac:?}");
        }
    }
}
