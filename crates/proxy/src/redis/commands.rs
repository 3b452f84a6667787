//! Every command redis-server 7.0 knows, with its arity and how the proxy treats it; the
//! keys' positions are the server's own (`COMMAND INFO`: first key, last key, step).

use super::Class::{self, *};
use super::{Split, Why};

/// By name, in byte order: `(name, arity, class)`. An arity of `n` means exactly `n` words,
/// the name included; `-n` at least `n`.
pub(super) const COMMANDS: &[(&str, i32, Class)] = &[
    ("acl", -2, Refused(Why::Keyless)),
    (
        "append",
        3,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    ("asking", 1, Refused(Why::Connection)),
    ("auth", -2, Local),
    ("bgrewriteaof", 1, Refused(Why::Keyless)),
    ("bgsave", -1, Refused(Why::Keyless)),
    (
        "bitcount",
        -2,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "bitfield",
        -2,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "bitfield_ro",
        -2,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "bitop",
        -4,
        Keys {
            first: 2,
            last: -1,
            step: 1,
        },
    ),
    (
        "bitpos",
        -3,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
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
    (
        "copy",
        -3,
        Keys {
            first: 1,
            last: 2,
            step: 1,
        },
    ),
    ("dbsize", 1, Refused(Why::Keyless)),
    ("debug", -2, Refused(Why::Connection)),
    (
        "decr",
        2,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "decrby",
        3,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    ("del", -2, Split(Split::Sum)),
    ("discard", 1, Refused(Why::Transaction)),
    (
        "dump",
        2,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    ("echo", 2, Local),
    (
        "eval",
        -3,
        NumKeys {
            count: 2,
            dest: false,
        },
    ),
    (
        "eval_ro",
        -3,
        NumKeys {
            count: 2,
            dest: false,
        },
    ),
    (
        "evalsha",
        -3,
        NumKeys {
            count: 2,
            dest: false,
        },
    ),
    (
        "evalsha_ro",
        -3,
        NumKeys {
            count: 2,
            dest: false,
        },
    ),
    ("exec", 1, Refused(Why::Transaction)),
    ("exists", -2, Split(Split::Sum)),
    (
        "expire",
        -3,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "expireat",
        -3,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "expiretime",
        2,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    ("failover", -1, Refused(Why::Connection)),
    (
        "fcall",
        -3,
        NumKeys {
            count: 2,
            dest: false,
        },
    ),
    (
        "fcall_ro",
        -3,
        NumKeys {
            count: 2,
            dest: false,
        },
    ),
    ("flushall", -1, Refused(Why::Keyless)),
    ("flushdb", -1, Refused(Why::Keyless)),
    ("function", -2, Refused(Why::Keyless)),
    (
        "geoadd",
        -5,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "geodist",
        -4,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "geohash",
        -2,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "geopos",
        -2,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "georadius",
        -6,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "georadius_ro",
        -6,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "georadiusbymember",
        -5,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "georadiusbymember_ro",
        -5,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "geosearch",
        -7,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "geosearchstore",
        -8,
        Keys {
            first: 1,
            last: 2,
            step: 1,
        },
    ),
    (
        "get",
        2,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "getbit",
        3,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "getdel",
        2,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "getex",
        -2,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "getrange",
        4,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "getset",
        3,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "hdel",
        -3,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    ("hello", -1, Local),
    (
        "hexists",
        3,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "hget",
        3,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "hgetall",
        2,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "hincrby",
        4,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "hincrbyfloat",
        4,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "hkeys",
        2,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "hlen",
        2,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "hmget",
        -3,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "hmset",
        -4,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "hrandfield",
        -2,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "hscan",
        -3,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "hset",
        -4,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "hsetnx",
        4,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "hstrlen",
        3,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "hvals",
        2,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "incr",
        2,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "incrby",
        3,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "incrbyfloat",
        3,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    ("info", -1, Refused(Why::Keyless)),
    ("keys", 2, Refused(Why::Keyless)),
    ("lastsave", 1, Refused(Why::Keyless)),
    ("latency", -2, Refused(Why::Keyless)),
    (
        "lcs",
        -3,
        Keys {
            first: 1,
            last: 2,
            step: 1,
        },
    ),
    (
        "lindex",
        3,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "linsert",
        5,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "llen",
        2,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "lmove",
        5,
        Keys {
            first: 1,
            last: 2,
            step: 1,
        },
    ),
    (
        "lmpop",
        -4,
        NumKeys {
            count: 1,
            dest: false,
        },
    ),
    ("lolwut", -1, Refused(Why::Keyless)),
    (
        "lpop",
        -2,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "lpos",
        -3,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "lpush",
        -3,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "lpushx",
        -3,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "lrange",
        4,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "lrem",
        4,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "lset",
        4,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "ltrim",
        4,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    ("memory", -2, Refused(Why::Keyless)),
    ("mget", -2, Split(Split::Array)),
    ("migrate", -6, Refused(Why::Connection)),
    ("module", -2, Refused(Why::Connection)),
    ("monitor", 1, Refused(Why::Connection)),
    ("move", 3, Refused(Why::Connection)),
    ("mset", -3, Split(Split::Pairs)),
    (
        "msetnx",
        -3,
        Keys {
            first: 1,
            last: -1,
            step: 2,
        },
    ),
    ("multi", 1, Refused(Why::Transaction)),
    ("object", -2, SubcommandKey),
    (
        "persist",
        2,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "pexpire",
        -3,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "pexpireat",
        -3,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "pexpiretime",
        2,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "pfadd",
        -2,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "pfcount",
        -2,
        Keys {
            first: 1,
            last: -1,
            step: 1,
        },
    ),
    (
        "pfdebug",
        3,
        Keys {
            first: 2,
            last: 2,
            step: 1,
        },
    ),
    (
        "pfmerge",
        -2,
        Keys {
            first: 1,
            last: -1,
            step: 1,
        },
    ),
    ("pfselftest", 1, Refused(Why::Keyless)),
    ("ping", -1, Local),
    (
        "psetex",
        4,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    ("psubscribe", -2, Refused(Why::PubSub)),
    ("psync", -3, Refused(Why::Connection)),
    (
        "pttl",
        2,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    ("publish", 3, Refused(Why::PubSub)),
    ("pubsub", -2, Refused(Why::Keyless)),
    ("punsubscribe", -1, Refused(Why::PubSub)),
    ("quit", -1, Local),
    ("randomkey", 1, Refused(Why::Keyless)),
    ("readonly", 1, Refused(Why::Connection)),
    ("readwrite", 1, Refused(Why::Connection)),
    (
        "rename",
        3,
        Keys {
            first: 1,
            last: 2,
            step: 1,
        },
    ),
    (
        "renamenx",
        3,
        Keys {
            first: 1,
            last: 2,
            step: 1,
        },
    ),
    ("replconf", -1, Refused(Why::Connection)),
    ("replicaof", 3, Refused(Why::Connection)),
    ("reset", 1, Refused(Why::Connection)),
    (
        "restore",
        -4,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "restore-asking",
        -4,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    ("role", 1, Refused(Why::Keyless)),
    (
        "rpop",
        -2,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "rpoplpush",
        3,
        Keys {
            first: 1,
            last: 2,
            step: 1,
        },
    ),
    (
        "rpush",
        -3,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "rpushx",
        -3,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "sadd",
        -3,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    ("save", 1, Refused(Why::Keyless)),
    ("scan", -2, Refused(Why::Keyless)),
    (
        "scard",
        2,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    ("script", -2, Refused(Why::Keyless)),
    (
        "sdiff",
        -2,
        Keys {
            first: 1,
            last: -1,
            step: 1,
        },
    ),
    (
        "sdiffstore",
        -3,
        Keys {
            first: 1,
            last: -1,
            step: 1,
        },
    ),
    ("select", 2, Local),
    (
        "set",
        -3,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "setbit",
        4,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "setex",
        4,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "setnx",
        3,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "setrange",
        4,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    ("shutdown", -1, Refused(Why::Connection)),
    (
        "sinter",
        -2,
        Keys {
            first: 1,
            last: -1,
            step: 1,
        },
    ),
    (
        "sintercard",
        -3,
        NumKeys {
            count: 1,
            dest: false,
        },
    ),
    (
        "sinterstore",
        -3,
        Keys {
            first: 1,
            last: -1,
            step: 1,
        },
    ),
    (
        "sismember",
        3,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    ("slaveof", 3, Refused(Why::Connection)),
    ("slowlog", -2, Refused(Why::Keyless)),
    (
        "smembers",
        2,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "smismember",
        -3,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "smove",
        4,
        Keys {
            first: 1,
            last: 2,
            step: 1,
        },
    ),
    (
        "sort",
        -2,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "sort_ro",
        -2,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "spop",
        -2,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    ("spublish", 3, Refused(Why::PubSub)),
    (
        "srandmember",
        -2,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "srem",
        -3,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "sscan",
        -3,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    ("ssubscribe", -2, Refused(Why::PubSub)),
    (
        "strlen",
        2,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    ("subscribe", -2, Refused(Why::PubSub)),
    (
        "substr",
        4,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "sunion",
        -2,
        Keys {
            first: 1,
            last: -1,
            step: 1,
        },
    ),
    (
        "sunionstore",
        -3,
        Keys {
            first: 1,
            last: -1,
            step: 1,
        },
    ),
    ("sunsubscribe", -1, Refused(Why::PubSub)),
    ("swapdb", 3, Refused(Why::Connection)),
    ("sync", 1, Refused(Why::Connection)),
    ("time", 1, Refused(Why::Keyless)),
    ("touch", -2, Split(Split::Sum)),
    (
        "ttl",
        2,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "type",
        2,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    ("unlink", -2, Split(Split::Sum)),
    ("unsubscribe", -1, Refused(Why::PubSub)),
    ("unwatch", 1, Refused(Why::Transaction)),
    ("wait", 3, Refused(Why::Connection)),
    ("watch", -2, Refused(Why::Transaction)),
    (
        "xack",
        -4,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "xadd",
        -5,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "xautoclaim",
        -6,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "xclaim",
        -6,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "xdel",
        -3,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    ("xgroup", -2, SubcommandKey),
    ("xinfo", -2, SubcommandKey),
    (
        "xlen",
        2,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "xpending",
        -3,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "xrange",
        -4,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    ("xread", -4, Refused(Why::Blocking)),
    ("xreadgroup", -7, Refused(Why::Blocking)),
    (
        "xrevrange",
        -4,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "xsetid",
        -3,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "xtrim",
        -4,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "zadd",
        -4,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "zcard",
        2,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "zcount",
        4,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "zdiff",
        -3,
        NumKeys {
            count: 1,
            dest: false,
        },
    ),
    (
        "zdiffstore",
        -4,
        NumKeys {
            count: 2,
            dest: true,
        },
    ),
    (
        "zincrby",
        4,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "zinter",
        -3,
        NumKeys {
            count: 1,
            dest: false,
        },
    ),
    (
        "zintercard",
        -3,
        NumKeys {
            count: 1,
            dest: false,
        },
    ),
    (
        "zinterstore",
        -4,
        NumKeys {
            count: 2,
            dest: true,
        },
    ),
    (
        "zlexcount",
        4,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "zmpop",
        -4,
        NumKeys {
            count: 1,
            dest: false,
        },
    ),
    (
        "zmscore",
        -3,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "zpopmax",
        -2,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "zpopmin",
        -2,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "zrandmember",
        -2,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "zrange",
        -4,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "zrangebylex",
        -4,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "zrangebyscore",
        -4,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "zrangestore",
        -5,
        Keys {
            first: 1,
            last: 2,
            step: 1,
        },
    ),
    (
        "zrank",
        3,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "zrem",
        -3,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "zremrangebylex",
        4,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "zremrangebyrank",
        4,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "zremrangebyscore",
        4,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "zrevrange",
        -4,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "zrevrangebylex",
        -4,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "zrevrangebyscore",
        -4,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "zrevrank",
        3,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "zscan",
        -3,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "zscore",
        3,
        Keys {
            first: 1,
            last: 1,
            step: 1,
        },
    ),
    (
        "zunion",
        -3,
        NumKeys {
            count: 1,
            dest: false,
        },
    ),
    (
        "zunionstore",
        -4,
        NumKeys {
            count: 2,
            dest: true,
        },
    ),
];
