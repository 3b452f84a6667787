//! memcached requests in the text, meta and binary protocols, read one after another from a
//! pipelined buffer as the switch reads a datagram.
//!
//! Contract checked, for every request `parse` returns: it occupies `0 < len <= remaining`
//! bytes and `bytes()` is exactly those; its keys, data block and exptime are slices of them;
//! keys are at most `MAX_KEY_LEN` bytes and as many as `key_count()`; parsing just `&buf[..len]`
//! gives the same request; and every strict prefix is incomplete (`Ok(None)`), so a stream
//! reader waiting for more bytes never rejects a request that is still arriving. A text
//! retrieval rebuilt with `reply::write_retrieval_request` (how a split get is sent on) parses
//! back to the same command and keys. A request that fails is recovered from as memcached
//! does, within the buffer and moving forward, and reading goes on after it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wire::memcache::{self, reply, Command, Protocol, Request, MAX_KEY_LEN};

/// Requests longer than this have a sample of their prefixes checked, not all of them.
const ALL_PREFIXES_UP_TO: usize = 512;

fuzz_target!(|data: &[u8]| {
    let mut offset = 0;
    while offset < data.len() {
        let rest = &data[offset..];
        let request = match memcache::parse(rest) {
            Ok(Some(request)) => request,
            Ok(None) => break,
            Err(e) => {
                // Every error has a name and an answer (possibly empty); neither may panic.
                let _ = (
                    e.name(),
                    e.text_reply(),
                    e.binary_status(),
                    e.closes_connection(),
                );
                // Recovery stays within the buffer and always makes progress unless it closes.
                let mut out = Vec::new();
                match memcache::recover(e, rest, &mut out) {
                    Some(recovery) if recovery.close => break,
                    Some(recovery) => {
                        assert!(
                            recovery.consumed > 0 && recovery.consumed <= rest.len(),
                            "{e:?}: consumed {} of {}",
                            recovery.consumed,
                            rest.len()
                        );
                        offset += recovery.consumed;
                        continue;
                    }
                    None => break,
                }
            }
        };
        check_request(rest, &request);
        offset += request.len;
    }
});

fn within(outer: &[u8], inner: &[u8]) -> bool {
    let (start, end) = (
        outer.as_ptr() as usize,
        outer.as_ptr() as usize + outer.len(),
    );
    let (s, e) = (
        inner.as_ptr() as usize,
        inner.as_ptr() as usize + inner.len(),
    );
    inner.is_empty() || (start <= s && e <= end)
}

fn check_request(rest: &[u8], request: &Request<'_>) {
    let len = request.len;
    assert!(len > 0, "a request of zero bytes: {request:?}");
    assert!(
        len <= rest.len(),
        "len {len} beyond the {} bytes given",
        rest.len()
    );
    let bytes = request.bytes();
    assert_eq!(bytes.len(), len);
    assert_eq!(
        bytes.as_ptr(),
        rest.as_ptr(),
        "bytes() is not the front of the buffer"
    );
    assert_eq!(request.protocol, request.command.protocol());
    assert_eq!(
        request.protocol == Protocol::Binary,
        rest[0] == memcache::binary::REQUEST_MAGIC
    );

    let keys: Vec<&[u8]> = request.keys().collect();
    assert_eq!(
        keys.len(),
        request.key_count(),
        "key_count disagrees with keys()"
    );
    assert_eq!(request.key(), keys.first().copied());
    if !keys.is_empty() {
        assert!(
            request.command.has_key(),
            "{:?} reported keys",
            request.command
        );
    }
    for key in &keys {
        assert!(
            within(bytes, key),
            "key {key:?} is not a slice of the request"
        );
        assert!(key.len() <= MAX_KEY_LEN, "key of {} bytes", key.len());
    }
    if let Some(data) = request.data() {
        assert!(within(bytes, data), "data is not a slice of the request");
    }
    if let Some(exptime) = request.exptime_token() {
        assert!(
            within(bytes, exptime),
            "exptime is not a slice of the request"
        );
    }
    let _ = (
        request.noreply(),
        request.base64_key(),
        request.opaque(),
        request.command.name(),
        request.command.is_write(),
        request.command.is_retrieval(),
    );
    if let Some(name) = request.command.name() {
        assert_eq!(Command::from_name(name.as_bytes()), Some(request.command));
    }

    // The request alone parses the same.
    let alone = memcache::parse(&rest[..len]);
    assert_eq!(
        alone,
        Ok(Some(*request)),
        "the request's own {len} bytes parse differently"
    );

    // Its strict prefixes are incomplete.
    let step = if len <= ALL_PREFIXES_UP_TO {
        1
    } else {
        len / 64
    };
    let mut n = 0;
    while n < len {
        let prefix = memcache::parse(&rest[..n]);
        assert_eq!(
            prefix.map(|r| r.map(|r| r.len)),
            Ok(None),
            "prefix of {n} bytes of a {len}-byte request is not incomplete"
        );
        n += step;
    }
    let last = memcache::parse(&rest[..len - 1]);
    assert_eq!(last.map(|r| r.map(|r| r.len)), Ok(None));

    check_rebuilt_retrieval(request, &keys);
}

/// A text multi-get is rebuilt for each server when it is split; the rebuilt line must carry
/// the same command and keys.
fn check_rebuilt_retrieval(request: &Request<'_>, keys: &[&[u8]]) {
    let split = request.protocol == Protocol::Text
        && matches!(
            request.command,
            Command::Get | Command::Gets | Command::Gat | Command::Gats
        );
    if !split || keys.is_empty() {
        return;
    }
    let mut line = Vec::new();
    let written = reply::write_retrieval_request(
        request.command,
        request.exptime_token(),
        keys.iter().copied(),
        &mut line,
    );
    assert!(
        written,
        "a parsed {:?} could not be rebuilt",
        request.command
    );
    let rebuilt = match memcache::parse(&line) {
        Ok(Some(rebuilt)) => rebuilt,
        other => panic!("rebuilt line {line:?} does not parse: {other:?}"),
    };
    assert_eq!(rebuilt.len, line.len());
    assert_eq!(rebuilt.command, request.command);
    assert_eq!(rebuilt.exptime_token(), request.exptime_token());
    let again: Vec<&[u8]> = rebuilt.keys().collect();
    assert_eq!(again, keys, "rebuilt line carries other keys");
}
