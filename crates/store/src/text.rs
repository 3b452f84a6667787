//! The classic text and meta protocols: executes one request the `wire` parser has read and
//! writes memcached 1.6's reply.
//!
//! The parser has already checked argument counts, numbers and keys; this module only reads the
//! values back out of the command line and never sees a malformed line.

use wire::memcache::meta::decode_base64_key;
use wire::memcache::{Command, Request, MAX_KEY_LEN};

use crate::items::{bump, read, DeleteOutcome, Delta, Item, Mode, Store, StoreOutcome};
use crate::VERSION;

/// Size past which a reply in the making is handed to the `spill` callback of
/// [`crate::session::step`].
pub const SPILL_AT: usize = 1024 * 1024;

/// What the connection does after a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    Continue,
    Close,
}

const NON_NUMERIC: &[u8] = b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n";
const TOO_LARGE: &[u8] = b"SERVER_ERROR object too large for cache\r\n";
const NO_MEMORY: &[u8] = b"SERVER_ERROR out of memory storing object\r\n";
/// memcached's answer to a retrieval whose reply it cannot hold.
pub const NO_MEMORY_GET: &[u8] = b"SERVER_ERROR out of memory writing get response\r\n";

/// The space-separated tokens of the request's command line.
fn tokens<'a>(request: &Request<'a>) -> Vec<&'a [u8]> {
    let bytes = request.bytes();
    let end = bytes
        .iter()
        .position(|&b| b == b'\n')
        .unwrap_or(bytes.len());
    let line = &bytes[..end];
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    line.split(|&b| b == b' ')
        .filter(|t| !t.is_empty())
        .collect()
}

fn num<T: std::str::FromStr>(token: Option<&&[u8]>) -> Option<T> {
    std::str::from_utf8(token?).ok()?.parse().ok()
}

/// Executes a text or meta request, appending its reply to `out`; `spill` is offered the
/// replies whenever a multi-key retrieval grows them past [`SPILL_AT`] (see
/// [`crate::session::step`]).
pub fn execute(
    store: &Store,
    request: &Request<'_>,
    out: &mut Vec<u8>,
    spill: &mut dyn FnMut(&mut Vec<u8>) -> bool,
) -> After {
    let tokens = tokens(request);
    match request.command {
        Command::Get | Command::Gets | Command::Gat | Command::Gats => {
            return retrieve(store, request, &tokens, out, spill)
        }
        Command::Set
        | Command::Add
        | Command::Replace
        | Command::Append
        | Command::Prepend
        | Command::Cas => storage(store, request, &tokens, out),
        Command::Delete => {
            let key = request.key().unwrap_or_default();
            let reply: &[u8] = match store.delete(key, 0) {
                DeleteOutcome::Deleted => {
                    bump(&store.counters.delete_hits);
                    b"DELETED\r\n"
                }
                _ => {
                    bump(&store.counters.delete_misses);
                    b"NOT_FOUND\r\n"
                }
            };
            reply_unless(request.noreply(), reply, out);
        }
        Command::Incr | Command::Decr => {
            let key = request.key().unwrap_or_default();
            let incr = request.command == Command::Incr;
            let delta = num(tokens.get(2)).unwrap_or(0);
            let (hits, misses) = if incr {
                (&store.counters.incr_hits, &store.counters.incr_misses)
            } else {
                (&store.counters.decr_hits, &store.counters.decr_misses)
            };
            let reply = match store.delta(key, incr, delta, 0) {
                Delta::Value(value, _) => {
                    bump(hits);
                    format!("{value}\r\n").into_bytes()
                }
                Delta::NotFound | Delta::Exists => {
                    bump(misses);
                    b"NOT_FOUND\r\n".to_vec()
                }
                Delta::NonNumeric => NON_NUMERIC.to_vec(),
            };
            reply_unless(request.noreply(), &reply, out);
        }
        Command::Touch => {
            let key = request.key().unwrap_or_default();
            bump(&store.counters.cmd_touch);
            let reply: &[u8] = if store.touch(key, num(tokens.get(2)).unwrap_or(0)) {
                bump(&store.counters.touch_hits);
                b"TOUCHED\r\n"
            } else {
                bump(&store.counters.touch_misses);
                b"NOT_FOUND\r\n"
            };
            reply_unless(request.noreply(), reply, out);
        }
        Command::Version => out.extend_from_slice(format!("VERSION {VERSION}\r\n").as_bytes()),
        Command::FlushAll => {
            bump(&store.counters.cmd_flush);
            // memcached keeps the delay in 32 bits, dropping the higher ones.
            let delay = num::<i64>(tokens.get(1)).map_or(0, |d| i64::from(d as i32));
            store.flush(delay);
            reply_unless(request.noreply(), b"OK\r\n", out);
        }
        Command::Verbosity => reply_unless(request.noreply(), b"OK\r\n", out),
        Command::Stats => stats(store, out),
        Command::Quit => return After::Close,
        Command::Shutdown => out.extend_from_slice(b"ERROR: shutdown not enabled\r\n"),
        Command::MetaGet => meta_get(store, request, &tokens, out),
        Command::MetaSet => meta_set(store, request, &tokens, out),
        Command::MetaDelete => meta_delete(store, request, &tokens, out),
        Command::MetaArithmetic => meta_arithmetic(store, request, &tokens, out),
        Command::MetaNoop => out.extend_from_slice(b"MN\r\n"),
        Command::MetaDebug => meta_debug(store, request, &tokens, out),
        Command::Misc | Command::Binary(_) => out.extend_from_slice(b"ERROR\r\n"),
    }
    After::Continue
}

fn reply_unless(noreply: bool, reply: &[u8], out: &mut Vec<u8>) {
    if !noreply {
        out.extend_from_slice(reply);
    }
}

fn value_line(key: &[u8], item: &Item, with_cas: bool, out: &mut Vec<u8>) {
    out.extend_from_slice(b"VALUE ");
    out.extend_from_slice(key);
    let header = if with_cas {
        format!(" {} {} {}\r\n", item.flags, item.value.len(), item.cas)
    } else {
        format!(" {} {}\r\n", item.flags, item.value.len())
    };
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&item.value);
    out.extend_from_slice(b"\r\n");
}

/// `get`, `gets`, `gat`, `gats`: one `VALUE` block per hit, then `END`.
fn retrieve(
    store: &Store,
    request: &Request<'_>,
    tokens: &[&[u8]],
    out: &mut Vec<u8>,
    spill: &mut dyn FnMut(&mut Vec<u8>) -> bool,
) -> After {
    let start = out.len();
    let touch = matches!(request.command, Command::Gat | Command::Gats)
        .then(|| num(tokens.get(1)).unwrap_or(0));
    let with_cas = matches!(request.command, Command::Gets | Command::Gats);
    let counters = &store.counters;
    for key in request.keys() {
        bump(&counters.cmd_get);
        if touch.is_some() {
            bump(&counters.cmd_touch);
        }
        match store.get(key, touch) {
            Some(item) => {
                bump(&counters.get_hits);
                if touch.is_some() {
                    bump(&counters.touch_hits);
                }
                value_line(key, &item, with_cas, out);
                if out.len() > SPILL_AT && !spill(out) {
                    out.truncate(start.min(out.len()));
                    out.extend_from_slice(NO_MEMORY_GET);
                    return After::Close;
                }
            }
            None => {
                bump(&counters.get_misses);
                if touch.is_some() {
                    bump(&counters.touch_misses);
                }
            }
        }
    }
    out.extend_from_slice(b"END\r\n");
    After::Continue
}

/// `set`, `add`, `replace`, `append`, `prepend`, `cas`.
fn storage(store: &Store, request: &Request<'_>, tokens: &[&[u8]], out: &mut Vec<u8>) {
    let key = request.key().unwrap_or_default();
    let data = request.data().unwrap_or_default();
    let (Some(flags), Some(exptime)) = (num::<u32>(tokens.get(2)), num(tokens.get(3))) else {
        out.extend_from_slice(b"CLIENT_ERROR bad command line format\r\n");
        return;
    };
    let mode = match request.command {
        Command::Add => Mode::Add,
        Command::Replace => Mode::Replace,
        Command::Append => Mode::Append,
        Command::Prepend => Mode::Prepend,
        _ => Mode::Set,
    };
    // No item ever has CAS 0, so `cas <key> ... 0` can only fail, as in memcached.
    let cas = match request.command {
        Command::Cas => match num::<u64>(tokens.get(5)).unwrap_or(0) {
            0 => u64::MAX,
            cas => cas,
        },
        _ => 0,
    };
    bump(&store.counters.cmd_set);
    let reply: &[u8] = match store.store(mode, key, data, flags, exptime, cas) {
        StoreOutcome::Stored(_) => {
            if cas != 0 {
                bump(&store.counters.cas_hits);
            }
            b"STORED\r\n"
        }
        StoreOutcome::NotStored => b"NOT_STORED\r\n",
        StoreOutcome::Exists => {
            bump(&store.counters.cas_badval);
            b"EXISTS\r\n"
        }
        StoreOutcome::NotFound => {
            bump(&store.counters.cas_misses);
            b"NOT_FOUND\r\n"
        }
        StoreOutcome::TooLarge => return out.extend_from_slice(TOO_LARGE),
        StoreOutcome::NoMemory => return out.extend_from_slice(NO_MEMORY),
    };
    reply_unless(request.noreply(), reply, out);
}

/// Appends `stats`' rows (without the closing `END`), the process and the time as the
/// store's host gives them.
pub fn stats(store: &Store, out: &mut Vec<u8>) {
    let c = &store.counters;
    let now = store.host().unix_now();
    let rows: [(&str, String); 43] = [
        ("pid", store.host().pid().to_string()),
        ("uptime", store.uptime().to_string()),
        ("time", now.to_string()),
        ("version", VERSION.to_string()),
        ("curr_connections", read(&c.curr_connections).to_string()),
        ("total_connections", read(&c.total_connections).to_string()),
        ("cmd_get", read(&c.cmd_get).to_string()),
        ("cmd_set", read(&c.cmd_set).to_string()),
        ("cmd_flush", read(&c.cmd_flush).to_string()),
        ("cmd_touch", read(&c.cmd_touch).to_string()),
        ("get_hits", read(&c.get_hits).to_string()),
        ("get_misses", read(&c.get_misses).to_string()),
        ("delete_misses", read(&c.delete_misses).to_string()),
        ("delete_hits", read(&c.delete_hits).to_string()),
        ("incr_misses", read(&c.incr_misses).to_string()),
        ("incr_hits", read(&c.incr_hits).to_string()),
        ("decr_misses", read(&c.decr_misses).to_string()),
        ("decr_hits", read(&c.decr_hits).to_string()),
        ("cas_misses", read(&c.cas_misses).to_string()),
        ("cas_hits", read(&c.cas_hits).to_string()),
        ("cas_badval", read(&c.cas_badval).to_string()),
        ("touch_hits", read(&c.touch_hits).to_string()),
        ("touch_misses", read(&c.touch_misses).to_string()),
        ("limit_maxbytes", store.limit().unwrap_or(0).to_string()),
        ("bytes", store.bytes().to_string()),
        ("curr_items", store.len().to_string()),
        ("total_items", read(&c.total_items).to_string()),
        ("requests", read(&c.requests).to_string()),
        ("capacity_drops", read(&c.capacity_drops).to_string()),
        ("capacity_delays", read(&c.capacity_delays).to_string()),
        ("relayed", read(&c.relayed).to_string()),
        ("relay_lost", read(&c.relay_lost).to_string()),
        ("relay_stray", read(&c.relay_stray).to_string()),
        ("bounced", read(&c.bounced).to_string()),
        ("bounce_failed", read(&c.bounce_failed).to_string()),
        ("home_requests", read(&c.home_requests).to_string()),
        ("home_fills", read(&c.home_fills).to_string()),
        (
            "home_invalidations",
            read(&c.home_invalidations).to_string(),
        ),
        ("home_acks", read(&c.home_acks).to_string()),
        (
            "home_writes_failed",
            read(&c.home_writes_failed).to_string(),
        ),
        ("home_malformed", read(&c.home_malformed).to_string()),
        ("home_refused", read(&c.home_refused).to_string()),
        ("home_updates", read(&c.home_updates).to_string()),
    ];
    for (name, value) in rows {
        out.extend_from_slice(format!("STAT {name} {value}\r\n").as_bytes());
    }
    out.extend_from_slice(b"END\r\n");
}

/// The flags of a meta request: each token after the key (and, for `ms`, the length).
struct MetaFlags<'a> {
    flags: &'a [&'a [u8]],
}

impl<'a> MetaFlags<'a> {
    fn has(&self, flag: u8) -> bool {
        self.flags.iter().any(|t| t.first() == Some(&flag))
    }

    fn value(&self, flag: u8) -> Option<&'a [u8]> {
        self.flags
            .iter()
            .find(|t| t.first() == Some(&flag))
            .map(|t| &t[1..])
    }

    fn number<T: std::str::FromStr>(&self, flag: u8) -> Option<T> {
        std::str::from_utf8(self.value(flag)?).ok()?.parse().ok()
    }
}

/// The key an item is stored under: the token itself, or its decoding for the `b` flag.
fn meta_key<'k>(request: &Request<'k>, buf: &'k mut [u8; MAX_KEY_LEN]) -> &'k [u8] {
    let token = request.key().unwrap_or_default();
    if request.base64_key() {
        decode_base64_key(token, buf).unwrap_or_default()
    } else {
        token
    }
}

/// Appends the return flags that echo the request (`O`, `k`).
fn echo(flag: &[u8], request: &Request<'_>, out: &mut Vec<u8>) {
    match flag.first() {
        Some(b'O') => {
            out.push(b' ');
            out.extend_from_slice(flag);
        }
        Some(b'k') => {
            out.extend_from_slice(b" k");
            out.extend_from_slice(request.key().unwrap_or_default());
            // memcached marks a key it returns in base64 (its `META_KEY`).
            if request.base64_key() {
                out.extend_from_slice(b" b");
            }
        }
        _ => {}
    }
}

/// `mg <key> <flag>*`.
fn meta_get(store: &Store, request: &Request<'_>, tokens: &[&[u8]], out: &mut Vec<u8>) {
    let flags = MetaFlags {
        flags: &tokens[2..],
    };
    let mut buf = [0u8; MAX_KEY_LEN];
    let key = meta_key(request, &mut buf);
    let touch = flags.number::<i64>(b'T');
    bump(&store.counters.cmd_get);
    let Some(item) = store.get(key, touch) else {
        bump(&store.counters.get_misses);
        if !request.noreply() {
            out.extend_from_slice(b"EN");
            for flag in flags.flags {
                echo(flag, request, out);
            }
            out.extend_from_slice(b"\r\n");
        }
        return;
    };
    bump(&store.counters.get_hits);
    let with_value = flags.has(b'v');
    if with_value {
        out.extend_from_slice(format!("VA {}", item.value.len()).as_bytes());
    } else {
        out.extend_from_slice(b"HD");
    }
    for flag in flags.flags {
        let field = match flag.first() {
            Some(b'f') => format!(" f{}", item.flags),
            Some(b't') => format!(" t{}", store.ttl(&item)),
            Some(b'c') => format!(" c{}", item.cas),
            Some(b's') => format!(" s{}", item.value.len()),
            _ => {
                echo(flag, request, out);
                continue;
            }
        };
        out.extend_from_slice(field.as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    if with_value {
        out.extend_from_slice(&item.value);
        out.extend_from_slice(b"\r\n");
    }
}

/// `ms <key> <datalen> <flag>*` and its data block.
fn meta_set(store: &Store, request: &Request<'_>, tokens: &[&[u8]], out: &mut Vec<u8>) {
    let flags = MetaFlags {
        flags: &tokens[3..],
    };
    let mut buf = [0u8; MAX_KEY_LEN];
    let key = meta_key(request, &mut buf);
    let mode = match flags.value(b'M').and_then(|m| m.first()) {
        None | Some(b'S' | b's') => Mode::Set,
        Some(b'E' | b'e') => Mode::Add,
        Some(b'A' | b'a') => Mode::Append,
        Some(b'P' | b'p') => Mode::Prepend,
        Some(b'R' | b'r') => Mode::Replace,
        Some(_) => {
            out.extend_from_slice(b"CLIENT_ERROR invalid mode for ms STORE\r\n");
            return;
        }
    };
    let item_flags = flags.number(b'F').unwrap_or(0);
    let ttl = flags.number(b'T').unwrap_or(0);
    let compare = flags.number(b'C').unwrap_or(0);
    let data = request.data().unwrap_or_default();
    bump(&store.counters.cmd_set);
    let stored = store.store(mode, key, data, item_flags, ttl, compare);
    let (code, cas): (&[u8], u64) = match stored {
        StoreOutcome::Stored(cas) => (b"HD", cas),
        StoreOutcome::NotStored => (b"NS", 0),
        StoreOutcome::Exists => (b"EX", 0),
        StoreOutcome::NotFound => (b"NF", 0),
        StoreOutcome::TooLarge => return out.extend_from_slice(TOO_LARGE),
        StoreOutcome::NoMemory => return out.extend_from_slice(NO_MEMORY),
    };
    if request.noreply() && code == b"HD" {
        return;
    }
    out.extend_from_slice(code);
    for flag in flags.flags {
        match flag.first() {
            Some(b'c') => out.extend_from_slice(format!(" c{cas}").as_bytes()),
            _ => echo(flag, request, out),
        }
    }
    out.extend_from_slice(b"\r\n");
}

/// `md <key> <flag>*`.
fn meta_delete(store: &Store, request: &Request<'_>, tokens: &[&[u8]], out: &mut Vec<u8>) {
    let flags = MetaFlags {
        flags: &tokens[2..],
    };
    let mut buf = [0u8; MAX_KEY_LEN];
    let key = meta_key(request, &mut buf);
    let code: &[u8] = match store.delete(key, flags.number(b'C').unwrap_or(0)) {
        DeleteOutcome::Deleted => {
            bump(&store.counters.delete_hits);
            b"HD"
        }
        DeleteOutcome::NotFound => {
            bump(&store.counters.delete_misses);
            b"NF"
        }
        DeleteOutcome::Exists => b"EX",
    };
    if request.noreply() && code == b"HD" {
        return;
    }
    out.extend_from_slice(code);
    for flag in flags.flags {
        echo(flag, request, out);
    }
    out.extend_from_slice(b"\r\n");
}

/// `ma <key> <flag>*`: `D` delta (default 1), `MI`/`M+` or `MD`/`M-` mode, `N` to create a
/// missing item with `J` (default 0), `C` compare CAS; returns `v`, `c`, `t`, `O`, `k`.
fn meta_arithmetic(store: &Store, request: &Request<'_>, tokens: &[&[u8]], out: &mut Vec<u8>) {
    let flags = MetaFlags {
        flags: &tokens[2..],
    };
    let mut buf = [0u8; MAX_KEY_LEN];
    let key = meta_key(request, &mut buf);
    let incr = match flags.value(b'M').and_then(|m| m.first()) {
        None | Some(b'I' | b'i' | b'+') => true,
        Some(b'D' | b'd' | b'-') => false,
        Some(_) => {
            out.extend_from_slice(b"CLIENT_ERROR invalid mode for ma\r\n");
            return;
        }
    };
    let delta = flags.number(b'D').unwrap_or(1);
    let compare = flags.number(b'C').unwrap_or(0);
    let mut result = store.delta(key, incr, delta, compare);
    if result == Delta::NotFound {
        if let Some(ttl) = flags.number::<i64>(b'N') {
            let initial: u64 = flags.number(b'J').unwrap_or(0);
            let value = initial.to_string();
            if let StoreOutcome::Stored(cas) =
                store.store(Mode::Add, key, value.as_bytes(), 0, ttl, 0)
            {
                result = Delta::Value(initial, cas);
            }
        }
    }
    let (code, value, cas): (&[u8], Option<u64>, u64) = match result {
        Delta::Value(value, cas) => (b"HD", Some(value), cas),
        Delta::NotFound => (b"NF", None, 0),
        Delta::Exists => (b"EX", None, 0),
        Delta::NonNumeric => return out.extend_from_slice(NON_NUMERIC),
    };
    let show_value = flags.has(b'v') && value.is_some();
    if request.noreply() && code == b"HD" && !show_value {
        return;
    }
    let value = value.map(|v| v.to_string()).unwrap_or_default();
    if show_value {
        out.extend_from_slice(format!("VA {}", value.len()).as_bytes());
    } else {
        out.extend_from_slice(code);
    }
    for flag in flags.flags {
        match flag.first() {
            Some(b'c') if code == b"HD" => out.extend_from_slice(format!(" c{cas}").as_bytes()),
            Some(b't') if code == b"HD" => {
                let ttl = store.get(key, None).map_or(-1, |item| store.ttl(&item));
                out.extend_from_slice(format!(" t{ttl}").as_bytes());
            }
            _ => echo(flag, request, out),
        }
    }
    out.extend_from_slice(b"\r\n");
    if show_value {
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
}

/// `me <key>`: memcached's debug line for an item.
fn meta_debug(store: &Store, request: &Request<'_>, _tokens: &[&[u8]], out: &mut Vec<u8>) {
    let mut buf = [0u8; MAX_KEY_LEN];
    let key = meta_key(request, &mut buf);
    match store.get(key, None) {
        None => out.extend_from_slice(b"EN\r\n"),
        Some(item) => {
            out.extend_from_slice(b"ME ");
            out.extend_from_slice(request.key().unwrap_or_default());
            let line = format!(
                " exp={} la=0 cas={} fetch=no cls=1 size={}\r\n",
                store.ttl(&item),
                item.cas,
                item.value.len() + key.len() + 50
            );
            out.extend_from_slice(line.as_bytes());
        }
    }
}
