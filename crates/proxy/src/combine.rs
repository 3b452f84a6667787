//! Turning the replies of a request's parts into the one reply its client expects.

use wire::memcache::reply::{parse_retrieval_reply, ReplyError};
use wire::memcache::stats;

use super::backend::ServerError;
use super::plan::{error_reply, Combine, MergeKeys, OnError, CACHE_PART};

/// One part's outcome: the server's reply, or why there is none.
pub type Outcome = Result<Vec<u8>, ServerError>;

/// Builds the client's reply from the outcomes, in part order, appending it to `out`.
pub fn combine(how: &Combine, on_error: &OnError, outcomes: &mut [Outcome], out: &mut Vec<u8>) {
    if let Combine::Fixed(bytes) = how {
        out.extend_from_slice(bytes);
        return;
    }
    if let Some(Err(why)) = outcomes.iter().find(|o| o.is_err()) {
        error_reply(on_error, why, out);
        return;
    }
    let replies: Vec<&[u8]> = outcomes
        .iter()
        .map(|o| o.as_deref().unwrap_or_default())
        .collect();
    match how {
        Combine::Single => out.extend_from_slice(replies[0]),
        Combine::Same => {
            let differing = replies.iter().find(|r| **r != replies[0]);
            match differing {
                None => out.extend_from_slice(replies[0]),
                Some(_) => {
                    let error = replies
                        .iter()
                        .find(|r| !is_success(r))
                        .unwrap_or(&replies[0]);
                    out.extend_from_slice(error);
                }
            }
        }
        Combine::Replicated => {
            let differing = replies.iter().any(|r| *r != replies[0]);
            let reply = match differing {
                false => replies[0],
                true => replies.iter().find(|r| is_error(r)).unwrap_or(&replies[0]),
            };
            out.extend_from_slice(reply);
        }
        Combine::Merge(keys) => merge(keys, &replies, None, on_error, out),
        Combine::MergeCached { keys, cached } => merge(keys, &replies, Some(cached), on_error, out),
        Combine::StatsText => stats::merge_text(&replies, out),
        Combine::StatsBinary { opaque } => stats::merge_binary(&replies, *opaque, out),
        Combine::Fixed(_) => {}
    }
}

/// Whether a reply to a broadcast command is the plain success reply.
fn is_success(reply: &[u8]) -> bool {
    reply == b"OK\r\n"
        || reply.is_empty()
        || (reply.len() >= 8 && reply[0] == 0x81 && reply[6..8] == [0, 0])
}

/// Whether a reply says the request failed, rather than how it went (`NOT_STORED` and
/// `NOT_FOUND` are answers, not failures).
fn is_error(reply: &[u8]) -> bool {
    match reply.first() {
        Some(0x81) => reply.len() >= 8 && u16::from_be_bytes([reply[6], reply[7]]) >= 0x80,
        _ => {
            reply.starts_with(b"ERROR")
                || reply.starts_with(b"CLIENT_ERROR")
                || reply.starts_with(b"SERVER_ERROR")
        }
    }
}

/// Puts the items of a split multi-get back in the client's key order.
///
/// Each server answered its share of the keys in the order asked, skipping misses, and keys
/// were given to parts in the client's order. Walking the client's keys and taking the next
/// item of the key's part when that item is for this key rebuilds memcached's own reply,
/// repeated keys included.
fn merge(
    keys: &MergeKeys,
    replies: &[&[u8]],
    cached: Option<&[u8]>,
    on_error: &OnError,
    out: &mut Vec<u8>,
) {
    let mut items = Vec::with_capacity(replies.len());
    let mut from_cache = cached
        .and_then(|c| parse_retrieval_reply(c).ok().flatten())
        .map(|(items, _)| items.peekable());
    for reply in replies {
        match parse_retrieval_reply(reply) {
            Ok(Some((parsed, _))) => items.push(parsed.peekable()),
            Err(ReplyError::ErrorLine { start, end }) => {
                out.extend_from_slice(&reply[start..end]);
                return;
            }
            _ => {
                error_reply(on_error, "malformed reply from server", out);
                return;
            }
        }
    }
    for (part, key) in keys.iter() {
        let source = match part {
            CACHE_PART => from_cache.as_mut(),
            part => items.get_mut(part),
        };
        if let Some(item) = source.and_then(|s| s.next_if(|item| item.key == key)) {
            out.extend_from_slice(item.raw);
        }
    }
    out.extend_from_slice(b"END\r\n");
}
