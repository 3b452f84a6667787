//! kvswitch's cache in front of a Redis pool: `GET` of a hot key answered from the cache, and
//! every command that may change a key dropping its value before it is forwarded, so that no
//! read answered after a write's reply returns what it replaced.
//!
//! A command is either a read that changes nothing (a list of them, below), `GET` (answered
//! or filled), or a write. A write opens writes to every key it names, with what it says of
//! their expiry (`SET ... EX`, `EXPIRE`, ...). A script or function is taken to write the keys
//! it declares (with an expiry the cache cannot place), as the proxy's routing and Redis
//! Cluster take it; one that declares none drops every value. Anything not known to be a read
//! is a write.

use std::rc::Rc;
use std::time::Duration;

use switch::cache::WriteExpiry;
use wire::resp::{self, Command};

use super::super::client::CacheHook;
use super::super::pool::PoolRt;
use wire::resp::commands::{is_read, key_positions, Class};

/// The reply to `GET key` from the cache, if it may answer it now; the read is shown to
/// hot-key detection either way. `server` is the key's.
pub(super) fn serve_get(pool: &PoolRt, server: usize, key: &[u8]) -> Option<Vec<u8>> {
    let cache = pool.cache.as_ref()?;
    let now = kvio::clock::now();
    cache.see_key(server, key, now);
    let data = cache.serve_key(key, now)?;
    Some(super::bulk(&data))
}

/// What the cache must hear of a command about to be forwarded (`lower`: its name in lower
/// case, `class` its class): a fill token for `GET`, the writes it opens, or nothing.
pub(super) fn hook(
    lower: &[u8],
    class: Class,
    args: &Command,
    pool: &Rc<PoolRt>,
) -> Option<CacheHook> {
    let cache = pool.cache.as_ref()?;
    if lower == b"get" {
        let fill = cache.before_read_key(args.word(1))?;
        return Some(CacheHook::RedisRead(pool.clone(), fill));
    }
    if is_read(lower) {
        return None;
    }
    let mut keys = key_positions(class, args).peekable();
    let writes = if keys.peek().is_none() {
        cache.before_flush()
    } else {
        let keys = keys.map(|i| args.word(i));
        cache.before_write_keys(keys, expiry(lower, args), kvio::clock::now())
    };
    Some(CacheHook::Write(pool.clone(), writes))
}

/// What a write says of its keys' expiry: set to a time from now, removed, left as it was,
/// or set to a time the cache cannot place (an absolute one, or one it cannot read), which
/// keeps the key out of the cache until a write gives it one it can.
fn expiry(lower: &[u8], args: &Command) -> WriteExpiry {
    let unknown = WriteExpiry::Sets {
        after: Some(kv::expiry::UNKNOWN_EXPIRY),
        definite: false,
    };
    let seconds = |i: usize, unit: u64| -> Option<Duration> {
        let n = resp::string2ll(args.word(i)).filter(|&n| n > 0)? as u64;
        Some(Duration::from_millis(n.checked_mul(unit)?))
    };
    let sets = |after: Option<Duration>, definite: bool| WriteExpiry::Sets { after, definite };
    match lower {
        b"set" => {
            let mut after = None;
            let mut definite = true;
            let mut i = 3;
            while i < args.len() {
                let word = args.word(i).to_ascii_lowercase();
                match &word[..] {
                    b"nx" | b"xx" => definite = false,
                    b"get" => {}
                    b"keepttl" => return WriteExpiry::Unchanged,
                    // A second expiry option is the server's syntax error: nothing changes,
                    // which the cache cannot tell from a change it cannot place.
                    b"ex" | b"px" if after.is_none() => {
                        let unit = if word == b"ex" { 1000 } else { 1 };
                        match seconds(i + 1, unit) {
                            Some(d) => after = Some(d),
                            None => return unknown,
                        }
                        i += 1;
                    }
                    _ => return unknown,
                }
                i += 1;
            }
            sets(after, definite)
        }
        b"setex" => seconds(2, 1000).map_or(unknown, |d| sets(Some(d), true)),
        b"psetex" => seconds(2, 1).map_or(unknown, |d| sets(Some(d), true)),
        b"expire" | b"pexpire" => {
            let unit = if lower == b"expire" { 1000 } else { 1 };
            // NX, XX, GT and LT may leave the expiry as it was.
            seconds(2, unit).map_or(unknown, |d| sets(Some(d), args.len() == 3))
        }
        b"persist" => sets(None, false),
        b"getex" => match args.len() {
            2 => WriteExpiry::Unchanged,
            3 if args.word(2).eq_ignore_ascii_case(b"persist") => sets(None, true),
            4 if args.word(2).eq_ignore_ascii_case(b"ex") => {
                seconds(3, 1000).map_or(unknown, |d| sets(Some(d), true))
            }
            4 if args.word(2).eq_ignore_ascii_case(b"px") => {
                seconds(3, 1).map_or(unknown, |d| sets(Some(d), true))
            }
            _ => unknown,
        },
        b"mset" | b"getset" => sets(None, true),
        b"msetnx" | b"setnx" => sets(None, false),
        // A value whose expiry comes from elsewhere (another key, a dump, a script) or is an
        // absolute time.
        b"expireat" | b"pexpireat" | b"rename" | b"renamenx" | b"copy" | b"restore"
        | b"restore-asking" | b"smove" | b"lmove" | b"rpoplpush" | b"eval" | b"evalsha"
        | b"fcall" => unknown,
        // The rest keep a key's expiry, or delete the key.
        _ => WriteExpiry::Unchanged,
    }
}

/// The value in a server's reply to `GET`: a bulk string, nothing else (not a null, not an
/// error such as `WRONGTYPE`).
pub(crate) fn get_value(reply: &[u8]) -> Option<&[u8]> {
    let rest = reply.strip_prefix(b"$")?;
    let line = rest.iter().position(|&b| b == b'\r')?;
    let len = usize::try_from(resp::string2ll(&rest[..line])?).ok()?;
    let data = rest.get(line + 2..line + 2 + len)?;
    (rest.get(line + 2 + len..)? == b"\r\n").then_some(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command(words: &[&str]) -> Command {
        let mut bytes = Vec::new();
        resp::encode_command(words, &mut bytes);
        let mut parser = resp::RequestParser::default();
        match parser.step(&bytes, false) {
            Ok((_, resp::Step::Command(c))) => c,
            other => panic!("{words:?}: {other:?}"),
        }
    }

    #[test]
    fn a_get_reply_fills_only_with_a_bulk_string() {
        assert_eq!(get_value(b"$3\r\nabc\r\n"), Some(&b"abc"[..]));
        assert_eq!(get_value(b"$0\r\n\r\n"), Some(&b""[..]));
        for reply in [
            &b"$-1\r\n"[..],
            b"_\r\n",
            b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n",
            b"$3\r\nab\r\n",
            b"$3\r\nabcd\r\n",
            b"+OK\r\n",
        ] {
            assert_eq!(get_value(reply), None, "{reply:?}");
        }
    }

    #[test]
    fn writes_say_what_they_do_to_expiry() {
        let unknown = WriteExpiry::Sets {
            after: Some(kv::expiry::UNKNOWN_EXPIRY),
            definite: false,
        };
        let secs = |s| Some(Duration::from_secs(s));
        for (words, want) in [
            (
                &["set", "k", "v"][..],
                WriteExpiry::Sets {
                    after: None,
                    definite: true,
                },
            ),
            (
                &["set", "k", "v", "EX", "10"],
                WriteExpiry::Sets {
                    after: secs(10),
                    definite: true,
                },
            ),
            (
                &["set", "k", "v", "px", "1500", "nx"],
                WriteExpiry::Sets {
                    after: Some(Duration::from_millis(1500)),
                    definite: false,
                },
            ),
            (&["set", "k", "v", "KEEPTTL"], WriteExpiry::Unchanged),
            (&["set", "k", "v", "exat", "1900000000"], unknown),
            (&["set", "k", "v", "ex", "-1"], unknown),
            (&["set", "k", "v", "ex", "100", "px", "5000"], unknown),
            (&["eval", "return 1", "1", "k"], unknown),
            (
                &["setex", "k", "5", "v"],
                WriteExpiry::Sets {
                    after: secs(5),
                    definite: true,
                },
            ),
            (
                &["expire", "k", "7"],
                WriteExpiry::Sets {
                    after: secs(7),
                    definite: true,
                },
            ),
            (
                &["expire", "k", "7", "gt"],
                WriteExpiry::Sets {
                    after: secs(7),
                    definite: false,
                },
            ),
            (
                &["persist", "k"],
                WriteExpiry::Sets {
                    after: None,
                    definite: false,
                },
            ),
            (&["getex", "k"], WriteExpiry::Unchanged),
            (&["rename", "a", "b"], unknown),
            (&["incr", "k"], WriteExpiry::Unchanged),
            (&["append", "k", "x"], WriteExpiry::Unchanged),
        ] {
            let c = command(words);
            let lower = words[0].to_ascii_lowercase();
            assert_eq!(expiry(lower.as_bytes(), &c), want, "{words:?}");
        }
    }
}
