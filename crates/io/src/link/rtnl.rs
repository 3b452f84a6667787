//! One rtnetlink request and the kernel's answer to it, on a blocking socket: the messages
//! `ip link`, `ip addr` and `ip route` send, without the programs. Never dumps a table or
//! listens for events.

use std::fmt;
use std::io;

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NlasIterator, NLM_F_ACK, NLM_F_ACK_TLVS,
    NLM_F_CAPPED, NLM_F_REQUEST,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

/// The length of a netlink message header (`struct nlmsghdr`).
const HEADER_LEN: usize = 16;

/// The extended acknowledgement's attribute that holds the kernel's message, a NUL-terminated
/// string (`NLMSGERR_ATTR_MSG` in <linux/netlink.h>).
const NLMSGERR_ATTR_MSG: u16 = 1;

/// The sequence number of every request: each has a socket of its own, so one number tells
/// the answer from anything else that arrives.
const SEQUENCE: u32 = 1;

/// The kernel's refusal of a request: its errno and, where it gave one, its own explanation.
/// Displayed as `Invalid argument (os error 22): mtu greater than device maximum`.
#[derive(Debug)]
pub(super) struct Refusal {
    errno: i32,
    says: Option<String>,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", io::Error::from_raw_os_error(self.errno))?;
        match &self.says {
            Some(text) => write!(f, ": {text}"),
            None => Ok(()),
        }
    }
}

impl std::error::Error for Refusal {}

impl From<Refusal> for io::Error {
    fn from(refusal: Refusal) -> io::Error {
        let kind = io::Error::from_raw_os_error(refusal.errno).kind();
        io::Error::new(kind, refusal)
    }
}

/// The errno of `error` if it is the kernel's refusal of a request.
pub(super) fn errno(error: &io::Error) -> Option<i32> {
    let refusal = error.get_ref()?.downcast_ref::<Refusal>()?;
    Some(refusal.errno)
}

/// Sends `message` with `flags` (besides `NLM_F_REQUEST | NLM_F_ACK`) and waits for the
/// kernel's acknowledgement.
///
/// A refusal is an error of the kind its errno maps to, carrying a [`Refusal`] ([`errno`]
/// reads it back). Fails also if the socket cannot be opened (a missing CAP_NET_ADMIN is a
/// refusal, not this) or the answer cannot be parsed.
pub(super) fn request(message: RouteNetlinkMessage, flags: u16) -> io::Result<()> {
    let mut socket = Socket::new(NETLINK_ROUTE)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    // Best effort: the kernel's own words on a refusal, and no copy of the request in it.
    let _ = socket.set_ext_ack(true);
    let _ = socket.set_cap_ack(true);

    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
    header.sequence_number = SEQUENCE;
    let mut packet = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(message));
    packet.finalize();
    let mut bytes = vec![0; packet.buffer_len()];
    packet.serialize(&mut bytes);
    socket.send(&bytes, 0)?;

    loop {
        let (datagram, _) = socket.recv_from_full()?;
        if let Some(answer) = answer(&datagram)? {
            return answer;
        }
    }
}

/// The acknowledgement of our request in one datagram from the kernel, if it holds one: the
/// outer error is a datagram that does not parse, the inner one the kernel's refusal.
fn answer(mut datagram: &[u8]) -> io::Result<Option<io::Result<()>>> {
    while datagram.len() >= HEADER_LEN {
        let message = NetlinkMessage::<RouteNetlinkMessage>::deserialize(datagram)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
        let len = message.header.length as usize;
        if let (SEQUENCE, NetlinkPayload::Error(error)) =
            (message.header.sequence_number, &message.payload)
        {
            let Some(code) = error.code else {
                return Ok(Some(Ok(())));
            };
            let refusal = Refusal {
                errno: code.get().saturating_neg(),
                says: kernel_says(message.header.flags, &error.header),
            };
            return Ok(Some(Err(refusal.into())));
        }
        // Messages are padded to four bytes; `len` is at least a header, or parsing failed.
        datagram = datagram.get(len.next_multiple_of(4)..).unwrap_or_default();
    }
    Ok(None)
}

/// The kernel's explanation of a refusal, from the extended acknowledgement's attributes.
/// `rest` is what follows the errno: the request's header (and, unless `NLM_F_CAPPED`, the
/// whole request), then the attributes if `NLM_F_ACK_TLVS` is set.
fn kernel_says(flags: u16, rest: &[u8]) -> Option<String> {
    if flags & NLM_F_ACK_TLVS == 0 {
        return None;
    }
    let request_len = if flags & NLM_F_CAPPED != 0 {
        HEADER_LEN
    } else {
        let len = rest.get(..4)?.try_into().ok().map(u32::from_ne_bytes)? as usize;
        len.next_multiple_of(4)
    };
    NlasIterator::new(rest.get(request_len..)?)
        .filter_map(Result::ok)
        .find(|nla| nla.kind() == NLMSGERR_ATTR_MSG)
        .map(|nla| {
            let text = nla.value();
            let text = text.split(|&b| b == 0).next().unwrap_or(text);
            String::from_utf8_lossy(text).into_owned()
        })
        .filter(|text| !text.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An NLMSG_ERROR for sequence 1, EINVAL, capped, with the message "bad mtu".
    const REFUSAL: [u8; 48] = [
        48, 0, 0, 0, // length
        2, 0, // NLMSG_ERROR
        0x00, 0x03, // NLM_F_CAPPED | NLM_F_ACK_TLVS
        1, 0, 0, 0, // sequence
        0, 0, 0, 0, // port
        0xea, 0xff, 0xff, 0xff, // -22
        16, 0, 0, 0, 16, 0, 5, 0, 1, 0, 0, 0, 0, 0, 0, 0, // the request's header
        12, 0, 1, 0, b'b', b'a', b'd', b' ', b'm', b't', b'u', 0, // NLMSGERR_ATTR_MSG
    ];

    #[test]
    fn a_refusal_carries_the_errno_and_the_kernels_words() {
        let err = answer(&REFUSAL).unwrap().unwrap().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(errno(&err), Some(libc::EINVAL));
        let text = err.to_string();
        assert!(text.contains("os error 22"), "{text}");
        assert!(text.ends_with(": bad mtu"), "{text}");
    }

    #[test]
    fn a_refusal_without_words_is_the_plain_errno() {
        let mut bytes = REFUSAL;
        bytes[0] = 36;
        bytes[7] = 0x01; // NLM_F_CAPPED only
        let err = answer(&bytes[..36]).unwrap().unwrap().unwrap_err();
        assert_eq!(errno(&err), Some(libc::EINVAL));
        assert_eq!(
            err.to_string(),
            io::Error::from_raw_os_error(22).to_string()
        );
    }

    #[test]
    fn an_ack_is_success_and_other_sequences_are_skipped() {
        let mut ack = [0u8; 36];
        ack[..16].copy_from_slice(&[36, 0, 0, 0, 2, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0]);
        ack[20..24].copy_from_slice(&[16, 0, 0, 0]);
        assert!(matches!(answer(&ack), Ok(Some(Ok(())))));

        let mut other = ack;
        other[8] = 2;
        assert!(matches!(answer(&other), Ok(None)));
    }

    #[test]
    fn a_truncated_datagram_is_an_error_not_a_panic() {
        assert!(answer(&REFUSAL[..20]).is_err());
        assert!(matches!(answer(&REFUSAL[..8]), Ok(None)));
    }
}
