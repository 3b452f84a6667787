//! Reason codes carried by [`Verdict::Drop`](crate::Verdict::Drop).
//!
//! Codes below [`USER_BASE`] are reserved for drops the pipeline itself decides; entries may not
//! use them in [`Action::Drop`](crate::Action::Drop) (insertion fails with
//! [`Error::ReservedReason`](crate::Error::ReservedReason)), so a verdict always says who
//! dropped the frame. The caller defines its own codes from [`USER_BASE`] up.
//!
//! [`Action::ToCpu`](crate::Action::ToCpu) codes belong entirely to the caller: the pipeline never
//! sends a frame to the CPU on its own.

/// First reason code available to the caller.
pub const USER_BASE: u16 = 256;

/// Processing ended without any terminal action (`Output`, `Flood`, `ToCpu`, `Drop`).
pub const NO_VERDICT: u16 = 1;
/// The pipeline has no tables, so there is no table 0 to start from.
pub const NO_TABLES: u16 = 2;
/// A selector's chooser returned `None` (for example, an empty ring).
pub const NO_SELECTOR_MEMBER: u16 = 3;
/// A selector's chooser returned an index past the end of its member list.
pub const SELECTOR_OUT_OF_RANGE: u16 = 4;
/// A `Goto` named a table that does not exist, or (from a selector member) a table that is not
/// after the current one.
pub const BAD_GOTO: u16 = 5;
/// `DecTtl` found an IPv4 TTL of 0 or 1, or `SwapLabel` a label TTL of 0 or 1.
pub const TTL_EXPIRED: u16 = 6;
/// An `Interface` action found no entry in the interface table.
pub const NO_INTERFACE: u16 = 7;
/// `PopLabel` or `SwapLabel` found no MPLS label (ethertype 0x8847) on the frame.
pub const NO_LABEL: u16 = 8;
/// `PopLabel` took the bottom label off a payload that is neither IPv4 nor IPv6, so the
/// ethertype to give it is unknown.
pub const LABEL_PAYLOAD_UNKNOWN: u16 = 9;
/// `PushLabel` would make the frame longer than [`MAX_FRAME_LEN`](crate::MAX_FRAME_LEN).
pub const FRAME_TOO_LONG: u16 = 10;
/// `StripUdpPayload` found no UDP datagram it could take the bytes from: not IPv4 with a UDP
/// header, a fragment, lengths that disagree, or a payload shorter than the bytes to remove.
pub const NO_UDP_PAYLOAD: u16 = 11;

/// Every pipeline reason code, in order, with its name.
pub const ALL: [(u16, &str); 11] = [
    (NO_VERDICT, "no_verdict"),
    (NO_TABLES, "no_tables"),
    (NO_SELECTOR_MEMBER, "no_selector_member"),
    (SELECTOR_OUT_OF_RANGE, "selector_out_of_range"),
    (BAD_GOTO, "bad_goto"),
    (TTL_EXPIRED, "ttl_expired"),
    (NO_INTERFACE, "no_interface"),
    (NO_LABEL, "no_label"),
    (LABEL_PAYLOAD_UNKNOWN, "label_payload_unknown"),
    (FRAME_TOO_LONG, "frame_too_long"),
    (NO_UDP_PAYLOAD, "no_udp_payload"),
];

/// The name of a pipeline reason code, or `None` for an unknown or caller-defined code.
pub fn name(code: u16) -> Option<&'static str> {
    ALL.iter().find(|(c, _)| *c == code).map(|(_, n)| *n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_distinct_and_reserved() {
        for (i, (c, _)) in ALL.iter().enumerate() {
            assert!(*c < USER_BASE);
            assert_eq!(usize::from(*c), i + 1);
        }
        assert_eq!(name(TTL_EXPIRED), Some("ttl_expired"));
        assert_eq!(name(USER_BASE), None);
    }
}
