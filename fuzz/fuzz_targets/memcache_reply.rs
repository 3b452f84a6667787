//! A backend's replies: a text retrieval reply (`VALUE ...` items, then `END`) as the switch
//! reads each part of a split multi-key get, every kind of reply as the proxy frames it, and the
//! stats merges.
//!
//! Contract checked: on success the consumed count is at most the buffer's length and ends
//! with `END\r\n`; the items are contiguous slices of the buffer, as many as `count_all()`, each
//! a whole `VALUE` line with its data block; parsing just the consumed bytes gives the same
//! reply. An error line lies inside the buffer. One-line replies end at a `\n`. A framed reply
//! of any kind is within the buffer, framed alike on its own, every strict prefix of it is
//! incomplete, and a `Framer` fed it in pieces agrees. Merging any bytes as stats never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wire::memcache::reply::{
    self, parse_retrieval_reply, reply_len, Framer, ReplyError, ReplyKind,
};
use wire::memcache::stats;

const KINDS: [ReplyKind; 6] = [
    ReplyKind::Retrieval,
    ReplyKind::Line,
    ReplyKind::Meta,
    ReplyKind::Stats,
    ReplyKind::Binary,
    ReplyKind::BinaryStats,
];

/// Replies longer than this have a sample of their prefixes checked, not all of them.
const ALL_PREFIXES_UP_TO: usize = 512;

fuzz_target!(|data: &[u8]| {
    for kind in KINDS {
        check_framing(kind, data);
    }
    check_merges(data);
    if let Some(n) = reply::line_reply_len(data) {
        assert!(n >= 1 && n <= data.len() && data[n - 1] == b'\n');
    }

    match parse_retrieval_reply(data) {
        Ok(Some((items, consumed))) => {
            assert!(
                consumed <= data.len(),
                "consumed {consumed} of {} bytes",
                data.len()
            );
            assert!(data[..consumed].ends_with(b"END\r\n"));
            let raw = items.raw();
            assert_eq!(raw.as_ptr(), data.as_ptr(), "items do not start the reply");
            assert_eq!(raw.len() + b"END\r\n".len(), consumed);

            let mut at = 0;
            let mut count = 0;
            for item in items.clone() {
                assert!(within(data, item.raw), "item raw is not inside the buffer");
                assert_eq!(
                    item.raw.as_ptr() as usize,
                    data.as_ptr() as usize + at,
                    "items are not contiguous"
                );
                assert!(within(item.raw, item.key) && within(item.raw, item.flags));
                if let Some(cas) = item.cas {
                    assert!(within(item.raw, cas));
                }
                assert!(item.raw.starts_with(b"VALUE ") && item.raw.ends_with(b"\r\n"));
                assert_eq!(
                    item.data().len(),
                    item.bytes,
                    "data block of the wrong size"
                );
                assert!(within(item.raw, item.data()));
                at += item.raw.len();
                count += 1;
            }
            assert_eq!(at, raw.len(), "the items do not cover raw()");
            assert_eq!(count, items.count_all());

            match parse_retrieval_reply(&data[..consumed]) {
                Ok(Some((again, n))) => {
                    assert_eq!(n, consumed);
                    assert_eq!(again, items);
                }
                other => panic!("the consumed bytes alone parse as {other:?}"),
            }
        }
        Ok(None) => {}
        Err(ReplyError::ErrorLine { start, end }) => {
            assert!(
                start < end && end <= data.len(),
                "error line {start}..{end}"
            );
            let line = &data[start..end];
            assert!(line.ends_with(b"\r\n"));
            assert!(
                line == b"ERROR\r\n"
                    || line.starts_with(b"CLIENT_ERROR ")
                    || line.starts_with(b"SERVER_ERROR "),
                "not an error line: {line:?}"
            );
        }
        Err(ReplyError::Malformed) => {}
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

fn check_framing(kind: ReplyKind, data: &[u8]) {
    let Ok(Some(len)) = reply_len(kind, data) else {
        return;
    };
    assert!(
        len > 0 && len <= data.len(),
        "{kind:?}: {len} of {} bytes",
        data.len()
    );
    let reply = &data[..len];
    assert_eq!(reply_len(kind, reply), Ok(Some(len)), "{kind:?} alone");
    let step = (len / ALL_PREFIXES_UP_TO).max(1);
    for n in (0..len).step_by(step).chain([len - 1]) {
        assert_eq!(
            reply_len(kind, &reply[..n]),
            Ok(None),
            "{kind:?}: prefix {n} of {len}"
        );
    }
    // Pieces of a size taken from the reply itself.
    let piece = usize::from(reply[0] % 16) + 1;
    let mut framer = Framer::new(kind);
    let mut found = None;
    let mut end = 0;
    while end < len {
        end = (end + piece).min(len);
        found = framer
            .reply_len(&data[..end])
            .unwrap_or_else(|e| panic!("{kind:?}: {e:?}"));
        if end < len {
            assert_eq!(found, None, "{kind:?} at {end} of {len}");
        }
    }
    assert_eq!(found, Some(len), "{kind:?} in pieces of {piece}");
}

/// Splits the input in up to three replies at offsets taken from its first bytes.
fn check_merges(data: &[u8]) {
    let (cuts, rest) = data.split_at(data.len().min(2));
    let at = |i: usize| cuts.get(i).map_or(0, |&b| usize::from(b)).min(rest.len());
    let (a, b) = (at(0).min(at(1)), at(0).max(at(1)));
    let replies = [&rest[..a], &rest[a..b], &rest[b..]];
    let mut out = Vec::new();
    stats::merge_text(&replies, &mut out);
    stats::merge_binary(&replies, 0xfeed_face, &mut out);
}
