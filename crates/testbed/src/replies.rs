//! Replies of memcached-protocol servers as conformance tests compare them: binary packets cut
//! apart, and what legitimately differs between two servers masked (CAS values, times that
//! tick, versions).

/// The complete binary packets at the front of `buf`.
pub fn packets(buf: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut at = 0;
    while buf.len() >= at + 24 {
        let body = u32::from_be_bytes([buf[at + 8], buf[at + 9], buf[at + 10], buf[at + 11]]);
        let end = at + 24 + body as usize;
        if buf.len() < end {
            break;
        }
        out.push(&buf[at..end]);
        at = end;
    }
    out
}

/// Opaque of the binary `NOOP` that closes an exchange.
pub const SENTINEL: u32 = 0xfeed_face;

/// True once the last complete packet is the sentinel `NOOP`'s reply.
pub fn ends_with_sentinel(buf: &[u8]) -> bool {
    packets(buf)
        .last()
        .is_some_and(|p| p[1] == 0x0a && p[12..16] == SENTINEL.to_be_bytes())
}

/// The last CAS value in a text reply: a `gets` `VALUE` line or a meta `c` flag.
pub fn last_cas(reply: &str) -> Option<String> {
    let mut cas = None;
    for line in reply.split("\r\n") {
        let tokens: Vec<&str> = line.split(' ').collect();
        if tokens[0] == "VALUE" && tokens.len() == 5 {
            cas = Some(tokens[4].to_string());
        }
        if matches!(tokens[0], "HD" | "VA") {
            for t in &tokens[1..] {
                if let Some(v) = t.strip_prefix('c').filter(|v| v.parse::<u64>().is_ok()) {
                    cas = Some(v.to_string());
                }
            }
        }
    }
    cas
}

/// Masks what legitimately differs between two memcached processes: CAS values (each server
/// counts its own), times that may tick, the version, and `me`'s item internals.
pub fn normalise_text(reply: &str) -> String {
    let number = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit() || b == b'-');
    reply
        .split("\r\n")
        .map(|line| {
            let mut tokens: Vec<String> = line.split(' ').map(str::to_string).collect();
            match tokens[0].as_str() {
                "VALUE" if tokens.len() == 5 => tokens[4] = "#".into(),
                "VERSION" => tokens.truncate(1),
                "HD" | "VA" | "EN" | "NS" | "EX" | "NF" => {
                    for t in tokens.iter_mut().skip(1) {
                        for flag in ['c', 't'] {
                            if t.starts_with(flag) && number(&t[1..]) {
                                *t = format!("{flag}#");
                            }
                        }
                    }
                }
                // `fetch` and `size` depend on whether memcached updated an item in place or
                // made a new one, which turns on its own reference counts: it varies between
                // two runs against memcached itself.
                "ME" => {
                    for t in tokens.iter_mut().skip(2) {
                        if let Some((name, _)) = t.split_once('=') {
                            if matches!(name, "exp" | "la" | "cas" | "fetch" | "size") {
                                *t = format!("{name}=#");
                            }
                        }
                    }
                }
                _ => {}
            }
            tokens.join(" ")
        })
        .collect::<Vec<_>>()
        .join("\r\n")
}

/// Zeroes CAS fields and masks the version string.
pub fn normalise_binary(reply: &[u8]) -> Vec<Vec<u8>> {
    packets(reply)
        .into_iter()
        .map(|p| {
            let mut p = p.to_vec();
            p[16..24].fill(0);
            if p[1] == 0x0b {
                p.truncate(24);
                p[8..12].fill(0);
            }
            p
        })
        .collect()
}
