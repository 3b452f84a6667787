//! A backend's text retrieval reply (`VALUE ...` items, then `END`), as the switch reads each
//! part of a split multi-key get.
//!
//! Contract checked: on success the consumed count is at most the buffer's length and ends
//! with `END\r\n`; the items are contiguous slices of the buffer, as many as `count_all()`, each
//! a whole `VALUE` line with its data block; parsing just the consumed bytes gives the same
//! reply. An error line lies inside the buffer. One-line replies end at a `\n`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wire::memcache::reply::{self, parse_retrieval_reply, ReplyError};

fuzz_target!(|data: &[u8]| {
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
