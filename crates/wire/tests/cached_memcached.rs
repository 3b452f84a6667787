//! `wire::memcache::cached` against a real memcached on loopback: items read out of
//! memcached's replies must answer every servable request form with exactly the bytes memcached
//! itself sends.
//!
//! Skipped (with a note) when memcached is not installed.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::process::Command as Process;

use testbed::local::{require, Ports, Proc, IO_TIMEOUT};
use testbed::replies::{ends_with_sentinel, SENTINEL};
use wire::memcache::binary::{self, opcode};
use wire::memcache::cached::{
    read_fills, servable, write_hit, write_text_end, CachedItem, KeyForm,
};
use wire::memcache::reply::{reply_len, ReplyKind};
use wire::memcache::{parse, Command, Protocol, Request, MAX_KEY_LEN};

/// A memcached that takes 1 MiB values, killed by its PID when dropped, and two connections:
/// memcached fixes a connection's protocol at its first byte, text or binary.
struct Server {
    text: TcpStream,
    binary: TcpStream,
    _memcached: Proc,
}

impl Server {
    fn start() -> Option<Server> {
        let Ok(bin) = require("memcached") else {
            eprintln!("memcached not installed; skipping");
            return None;
        };
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let ports = Ports::default();
        let port = ports.pick(ip).expect("a free port");
        ports.release();
        let addr = SocketAddr::new(ip, port);
        let mut memcached = Proc::spawn(
            "memcached",
            Process::new(bin).args([
                "-p",
                &port.to_string(),
                "-U",
                "0",
                "-l",
                "127.0.0.1",
                "-t",
                "1",
                "-m",
                "64",
                // Items up to 2 MiB, so that a 1 MiB value fits with its header.
                "-I",
                "2m",
                // Only used when running as root, where memcached refuses to start without it.
                "-u",
                "nobody",
            ]),
        )
        .expect("start memcached");
        memcached
            .wait_listening(addr, None)
            .expect("memcached listens");
        let connect = || {
            let stream = TcpStream::connect(addr).expect("connect to memcached");
            stream.set_read_timeout(Some(IO_TIMEOUT)).expect("timeout");
            stream.set_nodelay(true).expect("nodelay");
            stream
        };
        Some(Server {
            text: connect(),
            binary: connect(),
            _memcached: memcached,
        })
    }

    /// Sends `payload` and reads until `done` says the reply is whole.
    fn exchange(&mut self, payload: &[u8], done: impl Fn(&[u8]) -> bool) -> Vec<u8> {
        let stream = match payload.first() {
            Some(&binary::REQUEST_MAGIC) => &mut self.binary,
            _ => &mut self.text,
        };
        stream.write_all(payload).expect("send");
        let mut reply = Vec::new();
        let mut chunk = vec![0u8; 1 << 16];
        while !done(&reply) {
            let n = stream.read(&mut chunk).expect("read a reply");
            assert!(n > 0, "memcached closed the connection");
            reply.extend_from_slice(&chunk[..n]);
        }
        reply
    }

    /// memcached's reply to `request`, and the bytes `read_fills` is given: the same, but for a
    /// quiet binary get, which travels with a `NOOP` whose reply is left on the end.
    fn ask(&mut self, request: &Request<'_>) -> (Vec<u8>, Vec<u8>) {
        let quiet_get = matches!(
            request.command,
            Command::Binary(opcode::GETQ | opcode::GETKQ)
        );
        if quiet_get {
            let mut payload = request.bytes().to_vec();
            binary::write_request(opcode::NOOP, b"", b"", b"", SENTINEL, 0, &mut payload);
            let whole = self.exchange(&payload, ends_with_sentinel);
            let reply = whole[..whole.len() - binary::HEADER_LEN].to_vec();
            return (reply, whole);
        }
        let kind = ReplyKind::of(request);
        let reply = self.exchange(request.bytes(), |buf| {
            reply_len(kind, buf).expect("a well-framed reply").is_some()
        });
        let len = reply_len(kind, &reply).unwrap().unwrap();
        assert_eq!(len, reply.len(), "one reply at a time");
        (reply.clone(), reply)
    }

    fn store(&mut self, payload: &[u8], want: &[u8]) {
        let reply = self.exchange(payload, |buf| buf.ends_with(b"\r\n"));
        assert_eq!(reply, want, "{:?}", String::from_utf8_lossy(payload));
    }
}

/// An item as the cache keeps it, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Held {
    flags: u32,
    cas: Option<u64>,
    data: Vec<u8>,
    key_form: KeyForm,
}

impl Held {
    fn from(item: &CachedItem<'_>) -> Held {
        Held {
            flags: item.flags,
            cas: item.cas,
            data: item.data.to_vec(),
            key_form: item.key_form,
        }
    }

    fn item(&self) -> CachedItem<'_> {
        CachedItem {
            flags: self.flags,
            cas: self.cas,
            data: &self.data,
            key_form: self.key_form,
        }
    }
}

/// An item stored in memcached for the test.
struct Stored {
    key: Vec<u8>,
    flags: u32,
    data: Vec<u8>,
    /// Stored by `ms` with a base64 key rather than by `set`.
    by_meta_base64: bool,
}

impl Stored {
    /// Whether the text protocol can name the key.
    fn text_key(&self) -> bool {
        !self.key.iter().any(|&b| matches!(b, b' ' | b'\r' | b'\n'))
    }

    fn base64(&self) -> Vec<u8> {
        base64(&self.key)
    }
}

fn base64(bytes: &[u8]) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    for group in bytes.chunks(3) {
        let b = [
            group[0],
            *group.get(1).unwrap_or(&0),
            *group.get(2).unwrap_or(&0),
        ];
        let n = u32::from_be_bytes([0, b[0], b[1], b[2]]);
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            let c = ALPHABET[(n >> shift & 63) as usize];
            out.push(if i > group.len() { b'=' } else { c });
        }
    }
    out
}

fn items() -> Vec<Stored> {
    let stored = |key: &[u8], flags: u32, data: Vec<u8>| Stored {
        key: key.to_vec(),
        flags,
        data,
        by_meta_base64: false,
    };
    let every_byte: Vec<u8> = (0..=255u8).cycle().take(1024).collect();
    let big: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7 % 253) as u8).collect();
    vec![
        stored(b"plain", 0, b"hello".to_vec()),
        stored(b"empty", 7, Vec::new()),
        stored(b"crlf", u32::MAX, b"a\r\nb\r\n\r\nEND\r\n".to_vec()),
        stored(b"bin", 0x8000_0001, every_byte),
        stored(b"big", 42, big),
        stored(b"ctl\x01key\x7f", 1, b"x".to_vec()),
        // The longest key whose base64 form is a valid meta key (248 bytes).
        stored(&[b'L'; 186], 99, b"long key".to_vec()),
        Stored {
            key: b"metab64".to_vec(),
            flags: 12,
            data: b"stored\r\nby ms".to_vec(),
            by_meta_base64: true,
        },
        Stored {
            key: b"sp ace\x00\r\n".to_vec(),
            flags: 13,
            data: b"only base64 can name me".to_vec(),
            by_meta_base64: true,
        },
    ]
}

fn request(bytes: &[u8]) -> Request<'_> {
    match parse(bytes) {
        Ok(Some(request)) if request.len == bytes.len() => request,
        other => panic!("{:?}: {other:?}", String::from_utf8_lossy(bytes)),
    }
}

fn line(words: &[&[u8]]) -> Vec<u8> {
    let mut out = words.join(&b' ');
    out.extend_from_slice(b"\r\n");
    out
}

fn binary_get(op: u8, key: &[u8], opaque: u32) -> Vec<u8> {
    let mut out = Vec::new();
    binary::write_request(op, key, b"", b"", opaque, 0, &mut out);
    out
}

/// The cache's reply to `request` from `held`, keyed by stored key.
fn serve(request: &Request<'_>, held: &HashMap<Vec<u8>, Held>) -> Vec<u8> {
    let serve = servable(request).expect("servable");
    let mut out = Vec::new();
    for token in request.keys() {
        let mut buf = [0u8; MAX_KEY_LEN];
        let key = request.stored_key(token, &mut buf).expect("a key");
        if let Some(item) = held.get(key) {
            assert!(serve.can_answer(&item.item()));
            assert!(write_hit(request, token, &item.item(), &mut out));
        }
    }
    if request.protocol == Protocol::Text {
        write_text_end(&mut out);
    }
    out
}

/// The items `read_fills` takes from `reply`, by stored key.
fn fills(request: &Request<'_>, reply: &[u8]) -> Vec<(Vec<u8>, Held)> {
    let mut out = Vec::new();
    read_fills(request, reply, |token, item| {
        let mut buf = [0u8; MAX_KEY_LEN];
        let key = request.stored_key(token, &mut buf).expect("a key");
        out.push((key.to_vec(), Held::from(&item)));
    });
    out
}

/// The request forms to compare for one item, each a complete request.
fn forms(item: &Stored, other: &[u8]) -> Vec<Vec<u8>> {
    let key = &item.key[..];
    let b64 = item.base64();
    let mut forms = Vec::new();
    if item.text_key() {
        forms.push(line(&[b"get", key]));
        forms.push(line(&[b"gets", key]));
        forms.push(line(&[b"get", key, key]));
        forms.push(line(&[b"get", key, b"missing", other, key]));
        forms.push(line(&[b"gets", other, key, b"missing"]));
    }
    // Every subset of the servable meta flags, in two orders, by plain and base64 key.
    const FLAGS: [&[u8]; 7] = [b"v", b"k", b"f", b"c", b"s", b"O123", b"q"];
    for subset in 0..1u32 << FLAGS.len() {
        let chosen: Vec<&[u8]> = (0..FLAGS.len())
            .filter(|i| subset & 1 << i != 0)
            .map(|i| FLAGS[i])
            .collect();
        let reversed: Vec<&[u8]> = chosen.iter().rev().copied().collect();
        for flags in [&chosen, &reversed] {
            let mg = |head: &[&[u8]], tail: &[&[u8]]| line(&[head, flags, tail].concat());
            if item.text_key() {
                forms.push(mg(&[b"mg", key], &[]));
            }
            forms.push(mg(&[b"mg", &b64, b"b"], &[]));
            forms.push(mg(&[b"mg", &b64], &[b"b"]));
        }
    }
    let longest_opaque = [b"O".as_slice(), &[b'9'; 31]].concat();
    forms.push(line(&[b"mg", &b64, b"b", b"O", b"v"]));
    forms.push(line(&[b"mg", &b64, b"b", &longest_opaque, b"k"]));
    for op in [opcode::GET, opcode::GETQ, opcode::GETK, opcode::GETKQ] {
        for opaque in [0, 0xdead_beef] {
            forms.push(binary_get(op, key, opaque));
        }
    }
    forms
}

#[test]
fn cached_replies_match_memcached() {
    let Some(mut server) = Server::start() else {
        return;
    };
    let items = items();
    for item in &items {
        let flags = item.flags.to_string();
        let len = item.data.len().to_string();
        let mut payload = if item.by_meta_base64 {
            line(&[
                b"ms",
                &item.base64(),
                len.as_bytes(),
                b"b",
                &[b"F", flags.as_bytes()].concat(),
            ])
        } else {
            line(&[b"set", &item.key, flags.as_bytes(), b"0", len.as_bytes()])
        };
        payload.extend_from_slice(&item.data);
        payload.extend_from_slice(b"\r\n");
        let want: &[u8] = if item.by_meta_base64 {
            b"HD\r\n"
        } else {
            b"STORED\r\n"
        };
        server.store(&payload, want);
    }

    // Fill the cache from CAS-bearing reads, and check that every kind of read agrees.
    let mut held = HashMap::new();
    for item in &items {
        let key_form = if item.by_meta_base64 {
            KeyForm::Base64
        } else {
            KeyForm::Raw
        };
        let want = Held {
            flags: item.flags,
            cas: None,
            data: item.data.clone(),
            key_form: KeyForm::Unknown,
        };
        let mut reads = vec![
            line(&[b"mg", &item.base64(), b"b", b"v", b"f", b"c", b"k"]),
            binary_get(opcode::GET, &item.key, 5),
        ];
        if item.text_key() {
            reads.push(line(&[b"gets", &item.key]));
            reads.push(line(&[b"get", &item.key]));
        }
        let mut cas = None;
        for bytes in &reads {
            let read = request(bytes);
            let (_, reply) = server.ask(&read);
            let got = fills(&read, &reply);
            assert_eq!(got.len(), 1, "{:?}", String::from_utf8_lossy(bytes));
            let (key, mut fill) = got.into_iter().next().unwrap();
            assert_eq!(key, item.key);
            let shows_cas = !matches!(read.command, Command::Get);
            assert_eq!(fill.cas.is_some(), shows_cas);
            if read.command == Command::MetaGet {
                assert_eq!(fill.key_form, key_form);
                held.insert(key, fill.clone());
            }
            cas = cas.or(fill.cas);
            assert_eq!(fill.cas.or(cas), cas, "one CAS for one item");
            fill.cas = None;
            fill.key_form = KeyForm::Unknown;
            assert_eq!(fill, want, "{:?}", String::from_utf8_lossy(bytes));
        }
    }

    // Every servable form, answered from the cache, is byte for byte memcached's reply.
    let mut compared = 0;
    for (i, item) in items.iter().enumerate() {
        let other = &items[(i + 1) % items.len()];
        let other = if other.text_key() {
            &other.key[..]
        } else {
            b"plain"
        };
        for bytes in forms(item, other) {
            let read = request(&bytes);
            let (want, reply) = server.ask(&read);
            let got = serve(&read, &held);
            assert!(
                got == want,
                "{:?}\nmemcached: {:?}\ncache:     {:?}",
                String::from_utf8_lossy(&bytes),
                String::from_utf8_lossy(&want[..want.len().min(300)]),
                String::from_utf8_lossy(&got[..got.len().min(300)]),
            );
            // And memcached's reply fills the cache with the same items.
            for (key, fill) in fills(&read, &reply) {
                let known = &held[&key];
                assert_eq!(fill.flags, known.flags);
                assert_eq!(fill.data, known.data);
                assert!(fill.cas.is_none() || fill.cas == known.cas);
                assert!(fill.key_form == KeyForm::Unknown || fill.key_form == known.key_form);
            }
            compared += 1;
        }
    }
    assert!(compared > 3000, "{compared} forms compared");
}
