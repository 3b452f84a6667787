//! Every command redis-server 7.0 knows: its arity, how a key router treats it, where its keys
//! are (the server's own `COMMAND INFO`: first key, last key, step), and whether it only reads.
//! The proxy routes and refuses by this table, the cache in front of a Redis pool tells reads
//! from writes by it, and the switch's TCP splice picks the server of a command with it.

use super::Command;
use Class::*;

/// How a command is served through kvswitch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Keys at `first`, `first + step`, ... up to `last` (negative: counted from the end);
    /// all on one server.
    Keys {
        first: usize,
        last: i32,
        step: usize,
    },
    /// As many keys as the number at `count` says, right after it; with `dest`, the argument
    /// before the number is a key too (`ZUNIONSTORE dest 2 a b`).
    NumKeys {
        count: usize,
        dest: bool,
    },
    /// The key follows a subcommand (`OBJECT ENCODING key`).
    SubcommandKey,
    /// Keys on several servers are sent to each in a command of its own.
    Split(Split),
    /// Answered by the proxy.
    Local,
    Refused(Why),
}

/// How a command whose keys lie on several servers is put back together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// `MGET`: arrays merged in key order.
    Array,
    /// `DEL` and kin: counts added up.
    Sum,
    /// `MSET`: key-value pairs; `OK` from all.
    Pairs,
}

/// Why a command known to Redis is not served through kvswitch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    Transaction,
    Blocking,
    PubSub,
    Connection,
    Keyless,
}

impl Why {
    pub fn reason(self) -> &'static str {
        match self {
            Why::Transaction => "a transaction's keys may lie on several servers",
            Why::Blocking => "a blocking command would hold a server connection clients share",
            Why::PubSub => "pub/sub needs a server connection of its own",
            Why::Connection => "it acts on the server connection, which clients share",
            Why::Keyless => "it names no key, and the pool's keys lie on several servers",
        }
    }
}

/// The longest command name, with room to spare.
pub const MAX_NAME: usize = 32;

/// A command name in lower case, without allocating; `None` if longer than any command's.
pub fn lower(name: &[u8]) -> Option<([u8; MAX_NAME], usize)> {
    let mut out = [0u8; MAX_NAME];
    out.get_mut(..name.len())?.copy_from_slice(name);
    out.make_ascii_lowercase();
    Some((out, name.len()))
}

/// The arity and class of the command named `name`, in lower case.
pub fn lookup(name: &[u8]) -> Option<(i32, Class)> {
    COMMANDS
        .binary_search_by(|(n, _, _)| n.as_bytes().cmp(name))
        .ok()
        .map(|i| (COMMANDS[i].1, COMMANDS[i].2))
}

/// Whether `argc` words (the name included) fit the arity `arity`.
pub fn arity_fits(arity: i32, argc: usize) -> bool {
    if arity >= 0 {
        argc == arity as usize
    } else {
        argc >= arity.unsigned_abs() as usize
    }
}

/// Whether the command named `name` (in lower case) only reads.
pub fn is_read(name: &[u8]) -> bool {
    READS.binary_search_by(|r| r.as_bytes().cmp(name)).is_ok()
}

/// The positions of a command's keys among its words, by its class. A command with no key,
/// or a count of keys the server refuses, has none.
pub fn key_positions(class: Class, args: &Command) -> impl Iterator<Item = usize> {
    let n = args.len();
    let none = (1, 0, 1, None);
    let (from, to, step, skip) = match class {
        Class::Keys { first, last, step } => {
            let last = if last < 0 {
                n.saturating_sub(last.unsigned_abs() as usize)
            } else {
                last as usize
            };
            (first, last.min(n.saturating_sub(1)), step.max(1), None)
        }
        Class::NumKeys { count, dest } => {
            match super::string2ll(args.word(count))
                .filter(|&k| k > 0 && (k as usize) < n.saturating_sub(count))
            {
                Some(k) => {
                    let from = if dest { count - 1 } else { count + 1 };
                    (from, count + k as usize, 1, Some(count))
                }
                None => none,
            }
        }
        Class::SubcommandKey if n >= 3 => (2, 2, 1, None),
        Class::Split(Split::Pairs) => (1, n.saturating_sub(1), 2, None),
        Class::Split(_) => (1, n.saturating_sub(1), 1, None),
        Class::SubcommandKey | Class::Local | Class::Refused(_) => none,
    };
    (from..=to).step_by(step).filter(move |&i| Some(i) != skip)
}

/// Whether the command named `name` (in lower case) has options that may name other keys:
/// only its whole words tell ([`names_other_keys`]).
pub fn options_may_name_keys(name: &[u8]) -> bool {
    matches!(
        name,
        b"sort" | b"sort_ro" | b"georadius" | b"georadiusbymember"
    )
}

/// Whether a command routed by its first key names others in its options (`SORT ... STORE
/// dst`, `SORT ... BY weight_*`, `GEORADIUS ... STORE dst`), which may lie on other servers.
/// `name` is in lower case. Every word is looked at, so a value that reads as an option
/// counts too.
pub fn names_other_keys(name: &[u8], args: &Command) -> bool {
    if !options_may_name_keys(name) {
        return false;
    }
    let words: Vec<Vec<u8>> = args
        .words()
        .skip(2)
        .map(|w| w.to_ascii_lowercase())
        .collect();
    words.iter().enumerate().any(|(i, word)| {
        let next = words.get(i + 1).map_or(&b""[..], |w| w);
        match word.as_slice() {
            b"store" | b"storedist" => true,
            // `BY nosort` and `GET #` read no other key.
            b"by" => next != b"nosort",
            b"get" => next != b"#",
            _ => false,
        }
    })
}

/// By name, in byte order: `(name, arity, class)`. An arity of `n` means exactly `n` words,
/// the name included; `-n` at least `n`.
#[rustfmt::skip]
pub const COMMANDS: &[(&str, i32, Class)] = &[
    ("acl", -2, Refused(Why::Keyless)),
    ("append", 3, Keys { first: 1, last: 1, step: 1 }),
    ("asking", 1, Refused(Why::Connection)),
    ("auth", -2, Local),
    ("bgrewriteaof", 1, Refused(Why::Keyless)),
    ("bgsave", -1, Refused(Why::Keyless)),
    ("bitcount", -2, Keys { first: 1, last: 1, step: 1 }),
    ("bitfield", -2, Keys { first: 1, last: 1, step: 1 }),
    ("bitfield_ro", -2, Keys { first: 1, last: 1, step: 1 }),
    ("bitop", -4, Keys { first: 2, last: -1, step: 1 }),
    ("bitpos", -3, Keys { first: 1, last: 1, step: 1 }),
    ("blmove", 6, Refused(Why::Blocking)),
    ("blmpop", -5, Refused(Why::Blocking)),
    ("blpop", -3, Refused(Why::Blocking)),
    ("brpop", -3, Refused(Why::Blocking)),
    ("brpoplpush", 4, Refused(Why::Blocking)),
    ("bzmpop", -5, Refused(Why::Blocking)),
    ("bzpopmax", -3, Refused(Why::Blocking)),
    ("bzpopmin", -3, Refused(Why::Blocking)),
    ("client", -2, Refused(Why::Connection)),
    ("cluster", -2, Refused(Why::Connection)),
    ("command", -1, Refused(Why::Keyless)),
    ("config", -2, Refused(Why::Keyless)),
    ("copy", -3, Keys { first: 1, last: 2, step: 1 }),
    ("dbsize", 1, Refused(Why::Keyless)),
    ("debug", -2, Refused(Why::Connection)),
    ("decr", 2, Keys { first: 1, last: 1, step: 1 }),
    ("decrby", 3, Keys { first: 1, last: 1, step: 1 }),
    ("del", -2, Split(Split::Sum)),
    ("discard", 1, Refused(Why::Transaction)),
    ("dump", 2, Keys { first: 1, last: 1, step: 1 }),
    ("echo", 2, Local),
    ("eval", -3, NumKeys { count: 2, dest: false }),
    ("eval_ro", -3, NumKeys { count: 2, dest: false }),
    ("evalsha", -3, NumKeys { count: 2, dest: false }),
    ("evalsha_ro", -3, NumKeys { count: 2, dest: false }),
    ("exec", 1, Refused(Why::Transaction)),
    ("exists", -2, Split(Split::Sum)),
    ("expire", -3, Keys { first: 1, last: 1, step: 1 }),
    ("expireat", -3, Keys { first: 1, last: 1, step: 1 }),
    ("expiretime", 2, Keys { first: 1, last: 1, step: 1 }),
    ("failover", -1, Refused(Why::Connection)),
    ("fcall", -3, NumKeys { count: 2, dest: false }),
    ("fcall_ro", -3, NumKeys { count: 2, dest: false }),
    ("flushall", -1, Refused(Why::Keyless)),
    ("flushdb", -1, Refused(Why::Keyless)),
    ("function", -2, Refused(Why::Keyless)),
    ("geoadd", -5, Keys { first: 1, last: 1, step: 1 }),
    ("geodist", -4, Keys { first: 1, last: 1, step: 1 }),
    ("geohash", -2, Keys { first: 1, last: 1, step: 1 }),
    ("geopos", -2, Keys { first: 1, last: 1, step: 1 }),
    ("georadius", -6, Keys { first: 1, last: 1, step: 1 }),
    ("georadius_ro", -6, Keys { first: 1, last: 1, step: 1 }),
    ("georadiusbymember", -5, Keys { first: 1, last: 1, step: 1 }),
    ("georadiusbymember_ro", -5, Keys { first: 1, last: 1, step: 1 }),
    ("geosearch", -7, Keys { first: 1, last: 1, step: 1 }),
    ("geosearchstore", -8, Keys { first: 1, last: 2, step: 1 }),
    ("get", 2, Keys { first: 1, last: 1, step: 1 }),
    ("getbit", 3, Keys { first: 1, last: 1, step: 1 }),
    ("getdel", 2, Keys { first: 1, last: 1, step: 1 }),
    ("getex", -2, Keys { first: 1, last: 1, step: 1 }),
    ("getrange", 4, Keys { first: 1, last: 1, step: 1 }),
    ("getset", 3, Keys { first: 1, last: 1, step: 1 }),
    ("hdel", -3, Keys { first: 1, last: 1, step: 1 }),
    ("hello", -1, Local),
    ("hexists", 3, Keys { first: 1, last: 1, step: 1 }),
    ("hget", 3, Keys { first: 1, last: 1, step: 1 }),
    ("hgetall", 2, Keys { first: 1, last: 1, step: 1 }),
    ("hincrby", 4, Keys { first: 1, last: 1, step: 1 }),
    ("hincrbyfloat", 4, Keys { first: 1, last: 1, step: 1 }),
    ("hkeys", 2, Keys { first: 1, last: 1, step: 1 }),
    ("hlen", 2, Keys { first: 1, last: 1, step: 1 }),
    ("hmget", -3, Keys { first: 1, last: 1, step: 1 }),
    ("hmset", -4, Keys { first: 1, last: 1, step: 1 }),
    ("hrandfield", -2, Keys { first: 1, last: 1, step: 1 }),
    ("hscan", -3, Keys { first: 1, last: 1, step: 1 }),
    ("hset", -4, Keys { first: 1, last: 1, step: 1 }),
    ("hsetnx", 4, Keys { first: 1, last: 1, step: 1 }),
    ("hstrlen", 3, Keys { first: 1, last: 1, step: 1 }),
    ("hvals", 2, Keys { first: 1, last: 1, step: 1 }),
    ("incr", 2, Keys { first: 1, last: 1, step: 1 }),
    ("incrby", 3, Keys { first: 1, last: 1, step: 1 }),
    ("incrbyfloat", 3, Keys { first: 1, last: 1, step: 1 }),
    ("info", -1, Refused(Why::Keyless)),
    ("keys", 2, Refused(Why::Keyless)),
    ("lastsave", 1, Refused(Why::Keyless)),
    ("latency", -2, Refused(Why::Keyless)),
    ("lcs", -3, Keys { first: 1, last: 2, step: 1 }),
    ("lindex", 3, Keys { first: 1, last: 1, step: 1 }),
    ("linsert", 5, Keys { first: 1, last: 1, step: 1 }),
    ("llen", 2, Keys { first: 1, last: 1, step: 1 }),
    ("lmove", 5, Keys { first: 1, last: 2, step: 1 }),
    ("lmpop", -4, NumKeys { count: 1, dest: false }),
    ("lolwut", -1, Refused(Why::Keyless)),
    ("lpop", -2, Keys { first: 1, last: 1, step: 1 }),
    ("lpos", -3, Keys { first: 1, last: 1, step: 1 }),
    ("lpush", -3, Keys { first: 1, last: 1, step: 1 }),
    ("lpushx", -3, Keys { first: 1, last: 1, step: 1 }),
    ("lrange", 4, Keys { first: 1, last: 1, step: 1 }),
    ("lrem", 4, Keys { first: 1, last: 1, step: 1 }),
    ("lset", 4, Keys { first: 1, last: 1, step: 1 }),
    ("ltrim", 4, Keys { first: 1, last: 1, step: 1 }),
    ("memory", -2, Refused(Why::Keyless)),
    ("mget", -2, Split(Split::Array)),
    ("migrate", -6, Refused(Why::Connection)),
    ("module", -2, Refused(Why::Connection)),
    ("monitor", 1, Refused(Why::Connection)),
    ("move", 3, Refused(Why::Connection)),
    ("mset", -3, Split(Split::Pairs)),
    ("msetnx", -3, Keys { first: 1, last: -1, step: 2 }),
    ("multi", 1, Refused(Why::Transaction)),
    ("object", -2, SubcommandKey),
    ("persist", 2, Keys { first: 1, last: 1, step: 1 }),
    ("pexpire", -3, Keys { first: 1, last: 1, step: 1 }),
    ("pexpireat", -3, Keys { first: 1, last: 1, step: 1 }),
    ("pexpiretime", 2, Keys { first: 1, last: 1, step: 1 }),
    ("pfadd", -2, Keys { first: 1, last: 1, step: 1 }),
    ("pfcount", -2, Keys { first: 1, last: -1, step: 1 }),
    ("pfdebug", 3, Keys { first: 2, last: 2, step: 1 }),
    ("pfmerge", -2, Keys { first: 1, last: -1, step: 1 }),
    ("pfselftest", 1, Refused(Why::Keyless)),
    ("ping", -1, Local),
    ("psetex", 4, Keys { first: 1, last: 1, step: 1 }),
    ("psubscribe", -2, Refused(Why::PubSub)),
    ("psync", -3, Refused(Why::Connection)),
    ("pttl", 2, Keys { first: 1, last: 1, step: 1 }),
    ("publish", 3, Refused(Why::PubSub)),
    ("pubsub", -2, Refused(Why::Keyless)),
    ("punsubscribe", -1, Refused(Why::PubSub)),
    ("quit", -1, Local),
    ("randomkey", 1, Refused(Why::Keyless)),
    ("readonly", 1, Refused(Why::Connection)),
    ("readwrite", 1, Refused(Why::Connection)),
    ("rename", 3, Keys { first: 1, last: 2, step: 1 }),
    ("renamenx", 3, Keys { first: 1, last: 2, step: 1 }),
    ("replconf", -1, Refused(Why::Connection)),
    ("replicaof", 3, Refused(Why::Connection)),
    ("reset", 1, Refused(Why::Connection)),
    ("restore", -4, Keys { first: 1, last: 1, step: 1 }),
    ("restore-asking", -4, Keys { first: 1, last: 1, step: 1 }),
    ("role", 1, Refused(Why::Keyless)),
    ("rpop", -2, Keys { first: 1, last: 1, step: 1 }),
    ("rpoplpush", 3, Keys { first: 1, last: 2, step: 1 }),
    ("rpush", -3, Keys { first: 1, last: 1, step: 1 }),
    ("rpushx", -3, Keys { first: 1, last: 1, step: 1 }),
    ("sadd", -3, Keys { first: 1, last: 1, step: 1 }),
    ("save", 1, Refused(Why::Keyless)),
    ("scan", -2, Refused(Why::Keyless)),
    ("scard", 2, Keys { first: 1, last: 1, step: 1 }),
    ("script", -2, Refused(Why::Keyless)),
    ("sdiff", -2, Keys { first: 1, last: -1, step: 1 }),
    ("sdiffstore", -3, Keys { first: 1, last: -1, step: 1 }),
    ("select", 2, Local),
    ("set", -3, Keys { first: 1, last: 1, step: 1 }),
    ("setbit", 4, Keys { first: 1, last: 1, step: 1 }),
    ("setex", 4, Keys { first: 1, last: 1, step: 1 }),
    ("setnx", 3, Keys { first: 1, last: 1, step: 1 }),
    ("setrange", 4, Keys { first: 1, last: 1, step: 1 }),
    ("shutdown", -1, Refused(Why::Connection)),
    ("sinter", -2, Keys { first: 1, last: -1, step: 1 }),
    ("sintercard", -3, NumKeys { count: 1, dest: false }),
    ("sinterstore", -3, Keys { first: 1, last: -1, step: 1 }),
    ("sismember", 3, Keys { first: 1, last: 1, step: 1 }),
    ("slaveof", 3, Refused(Why::Connection)),
    ("slowlog", -2, Refused(Why::Keyless)),
    ("smembers", 2, Keys { first: 1, last: 1, step: 1 }),
    ("smismember", -3, Keys { first: 1, last: 1, step: 1 }),
    ("smove", 4, Keys { first: 1, last: 2, step: 1 }),
    ("sort", -2, Keys { first: 1, last: 1, step: 1 }),
    ("sort_ro", -2, Keys { first: 1, last: 1, step: 1 }),
    ("spop", -2, Keys { first: 1, last: 1, step: 1 }),
    ("spublish", 3, Refused(Why::PubSub)),
    ("srandmember", -2, Keys { first: 1, last: 1, step: 1 }),
    ("srem", -3, Keys { first: 1, last: 1, step: 1 }),
    ("sscan", -3, Keys { first: 1, last: 1, step: 1 }),
    ("ssubscribe", -2, Refused(Why::PubSub)),
    ("strlen", 2, Keys { first: 1, last: 1, step: 1 }),
    ("subscribe", -2, Refused(Why::PubSub)),
    ("substr", 4, Keys { first: 1, last: 1, step: 1 }),
    ("sunion", -2, Keys { first: 1, last: -1, step: 1 }),
    ("sunionstore", -3, Keys { first: 1, last: -1, step: 1 }),
    ("sunsubscribe", -1, Refused(Why::PubSub)),
    ("swapdb", 3, Refused(Why::Connection)),
    ("sync", 1, Refused(Why::Connection)),
    ("time", 1, Refused(Why::Keyless)),
    ("touch", -2, Split(Split::Sum)),
    ("ttl", 2, Keys { first: 1, last: 1, step: 1 }),
    ("type", 2, Keys { first: 1, last: 1, step: 1 }),
    ("unlink", -2, Split(Split::Sum)),
    ("unsubscribe", -1, Refused(Why::PubSub)),
    ("unwatch", 1, Refused(Why::Transaction)),
    ("wait", 3, Refused(Why::Connection)),
    ("watch", -2, Refused(Why::Transaction)),
    ("xack", -4, Keys { first: 1, last: 1, step: 1 }),
    ("xadd", -5, Keys { first: 1, last: 1, step: 1 }),
    ("xautoclaim", -6, Keys { first: 1, last: 1, step: 1 }),
    ("xclaim", -6, Keys { first: 1, last: 1, step: 1 }),
    ("xdel", -3, Keys { first: 1, last: 1, step: 1 }),
    ("xgroup", -2, SubcommandKey),
    ("xinfo", -2, SubcommandKey),
    ("xlen", 2, Keys { first: 1, last: 1, step: 1 }),
    ("xpending", -3, Keys { first: 1, last: 1, step: 1 }),
    ("xrange", -4, Keys { first: 1, last: 1, step: 1 }),
    ("xread", -4, Refused(Why::Blocking)),
    ("xreadgroup", -7, Refused(Why::Blocking)),
    ("xrevrange", -4, Keys { first: 1, last: 1, step: 1 }),
    ("xsetid", -3, Keys { first: 1, last: 1, step: 1 }),
    ("xtrim", -4, Keys { first: 1, last: 1, step: 1 }),
    ("zadd", -4, Keys { first: 1, last: 1, step: 1 }),
    ("zcard", 2, Keys { first: 1, last: 1, step: 1 }),
    ("zcount", 4, Keys { first: 1, last: 1, step: 1 }),
    ("zdiff", -3, NumKeys { count: 1, dest: false }),
    ("zdiffstore", -4, NumKeys { count: 2, dest: true }),
    ("zincrby", 4, Keys { first: 1, last: 1, step: 1 }),
    ("zinter", -3, NumKeys { count: 1, dest: false }),
    ("zintercard", -3, NumKeys { count: 1, dest: false }),
    ("zinterstore", -4, NumKeys { count: 2, dest: true }),
    ("zlexcount", 4, Keys { first: 1, last: 1, step: 1 }),
    ("zmpop", -4, NumKeys { count: 1, dest: false }),
    ("zmscore", -3, Keys { first: 1, last: 1, step: 1 }),
    ("zpopmax", -2, Keys { first: 1, last: 1, step: 1 }),
    ("zpopmin", -2, Keys { first: 1, last: 1, step: 1 }),
    ("zrandmember", -2, Keys { first: 1, last: 1, step: 1 }),
    ("zrange", -4, Keys { first: 1, last: 1, step: 1 }),
    ("zrangebylex", -4, Keys { first: 1, last: 1, step: 1 }),
    ("zrangebyscore", -4, Keys { first: 1, last: 1, step: 1 }),
    ("zrangestore", -5, Keys { first: 1, last: 2, step: 1 }),
    ("zrank", 3, Keys { first: 1, last: 1, step: 1 }),
    ("zrem", -3, Keys { first: 1, last: 1, step: 1 }),
    ("zremrangebylex", 4, Keys { first: 1, last: 1, step: 1 }),
    ("zremrangebyrank", 4, Keys { first: 1, last: 1, step: 1 }),
    ("zremrangebyscore", 4, Keys { first: 1, last: 1, step: 1 }),
    ("zrevrange", -4, Keys { first: 1, last: 1, step: 1 }),
    ("zrevrangebylex", -4, Keys { first: 1, last: 1, step: 1 }),
    ("zrevrangebyscore", -4, Keys { first: 1, last: 1, step: 1 }),
    ("zrevrank", 3, Keys { first: 1, last: 1, step: 1 }),
    ("zscan", -3, Keys { first: 1, last: 1, step: 1 }),
    ("zscore", 3, Keys { first: 1, last: 1, step: 1 }),
    ("zunion", -3, NumKeys { count: 1, dest: false }),
    ("zunionstore", -4, NumKeys { count: 2, dest: true }),
];

/// Commands that change no key's value, existence or expiry, as the proxy forwards them, in
/// byte order.
pub const READS: &[&str] = &[
    "bitcount",
    "bitfield_ro",
    "bitpos",
    "dump",
    "eval_ro",
    "evalsha_ro",
    "exists",
    "expiretime",
    "fcall_ro",
    "geodist",
    "geohash",
    "geopos",
    // Forwarded only without STORE (refused: those keys may lie on other servers).
    "georadius",
    "georadius_ro",
    "georadiusbymember",
    "georadiusbymember_ro",
    "geosearch",
    "get",
    "getbit",
    "getrange",
    "hexists",
    "hget",
    "hgetall",
    "hkeys",
    "hlen",
    "hmget",
    "hrandfield",
    "hscan",
    "hstrlen",
    "hvals",
    "lcs",
    "lindex",
    "llen",
    "lpos",
    "lrange",
    "mget",
    "object",
    "pexpiretime",
    "pttl",
    "scard",
    "sdiff",
    "sinter",
    "sintercard",
    "sismember",
    "smembers",
    "smismember",
    "sort",
    "sort_ro",
    "srandmember",
    "sscan",
    "strlen",
    "substr",
    "sunion",
    "touch",
    "ttl",
    "type",
    "xinfo",
    "xlen",
    "xpending",
    "xrange",
    "xrevrange",
    "zcard",
    "zcount",
    "zdiff",
    "zinter",
    "zintercard",
    "zlexcount",
    "zmscore",
    "zrandmember",
    "zrange",
    "zrangebylex",
    "zrangebyscore",
    "zrank",
    "zrevrange",
    "zrevrangebylex",
    "zrevrangebyscore",
    "zrevrank",
    "zscan",
    "zscore",
    "zunion",
];

#[cfg(test)]
mod tests {
    use super::*;

    fn command(words: &[&str]) -> Command {
        Command::from_words(words)
    }

    #[test]
    fn the_command_table_is_in_byte_order_and_complete() {
        assert!(COMMANDS.windows(2).all(|w| w[0].0 < w[1].0));
        let (name, len) = lower(b"GeT").unwrap();
        assert_eq!(
            lookup(&name[..len]),
            Some((
                2,
                Class::Keys {
                    first: 1,
                    last: 1,
                    step: 1
                }
            ))
        );
        assert_eq!(lookup(b"mget"), Some((-2, Class::Split(Split::Array))));
        assert_eq!(lookup(b"nosuch"), None);
        assert!(matches!(
            lookup(b"multi"),
            Some((_, Class::Refused(Why::Transaction)))
        ));
        assert!(matches!(
            lookup(b"blpop"),
            Some((_, Class::Refused(Why::Blocking)))
        ));
        assert!(matches!(
            lookup(b"subscribe"),
            Some((_, Class::Refused(Why::PubSub)))
        ));
        assert!(matches!(
            lookup(b"keys"),
            Some((_, Class::Refused(Why::Keyless)))
        ));
        assert!(lower(&[b'a'; MAX_NAME + 1]).is_none());
    }

    #[test]
    fn arities_fit_as_the_servers() {
        assert!(arity_fits(2, 2) && !arity_fits(2, 3));
        assert!(arity_fits(-2, 5) && !arity_fits(-2, 1));
    }

    #[test]
    fn the_reads_are_in_byte_order_and_known_to_the_command_table() {
        assert!(READS.windows(2).all(|w| w[0] < w[1]));
        for name in READS {
            assert!(lookup(name.as_bytes()).is_some(), "{name}");
        }
        assert!(is_read(b"get") && is_read(b"zscore"));
        assert!(!is_read(b"set") && !is_read(b"eval") && !is_read(b"nosuch"));
    }

    #[test]
    fn keys_are_found_by_the_class() {
        let at = |words: &[&str]| {
            let (_, class) = lookup(words[0].as_bytes()).expect("a command");
            key_positions(class, &command(words)).collect::<Vec<_>>()
        };
        assert_eq!(at(&["set", "k", "v"]), vec![1]);
        assert_eq!(at(&["rename", "a", "b"]), vec![1, 2]);
        assert_eq!(at(&["mset", "a", "1", "b", "2"]), vec![1, 3]);
        assert_eq!(at(&["del", "a", "b", "c"]), vec![1, 2, 3]);
        assert_eq!(at(&["zunionstore", "d", "2", "a", "b"]), vec![1, 3, 4]);
        assert_eq!(at(&["bitop", "and", "d", "a", "b"]), vec![2, 3, 4]);
        assert_eq!(at(&["eval", "return 1", "1", "k", "arg"]), vec![3]);
        assert!(at(&["eval", "return 1", "0"]).is_empty());
        assert!(at(&["ping"]).is_empty());
    }

    #[test]
    fn sort_and_georadius_options_that_name_keys_are_seen() {
        let other = |words: &[&str]| names_other_keys(words[0].as_bytes(), &command(words));
        assert!(other(&["sort", "k", "STORE", "d"]));
        assert!(other(&["sort", "k", "by", "w_*"]));
        assert!(!other(&["sort", "k", "by", "nosort", "get", "#"]));
        assert!(!other(&["get", "k"]));
    }
}
