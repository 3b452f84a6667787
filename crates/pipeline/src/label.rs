//! MPLS label stack entries (RFC 3032): 20 bits of label, 3 of traffic class, the bottom-of-stack
//! bit and an 8-bit TTL, in front of the payload behind the Ethernet addresses, ethertype
//! 0x8847. Every function checks bounds first.

use crate::reason;

/// Where the top label stack entry starts: after the Ethernet addresses and ethertype.
pub(crate) const AT: usize = 14;
/// Length of one label stack entry.
pub(crate) const LEN: usize = 4;
const ETHERTYPE_MPLS: [u8; 2] = [0x88, 0x47];
const ETHERTYPE_IPV4: [u8; 2] = [0x08, 0x00];
const ETHERTYPE_IPV6: [u8; 2] = [0x86, 0xdd];
const DEFAULT_TTL: u8 = 64;

fn labelled(frame: &[u8]) -> bool {
    frame.len() >= AT + LEN && frame[12..14] == ETHERTYPE_MPLS
}

/// The ethertype and label stack entry a push of `label` writes in place of `frame`'s
/// ethertype; `None` for a frame shorter than an Ethernet header.
pub(crate) fn push(frame: &[u8], label: u32) -> Option<([u8; 2], [u8; LEN])> {
    if frame.len() < AT {
        return None;
    }
    let (bottom, ttl) = if labelled(frame) {
        (0, frame[AT + 3])
    } else if frame[12..14] == ETHERTYPE_IPV4 && frame.len() >= AT + 20 {
        (1, frame[AT + 8])
    } else {
        (1, DEFAULT_TTL)
    };
    let word = (label << 12) | (bottom << 8) | u32::from(ttl);
    Some((ETHERTYPE_MPLS, word.to_be_bytes()))
}

/// The ethertype a pop of `frame`'s top label leaves it with, or the reason it cannot.
pub(crate) fn pop(frame: &[u8]) -> Result<[u8; 2], u16> {
    if !labelled(frame) {
        return Err(reason::NO_LABEL);
    }
    if frame[AT + 2] & 1 == 0 {
        return Ok(ETHERTYPE_MPLS);
    }
    match frame.get(AT + LEN).map(|b| b >> 4) {
        Some(4) => Ok(ETHERTYPE_IPV4),
        Some(6) => Ok(ETHERTYPE_IPV6),
        _ => Err(reason::LABEL_PAYLOAD_UNKNOWN),
    }
}

/// Writes `label` into `frame`'s top entry and decrements its TTL (a label switched hop by hop
/// in a loop runs out), or the reason it cannot: no label, or a TTL of 0 or 1.
pub(crate) fn swap(frame: &mut [u8], label: u32) -> Result<(), u16> {
    if !labelled(frame) {
        return Err(reason::NO_LABEL);
    }
    let entry = &mut frame[AT..AT + LEN];
    let old = u32::from_be_bytes([entry[0], entry[1], entry[2], entry[3]]);
    let ttl = old & 0xff;
    if ttl <= 1 {
        return Err(reason::TTL_EXPIRED);
    }
    entry.copy_from_slice(&((label << 12) | (old & 0xf00) | (ttl - 1)).to_be_bytes());
    Ok(())
}

/// The length of the label stack `entries` starts with: up to and including the first entry
/// with the bottom-of-stack bit; `None` when no entry within `entries` has it.
pub fn stack_len(entries: &[u8]) -> Option<usize> {
    entries
        .chunks_exact(LEN)
        .position(|entry| entry[2] & 1 == 1)
        .map(|i| (i + 1) * LEN)
}

/// The top label of `frame`, if it has one.
pub fn top(frame: &[u8]) -> Option<u32> {
    labelled(frame)
        .then(|| u32::from_be_bytes([frame[AT], frame[AT + 1], frame[AT + 2], frame[AT + 3]]) >> 12)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(label: u32, bottom: bool) -> [u8; LEN] {
        ((label << 12) | (u32::from(bottom) << 8) | 64).to_be_bytes()
    }

    #[test]
    fn a_stack_ends_at_its_first_bottom_entry_and_must_end_within_the_bytes() {
        let one = entry(5, true);
        assert_eq!(stack_len(&one), Some(4));
        let three = [
            entry(1, false),
            entry(2, false),
            entry(3, true),
            entry(4, true),
        ]
        .concat();
        assert_eq!(stack_len(&three), Some(12));
        let open = [entry(1, false), entry(2, false)].concat();
        assert_eq!(stack_len(&open), None);
        // A bottom bit in a partial entry at the end does not count.
        assert_eq!(
            stack_len(&[entry(1, false).as_slice(), &[0, 0, 1]].concat()),
            None
        );
        assert_eq!(stack_len(&[]), None);
    }
}
