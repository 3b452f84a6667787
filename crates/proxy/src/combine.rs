//! Turning the replies of a request's parts into the one reply its client expects.

use wire::memcache::reply::{parse_retrieval_reply, replicas_reply, ReplyError};
use wire::memcache::stats;

use super::backend::ServerError;
use super::plan::{error_reply, Combine, MergeKeys, OnError, RedisMerge, CACHE_PART};
use wire::resp;

/// One part's outcome: the server's reply, or why there is none.
pub type Outcome = Result<Vec<u8>, ServerError>;

/// Builds the client's reply from the outcomes, in part order, appending it to `out`.
pub fn combine(how: &Combine, on_error: &OnError, outcomes: &mut [Outcome], out: &mut Vec<u8>) {
    if let Combine::Fixed(bytes) = how {
        out.extend_from_slice(bytes);
        return;
    }
    if let Combine::Redis(merge) = how {
        redis(merge, outcomes, out);
        return;
    }
    let outcomes = match how {
        // The deletes where a warming server's keys were are not part of the reply.
        Combine::Replicated { extra } => {
            let n = outcomes.len().saturating_sub(*extra);
            &mut outcomes[..n]
        }
        // The server that held the key before speaks only when the owner misses.
        Combine::WarmUp { key } => {
            warm_up(key, on_error, outcomes, out);
            return;
        }
        _ => outcomes,
    };
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
        Combine::Replicated { .. } => out.extend_from_slice(replicas_reply(&replies)),
        Combine::Merge(keys) => merge(keys, &replies, None, on_error, out),
        Combine::MergeCached { keys, cached } => merge(keys, &replies, Some(cached), on_error, out),
        Combine::StatsText => stats::merge_text(&replies, out),
        Combine::StatsBinary { opaque } => stats::merge_binary(&replies, *opaque, out),
        Combine::Fixed(_) | Combine::WarmUp { .. } | Combine::Redis(_) => {}
    }
}

/// A Redis command's reply from its parts' (see [`RedisMerge`]).
fn redis(merge: &RedisMerge, outcomes: &[Outcome], out: &mut Vec<u8>) {
    let mut replies = Vec::with_capacity(outcomes.len());
    for outcome in outcomes {
        match outcome {
            Ok(reply) => replies.push(reply.as_slice()),
            Err(why) => return out.extend_from_slice(&redis_error(why)),
        }
    }
    match merge {
        RedisMerge::Single => out.extend_from_slice(replies[0]),
        RedisMerge::Sum => {
            let mut total: i64 = 0;
            for reply in &replies {
                match resp::integer(reply) {
                    Some(n) => total = total.saturating_add(n),
                    None => return out.extend_from_slice(reply),
                }
            }
            out.extend_from_slice(format!(":{total}\r\n").as_bytes());
        }
        RedisMerge::AllOk => {
            let other = replies.iter().find(|r| **r != b"+OK\r\n");
            out.extend_from_slice(other.copied().unwrap_or(b"+OK\r\n"));
        }
        RedisMerge::Array(order) => {
            let mut asked = vec![0usize; replies.len()];
            for &p in order {
                if let Some(n) = asked.get_mut(p as usize) {
                    *n += 1;
                }
            }
            let mut parts = Vec::with_capacity(replies.len());
            for (i, reply) in replies.iter().enumerate() {
                match resp::array_elements(reply) {
                    Some(values) if values.len() == asked[i] => parts.push(values.into_iter()),
                    Some(_) => return out.extend_from_slice(&redis_error(&ServerError::OutOfStep)),
                    // An error, say: the client's reply.
                    None => return out.extend_from_slice(reply),
                }
            }
            out.extend_from_slice(format!("*{}\r\n", order.len()).as_bytes());
            for &part in order {
                if let Some(value) = parts.get_mut(part as usize).and_then(Iterator::next) {
                    out.extend_from_slice(value);
                }
            }
        }
    }
}

/// A Redis client's error for a part with no reply.
fn redis_error(why: &ServerError) -> Vec<u8> {
    resp::error(format!("ERR {why}").as_bytes())
}

/// The reply to a `get` whose owner warms up (see [`Combine::WarmUp`]).
fn warm_up(key: &[u8], on_error: &OnError, outcomes: &[Outcome], out: &mut Vec<u8>) {
    let owner = match &outcomes[0] {
        Ok(reply) => reply,
        Err(why) => return error_reply(on_error, why, out),
    };
    if owner.as_slice() != b"END\r\n" {
        out.extend_from_slice(owner);
        return;
    }
    match outcomes
        .get(1)
        .and_then(|o| o.as_ref().ok())
        .and_then(|r| meta_item(r))
    {
        Some(item) => {
            out.extend_from_slice(b"VALUE ");
            out.extend_from_slice(key);
            out.extend_from_slice(format!(" {} {}\r\n", item.flags, item.data.len()).as_bytes());
            out.extend_from_slice(item.data);
            out.extend_from_slice(b"\r\nEND\r\n");
        }
        None => out.extend_from_slice(b"END\r\n"),
    }
}

/// The item in the reply to `mg <key> v f t`: its data, flags and seconds left to live (-1:
/// none).
pub struct MetaItem<'a> {
    pub data: &'a [u8],
    pub flags: u32,
    pub ttl: i64,
}

/// Reads the reply to `mg <key> v f t`; `None` for a miss or anything else.
pub fn meta_item(reply: &[u8]) -> Option<MetaItem<'_>> {
    let line_end = reply.windows(2).position(|w| w == b"\r\n")?;
    let mut tokens = reply[..line_end].split(|&b| b == b' ');
    if tokens.next()? != b"VA" {
        return None;
    }
    let len: usize = std::str::from_utf8(tokens.next()?).ok()?.parse().ok()?;
    let (mut flags, mut ttl) = (0u32, -1i64);
    for t in tokens {
        let text = std::str::from_utf8(t.get(1..)?).ok()?;
        match t.first() {
            Some(b'f') => flags = text.parse().ok()?,
            Some(b't') => ttl = text.parse().ok()?,
            _ => {}
        }
    }
    let end = (line_end + 2).checked_add(len)?;
    let data = reply.get(line_end + 2..end)?;
    (reply.get(end..)? == b"\r\n").then_some(MetaItem { data, flags, ttl })
}

/// The `add` that stores on a warming owner the item its `get` found on the server that held
/// the key before; `None` when the owner answered or nothing was found.
pub fn warm_fill(how: &Combine, outcomes: &[Outcome]) -> Option<Vec<u8>> {
    let Combine::WarmUp { key } = how else {
        return None;
    };
    if outcomes.first()?.as_deref().ok()? != b"END\r\n" {
        return None;
    }
    let item = meta_item(outcomes.get(1)?.as_deref().ok()?)?;
    // memcached reads an exptime over 30 days as a Unix time; a longer life left is rounded
    // down to 30 days.
    let exptime = match item.ttl {
        ttl if ttl < 0 => 0,
        ttl => ttl.clamp(1, 30 * 24 * 3600),
    };
    let mut add = Vec::with_capacity(key.len() + item.data.len() + 48);
    add.extend_from_slice(b"add ");
    add.extend_from_slice(key);
    add.extend_from_slice(
        format!(" {} {exptime} {} noreply\r\n", item.flags, item.data.len()).as_bytes(),
    );
    add.extend_from_slice(item.data);
    add.extend_from_slice(b"\r\n");
    Some(add)
}

/// Whether a reply to a broadcast command is the plain success reply.
fn is_success(reply: &[u8]) -> bool {
    reply == b"OK\r\n"
        || reply.is_empty()
        || (reply.len() >= 8 && reply[0] == 0x81 && reply[6..8] == [0, 0])
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
