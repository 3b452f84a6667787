//! Redis pools: a client's commands read as redis-server reads them, routed by key with the
//! pool's placement (nutcracker's hashes, distributions and hash tags), split per server when
//! they name keys on several, and answered as one redis-server holding every key answers.
//!
//! - A command with one key, or several that lie on one server, goes to that server as it is.
//!   Keys on several servers are refused, unless the command is one that splits: `MGET`
//!   (the values put back in the client's key order), `DEL`, `UNLINK`, `EXISTS`, `TOUCH`
//!   (the counts added up) and `MSET` (`OK` once every server has said it).
//! - `PING`, `ECHO`, `QUIT`, `AUTH`, `SELECT` and `HELLO` are answered by the proxy; the
//!   pool's password (`redis_auth`) is asked of clients as a server asks it.
//! - What cannot be served by key (transactions, blocking and pub/sub commands, commands on
//!   the connection or the whole server) is refused with an error that says why, and the
//!   connection stays usable. A command the server does not know gets the server's own
//!   `unknown command` reply.

mod cache;
pub(crate) mod cluster;
pub(crate) use cache::get_value;

use std::rc::Rc;

use wire::resp::{self, Command, RequestParser, Step};

use super::client::{forward, Entry, Handled, Requests, Shared};
use super::plan::{Bytes, Combine, OnError, Part, RedisMerge, Router, Wire};
use super::pool::{PoolRouter, PoolRt};
use super::stats::{add, command_index, COMMANDS};
use super::Limits;
use wire::resp::commands::{
    arity_fits, key_positions, lookup, lower, names_other_keys, Class, Split,
};

/// One client's Redis session: its parser's state and whether it has authenticated.
pub(crate) struct Session {
    parser: RequestParser,
    authenticated: bool,
    /// The client asked for RESP3 (`HELLO 3`): its commands go on RESP3 connections.
    resp3: bool,
    /// Bytes of the command being read, for [`MAX_COMMAND`].
    reading: usize,
}

/// The most bytes one command may take, so that the commands many clients hold at once stay
/// bounded (a server takes up to 512 MiB in one argument): a larger argument is refused as
/// a server refuses one over its limit (`-ERR Protocol error: invalid bulk length`, then
/// close), and a client whose command grows past it otherwise (many arguments) is
/// disconnected.
pub const MAX_COMMAND: usize = 64 << 20;

impl Session {
    pub fn new() -> Session {
        Session {
            parser: RequestParser::with_max_bulk(MAX_COMMAND as u64),
            authenticated: false,
            resp3: false,
            reading: 0,
        }
    }

    fn auth_required(&self, pool: &PoolRt) -> bool {
        !self.authenticated && password(pool).is_some()
    }
}

fn password(pool: &PoolRt) -> Option<&str> {
    pool.stats.spec.redis.as_ref()?.auth.as_deref()
}

impl Requests for Session {
    fn handle(
        &mut self,
        buf: &[u8],
        shared: &Rc<Shared>,
        pool: &Rc<PoolRt>,
        limits: &Limits,
    ) -> Handled {
        let stats = &pool.stats;
        let mut used = 0;
        let mut router = pool.router();
        let mut place = Place {
            pool,
            router: &mut router,
        };
        while !shared.full(limits) {
            let step = self.parser.step(&buf[used..], self.auth_required(pool));
            let (n, args) = match step {
                Err(e) => {
                    add(&stats.client_errors, 1);
                    shared.push(Entry::Ready(e.reply()));
                    return Handled::Close;
                }
                Ok((n, Step::More)) => {
                    used += n;
                    self.reading += n;
                    if self.reading + (buf.len() - used) > MAX_COMMAND {
                        add(&stats.client_errors, 1);
                        return Handled::Close;
                    }
                    break;
                }
                Ok((n, Step::Command(args))) => (n, args),
            };
            used += n;
            self.reading = 0;
            if args.is_empty() {
                continue;
            }
            add(&stats.requests, 1);
            let resp3 = self.resp3;
            match self.command(&args, pool, &mut place) {
                Action::Reply(reply) => shared.push(Entry::Ready(reply)),
                Action::Close(reply) => {
                    shared.push(Entry::Ready(reply));
                    return Handled::Close;
                }
                Action::Forward(mut parts, merge, hook) => {
                    let wire = if self.resp3 { Wire::Resp3 } else { Wire::Resp };
                    for part in &mut parts {
                        part.wire = wire;
                    }
                    let on_error = OnError {
                        protocol: wire::memcache::Protocol::Text,
                        opcode: 0,
                        opaque: 0,
                        silent: false,
                    };
                    forward(
                        Some(
                            lower(args.word(0)).map_or(COMMANDS.len() - 1, |(name, len)| {
                                command_index(&name[..len])
                            }),
                        ),
                        &parts,
                        Combine::Redis(merge),
                        on_error,
                        &[],
                        hook,
                        shared,
                        pool,
                    );
                }
            }
            // A new protocol's commands go on other connections: they wait for the replies
            // to those before, which they must not overtake.
            if self.resp3 != resp3 {
                return Handled::Drain(used);
            }
        }
        Handled::Used(used)
    }
}

/// What to do with one command.
enum Action {
    Reply(Vec<u8>),
    /// Reply, then close the connection.
    Close(Vec<u8>),
    /// Forward the parts, merging their replies; the cache's business with it, if any.
    Forward(Vec<Part>, RedisMerge, Option<super::client::CacheHook>),
}

fn wrong_arity(name: &[u8]) -> Vec<u8> {
    let mut message = b"ERR wrong number of arguments for '".to_vec();
    message.extend_from_slice(&name.to_ascii_lowercase());
    message.extend_from_slice(b"' command");
    resp::error(&message)
}

fn refused(name: &[u8], why: &str) -> Vec<u8> {
    let mut message = b"ERR ".to_vec();
    message.extend_from_slice(&name.to_ascii_uppercase());
    message.extend_from_slice(b" is not served through kvswitch: ");
    message.extend_from_slice(why.as_bytes());
    resp::error(&message)
}

const NO_SERVER: &[u8] = b"-ERR no server of the pool is available\r\n";
const CROSS_SERVER: &[u8] =
    b"-ERR the keys of this command lie on different servers; a hash tag keeps them on one\r\n";

impl Session {
    fn command(&mut self, args: &Command, pool: &Rc<PoolRt>, place: &mut Place<'_>) -> Action {
        let name = args.word(0);
        let Some((buf, len)) = lower(name) else {
            return Action::Reply(resp::unknown_command(args));
        };
        let lower = &buf[..len];
        let Some((arity, class)) = lookup(lower) else {
            return Action::Reply(resp::unknown_command(args));
        };
        if !arity_fits(arity, args.len()) {
            return Action::Reply(wrong_arity(name));
        }
        let no_auth = matches!(lower, b"auth" | b"hello" | b"quit");
        if self.auth_required(pool) && !no_auth {
            return Action::Reply(b"-NOAUTH Authentication required.\r\n".to_vec());
        }
        if pool.cache.is_some() && lower == b"get" {
            let key = args.word(1);
            if let Some(reply) = place
                .key(key)
                .and_then(|(server, _)| cache::serve_get(pool, server, key))
            {
                add(&pool.stats.cache_replies, 1);
                return Action::Reply(reply);
            }
        }
        let action = self.route(lower, class, args, pool, place);
        match action {
            Action::Forward(parts, merge, None) if pool.cache.is_some() => {
                Action::Forward(parts, merge, cache::hook(lower, class, args, pool))
            }
            action => action,
        }
    }

    /// Where a command known to Redis goes, by its class.
    fn route(
        &mut self,
        lower: &[u8],
        class: Class,
        args: &Command,
        pool: &PoolRt,
        place: &mut Place<'_>,
    ) -> Action {
        let name = args.word(0);
        match class {
            Class::Local => self.local(lower, args, pool),
            Class::Refused(why) => Action::Reply(refused(name, why.reason())),
            Class::Keys { first, step, .. } => {
                // Key-value pairs (MSETNX): a key without its value is the server's arity
                // error, whichever servers the keys are on.
                if step == 2 && !(args.len() - first).is_multiple_of(2) {
                    return Action::Reply(wrong_arity(name));
                }
                if names_other_keys(lower, args) {
                    let why =
                        "its STORE, BY or GET options name keys that may lie on other servers";
                    return Action::Reply(refused(name, why));
                }
                one_server(args, key_positions(class, args), place)
            }
            // No key (a count the server refuses, a subcommand without its key): any server
            // says the same.
            Class::NumKeys { .. } | Class::SubcommandKey => {
                one_server(args, key_positions(class, args), place)
            }
            Class::Split(split) => self.split(split, args, place),
        }
    }

    /// `MGET`, `DEL` and kin, `MSET`: one command per server, with its share of the keys.
    fn split(&self, split: Split, args: &Command, place: &mut Place<'_>) -> Action {
        let width = if split == Split::Pairs { 2 } else { 1 };
        if !(args.len() - 1).is_multiple_of(width) {
            return Action::Reply(wrong_arity(args.word(0)));
        }
        // Per group (a server; a slot in a cluster) in first-use order: its server and its
        // part's arguments; per key, its part.
        let mut parts: Vec<(u32, usize, Vec<&[u8]>)> = Vec::new();
        let mut part_of: std::collections::HashMap<u32, usize> = Default::default();
        let mut order: Vec<u16> = Vec::with_capacity(args.len() / width);
        for first in (1..args.len()).step_by(width) {
            let Some((server, group)) = place.key(args.word(first)) else {
                return Action::Reply(NO_SERVER.to_vec());
            };
            let part = *part_of.entry(group).or_insert_with(|| {
                parts.push((group, server, vec![args.word(0)]));
                parts.len() - 1
            });
            parts[part]
                .2
                .extend((first..first + width).map(|i| args.word(i)));
            order.push(part as u16);
        }
        if parts.len() == 1 {
            return to_server(parts[0].1, args);
        }
        let merge = match split {
            Split::Array => RedisMerge::Array(order),
            Split::Sum => RedisMerge::Sum,
            Split::Pairs => RedisMerge::AllOk,
        };
        let parts = parts
            .into_iter()
            .map(|(_, server, words)| {
                let mut bytes = Vec::new();
                resp::encode_command(&words, &mut bytes);
                part(server, bytes)
            })
            .collect();
        Action::Forward(parts, merge, None)
    }

    fn local(&mut self, name: &[u8], args: &Command, pool: &PoolRt) -> Action {
        match name {
            b"ping" => match args.len() {
                1 => Action::Reply(b"+PONG\r\n".to_vec()),
                2 => Action::Reply(bulk(args.word(1))),
                _ => Action::Reply(wrong_arity(name)),
            },
            b"echo" => Action::Reply(bulk(args.word(1))),
            b"quit" => Action::Close(b"+OK\r\n".to_vec()),
            b"auth" => match args.len() {
                2 => Action::Reply(self.auth(pool, None, args.word(1))),
                3 => Action::Reply(self.auth(pool, Some(args.word(1)), args.word(2))),
                _ => Action::Reply(b"-ERR syntax error\r\n".to_vec()),
            },
            b"select" => {
                let db = pool.stats.spec.redis.as_ref().map_or(0, |r| r.db);
                match resp::string2ll(args.word(1)) {
                    None => {
                        Action::Reply(b"-ERR value is not an integer or out of range\r\n".to_vec())
                    }
                    Some(n) if n == i64::from(db) => Action::Reply(b"+OK\r\n".to_vec()),
                    Some(_) => Action::Reply(resp::error(
                        format!(
                            "ERR SELECT is not served through kvswitch: the pool's servers use \
                             database {db}"
                        )
                        .as_bytes(),
                    )),
                }
            }
            _ => Action::Reply(self.hello(args, pool)),
        }
    }

    /// `AUTH [user] password`: only the default user, with the pool's password; with no
    /// password set, the default user passes with any.
    fn auth(&mut self, pool: &PoolRt, user: Option<&[u8]>, given: &[u8]) -> Vec<u8> {
        let default = user.is_none_or(|u| u == b"default");
        match password(pool) {
            None if user.is_none() => b"-ERR AUTH <password> called without any password \
                configured for the default user. Are you sure your configuration is \
                correct?\r\n"
                .to_vec(),
            None if default => b"+OK\r\n".to_vec(),
            Some(want) if default && given == want.as_bytes() => {
                self.authenticated = true;
                b"+OK\r\n".to_vec()
            }
            _ => b"-WRONGPASS invalid username-password pair or user is disabled.\r\n".to_vec(),
        }
    }

    /// `HELLO [2|3 [AUTH user password] [SETNAME name]]`: the protocol chosen for the
    /// connection's later replies, and the proxy's description in it.
    fn hello(&mut self, args: &Command, pool: &PoolRt) -> Vec<u8> {
        let mut resp3 = self.resp3;
        if args.len() > 1 {
            match resp::string2ll(args.word(1)) {
                None => {
                    return b"-ERR Protocol version is not an integer or out of range\r\n".to_vec()
                }
                Some(2) => resp3 = false,
                Some(3) => resp3 = true,
                Some(_) => return b"-NOPROTO unsupported protocol version\r\n".to_vec(),
            }
        }
        // Every option is read before any is acted on; the last AUTH is the one tried.
        let mut auth = None;
        let mut i = 2;
        while i < args.len() {
            let option = args.word(i).to_ascii_lowercase();
            if option == b"auth" && i + 2 < args.len() {
                auth = Some((args.word(i + 1), args.word(i + 2)));
                i += 3;
            } else if option == b"setname" && i + 1 < args.len() {
                if args
                    .word(i + 1)
                    .iter()
                    .any(|&b| !(b'!'..=b'~').contains(&b))
                {
                    return b"-ERR Client names cannot contain spaces, newlines or special \
                        characters.\r\n"
                        .to_vec();
                }
                i += 2;
            } else {
                let mut message = b"ERR Syntax error in HELLO option '".to_vec();
                message.extend_from_slice(args.word(i));
                message.push(b'\'');
                return resp::error(&message);
            }
        }
        if let Some((user, password)) = auth {
            let reply = self.auth(pool, Some(user), password);
            if reply != b"+OK\r\n" {
                return reply;
            }
        }
        if self.auth_required(pool) {
            return b"-NOAUTH HELLO must be called with the client already authenticated, \
                otherwise the HELLO <proto> AUTH <user> <pass> option can be used to \
                authenticate the client and select the RESP protocol version at the same \
                time\r\n"
                .to_vec();
        }
        self.resp3 = resp3;
        let mut out = if resp3 {
            b"%7\r\n".to_vec()
        } else {
            b"*14\r\n".to_vec()
        };
        for (field, value) in [
            ("server", "kvswitch"),
            ("version", env!("CARGO_PKG_VERSION")),
        ] {
            resp::bulk(field.as_bytes(), &mut out);
            resp::bulk(value.as_bytes(), &mut out);
        }
        resp::bulk(b"proto", &mut out);
        out.extend_from_slice(if resp3 { b":3\r\n" } else { b":2\r\n" });
        resp::bulk(b"id", &mut out);
        out.extend_from_slice(b":0\r\n");
        for (field, value) in [("mode", "standalone"), ("role", "master")] {
            resp::bulk(field.as_bytes(), &mut out);
            resp::bulk(value.as_bytes(), &mut out);
        }
        resp::bulk(b"modules", &mut out);
        out.extend_from_slice(b"*0\r\n");
        out
    }
}

fn bulk(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + 16);
    resp::bulk(data, &mut out);
    out
}

fn part(server: usize, bytes: Vec<u8>) -> Part {
    Part {
        server,
        wire: Wire::Resp,
        bytes: Bytes::Owned(bytes),
        kind: wire::memcache::reply::ReplyKind::Line,
        sentinel: false,
    }
}

fn to_server(server: usize, args: &Command) -> Action {
    let mut bytes = Vec::new();
    args.encode(&mut bytes);
    Action::Forward(vec![part(server, bytes)], RedisMerge::Single, None)
}

/// To the server of the keys at `positions`, which must all be on one.
/// Where a command's keys are, by its class: the server's key positions (`COMMAND INFO`);
/// none for a command whose keys cannot be told (a count the server refuses, a subcommand
/// without its key) or that names none.
fn one_server(
    args: &Command,
    positions: impl Iterator<Item = usize>,
    place: &mut Place<'_>,
) -> Action {
    let mut first: Option<(usize, u32)> = None;
    for i in positions {
        let Some((server, group)) = place.key(args.word(i)) else {
            return Action::Reply(NO_SERVER.to_vec());
        };
        match first {
            Some((_, g)) if g != group => return Action::Reply(place.cross().to_vec()),
            None => first = Some((server, group)),
            Some(_) => {}
        }
    }
    match first {
        Some((server, _)) => to_server(server, args),
        None => any_server(args, place),
    }
}

/// To the first live server: for commands whose reply does not depend on where keys lie.
fn any_server(args: &Command, place: &mut Place<'_>) -> Action {
    match place.any() {
        Some(s) => to_server(s, args),
        None => Action::Reply(NO_SERVER.to_vec()),
    }
}

/// Where keys go: by the pool's ring, or by a cluster's slots.
struct Place<'a> {
    pool: &'a PoolRt,
    router: &'a mut PoolRouter,
}

impl Place<'_> {
    /// The server of `key`, and its group: keys of one group may be served by one command (a
    /// server's keys; in a cluster, one slot's, as the cluster refuses others).
    fn key(&mut self, key: &[u8]) -> Option<(usize, u32)> {
        if self.pool.cluster().is_none() {
            return self.router.locate(key).map(|s| (s, s as u32));
        }
        let slot = resp::key_slot(key);
        // A slot not learned yet: any node's MOVED will say where it lives.
        let server = self.pool.slot_owner(slot).or_else(|| self.any())?;
        Some((server, u32::from(slot)))
    }

    /// The first live server.
    fn any(&self) -> Option<usize> {
        self.router.live().first().copied()
    }

    /// The refusal of keys in several groups.
    fn cross(&self) -> &'static [u8] {
        if self.pool.cluster().is_some() {
            b"-CROSSSLOT Keys in request don't hash to the same slot\r\n"
        } else {
            CROSS_SERVER
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arity_errors_read_as_the_servers() {
        assert_eq!(
            wrong_arity(b"MGET"),
            b"-ERR wrong number of arguments for 'mget' command\r\n"
        );
    }
}
