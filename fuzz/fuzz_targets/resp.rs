//! Redis's protocol: requests and replies from arbitrary bytes.
//!
//! Contract checked: reading a client's stream whole and reading it one byte at a time (as
//! bytes may arrive) find the same commands and the same protocol error at the same place;
//! every error has its reply; a command re-encoded reads back as itself. A reply is framed the
//! same whole and in pieces, and within the bytes given; a framed array's elements are whole
//! replies. Nothing panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wire::resp::{self, Command, ProtocolError, ReplyFramer, RequestParser, Step};

/// The commands of `stream` and how it ended, fed `chunk` bytes at a time.
fn read(stream: &[u8], chunk: usize) -> (Vec<Command>, Option<ProtocolError>) {
    let mut parser = RequestParser::default();
    let mut buf = Vec::new();
    let mut commands = Vec::new();
    for piece in stream.chunks(chunk.max(1)) {
        buf.extend_from_slice(piece);
        loop {
            match parser.step(&buf, false) {
                Ok((used, Step::More)) => {
                    assert!(used <= buf.len());
                    buf.drain(..used);
                    break;
                }
                Ok((used, Step::Command(c))) => {
                    assert!(used > 0 && used <= buf.len());
                    buf.drain(..used);
                    commands.push(c);
                }
                Err(e) => {
                    assert!(e.reply().starts_with(b"-ERR Protocol error: "));
                    return (commands, Some(e));
                }
            }
        }
    }
    (commands, None)
}

fuzz_target!(|data: &[u8]| {
    // Requests shorter than the inline limit: past it, when the limit is seen depends on how
    // much arrived at once, as it does for a server.
    if data.len() < resp::MAX_INLINE {
        let whole = read(data, data.len());
        let bytewise = read(data, 1);
        assert_eq!(whole, bytewise);
        for command in whole.0.iter().filter(|c| !c.is_empty()) {
            let mut encoded = Vec::new();
            command.encode(&mut encoded);
            let (again, error) = read(&encoded, encoded.len());
            assert_eq!((again.as_slice(), error), (std::slice::from_ref(command), None));
        }
    }
    let framed = ReplyFramer::default().reply_len(data);
    if let Ok(Some(len)) = framed {
        assert!(len > 0 && len <= data.len());
        let mut framer = ReplyFramer::default();
        let bytewise = (1..=len).find_map(|n| framer.reply_len(&data[..n]).ok().flatten());
        assert_eq!(bytewise, Some(len));
        if let Some(elements) = resp::array_elements(&data[..len]) {
            for e in elements {
                assert_eq!(ReplyFramer::default().reply_len(e), Ok(Some(e.len())));
            }
        }
    }
    let _ = (resp::redirection(data), resp::integer(data), resp::key_slot(data));
});
