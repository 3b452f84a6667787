use super::binary::{self, opcode, Header};
use super::reply::{self, parse_retrieval_reply, write_retrieval_request, ReplyError};
use super::*;

fn ok(buf: &[u8]) -> Request<'_> {
    match parse(buf) {
        Ok(Some(request)) => request,
        other => panic!("{:?}: {other:?}", String::from_utf8_lossy(buf)),
    }
}

fn err(buf: &[u8]) -> Error {
    match parse(buf) {
        Err(e) => e,
        other => panic!("{:?}: {other:?}", String::from_utf8_lossy(buf)),
    }
}

fn keys<'a>(request: &Request<'a>) -> Vec<&'a [u8]> {
    request.keys().collect()
}

/// Every strict prefix of `buf` is incomplete, or fails as `buf` itself fails.
fn check_prefixes(buf: &[u8]) {
    let whole = parse(buf).map(|r| r.map(|r| r.len));
    for n in 0..buf.len() {
        match parse(&buf[..n]) {
            Ok(None) => {}
            Err(e) if whole == Err(e) => {}
            other => panic!("prefix {n} of {buf:?}: {other:?}, whole {whole:?}"),
        }
    }
}

/// A binary request with the given parts and opaque 0xdeadbeef.
fn bin(op: u8, extras: &[u8], key: &[u8], value: &[u8]) -> Vec<u8> {
    let body = extras.len() + key.len() + value.len();
    let mut out = vec![0x80, op];
    out.extend_from_slice(&(key.len() as u16).to_be_bytes());
    out.push(extras.len() as u8);
    out.extend_from_slice(&[0, 0, 0]);
    out.extend_from_slice(&(body as u32).to_be_bytes());
    out.extend_from_slice(&0xdead_beef_u32.to_be_bytes());
    out.extend_from_slice(&[0; 8]);
    out.extend_from_slice(extras);
    out.extend_from_slice(key);
    out.extend_from_slice(value);
    out
}

#[test]
fn text_retrieval() {
    let r = ok(b"get foo\r\n");
    assert_eq!(
        (r.protocol, r.command, r.len),
        (Protocol::Text, Command::Get, 9)
    );
    assert_eq!(
        (r.key(), r.key_count(), r.noreply()),
        (Some(&b"foo"[..]), 1, false)
    );
    assert_eq!(r.exptime_token(), None);

    let r = ok(b"gets a bb ccc\r\nrest");
    assert_eq!((r.command, r.len, r.key_count()), (Command::Gets, 15, 3));
    assert_eq!(keys(&r), [&b"a"[..], b"bb", b"ccc"]);
    assert_eq!(r.bytes(), b"gets a bb ccc\r\n");

    let r = ok(b"  get  a   b \r\n");
    assert_eq!(keys(&r), [&b"a"[..], b"b"]);

    let r = ok(b"get a\n");
    assert_eq!((r.len, r.key()), (6, Some(&b"a"[..])));

    let r = ok(b"gat 10 a b\r\n");
    assert_eq!((r.command, r.key_count()), (Command::Gat, 2));
    assert_eq!(r.exptime_token(), Some(&b"10"[..]));
    assert_eq!(keys(&r), [&b"a"[..], b"b"]);

    let r = ok(b"gats -1 k\r\n");
    assert_eq!(
        (r.command, r.exptime_token()),
        (Command::Gats, Some(&b"-1"[..]))
    );

    // memcached answers a keyless gat with END.
    let r = ok(b"gat 10\r\n");
    assert_eq!((r.key_count(), r.key()), (0, None));

    assert_eq!(err(b"get\r\n"), Error::WrongArgCount);
    assert_eq!(err(b"get \r\n"), Error::WrongArgCount);
    assert_eq!(err(b"gets\r\n"), Error::WrongArgCount);
    assert_eq!(err(b"gat\r\n"), Error::WrongArgCount);
    assert_eq!(err(b"gat x a\r\n"), Error::BadExptime);
}

#[test]
fn text_storage() {
    for (buf, command) in [
        (&b"set k 0 0 3\r\nabc\r\n"[..], Command::Set),
        (b"add k 5 100 3\r\nabc\r\n", Command::Add),
        (b"replace k 0 -1 3\r\nabc\r\n", Command::Replace),
        (b"append k 0 0 3\r\nabc\r\n", Command::Append),
        (b"prepend k 0 0 3\r\nabc\r\n", Command::Prepend),
        (b"cas k 0 0 3 77\r\nabc\r\n", Command::Cas),
    ] {
        let r = ok(buf);
        assert_eq!((r.command, r.len, r.noreply()), (command, buf.len(), false));
        assert_eq!((r.key(), r.data()), (Some(&b"k"[..]), Some(&b"abc"[..])));
        assert!(command.is_write() && command.has_key() && !command.is_retrieval());
    }
    let r = ok(b"set k 0 0 3 noreply\r\nabc\r\nget k\r\n");
    assert_eq!((r.len, r.noreply()), (26, true));
    let r = ok(b"cas k 0 0 3 77 noreply\r\nabc\r\n");
    assert!(r.noreply());
    // memcached ignores a last token other than noreply.
    assert!(!ok(b"set k 0 0 3 foo\r\nabc\r\n").noreply());
    // The data block may hold anything, line ends included; a bare \n ends the line.
    let r = ok(b"set k 0 0 4\r\n\r\n\r\n\r\n");
    assert_eq!((r.len, r.data()), (19, Some(&b"\r\n\r\n"[..])));
    assert_eq!(ok(b"set k 0 0 0\n\r\n").len, 14);
    assert_eq!(ok(b"set k 0 0 +3\r\nabc\r\n").data(), Some(&b"abc"[..]));

    assert_eq!(parse(b"set k 0 0 3\r\nab"), Ok(None));
    assert_eq!(parse(b"set k 0 0 3\r\nabc\n"), Ok(None));
    assert_eq!(parse(b"set k 0 0 2147483645\r\n"), Ok(None));
    assert_eq!(err(b"set k 0 0 3\r\nabcd\r\n"), Error::BadDataChunk);
    assert_eq!(err(b"set k 0 0 3\r\nabc\nX"), Error::BadDataChunk);
    assert_eq!(err(b"set k 0 0 2147483646\r\n"), Error::BadFormat);
    assert_eq!(err(b"set k 0 0 -1\r\n"), Error::BadFormat);
    assert_eq!(err(b"set k 0 0 abc\r\n"), Error::BadFormat);
    assert_eq!(err(b"set k x 0 3\r\nabc\r\n"), Error::BadFormat);
    assert_eq!(err(b"set k -1 0 3\r\nabc\r\n"), Error::BadFormat);
    assert_eq!(err(b"set k 0 x 3\r\nabc\r\n"), Error::BadFormat);
    assert_eq!(err(b"cas k 0 0 3 -1\r\nabc\r\n"), Error::BadFormat);
    assert_eq!(err(b"set k 0 0\r\n"), Error::WrongArgCount);
    assert_eq!(err(b"cas k 0 0 3\r\nabc\r\n"), Error::WrongArgCount);
    assert_eq!(err(b"set k 0 0 3 noreply x\r\n"), Error::WrongArgCount);
}

#[test]
fn text_keyed() {
    for (buf, command, noreply) in [
        (&b"delete k\r\n"[..], Command::Delete, false),
        (b"delete k 0\r\n", Command::Delete, false),
        (b"delete k noreply\r\n", Command::Delete, true),
        (b"delete k 0 noreply\r\n", Command::Delete, true),
        (b"incr k 1\r\n", Command::Incr, false),
        (
            b"decr k 18446744073709551615 noreply\r\n",
            Command::Decr,
            true,
        ),
        (b"incr k 1 x\r\n", Command::Incr, false),
        (b"touch k 10\r\n", Command::Touch, false),
        (b"touch k -1 noreply\r\n", Command::Touch, true),
    ] {
        let r = ok(buf);
        assert_eq!(
            (r.command, r.len, r.noreply()),
            (command, buf.len(), noreply)
        );
        assert_eq!(
            (r.key(), r.key_count(), r.data()),
            (Some(&b"k"[..]), 1, None)
        );
    }
    assert_eq!(err(b"delete\r\n"), Error::WrongArgCount);
    assert_eq!(err(b"delete k 1\r\n"), Error::BadDelete);
    assert_eq!(err(b"delete k 00\r\n"), Error::BadDelete);
    assert_eq!(err(b"delete k noreply x\r\n"), Error::BadDelete);
    assert_eq!(err(b"delete k 0 noreply x\r\n"), Error::WrongArgCount);
    assert_eq!(err(b"incr k\r\n"), Error::WrongArgCount);
    assert_eq!(err(b"incr k -1\r\n"), Error::BadDelta);
    assert_eq!(err(b"decr k x\r\n"), Error::BadDelta);
    assert_eq!(err(b"touch k\r\n"), Error::WrongArgCount);
    assert_eq!(err(b"touch k x\r\n"), Error::BadExptime);
}

#[test]
fn text_keyless() {
    for (buf, command, noreply) in [
        (&b"version\r\n"[..], Command::Version, false),
        (b"stats\r\n", Command::Stats, false),
        (b"stats items\r\n", Command::Stats, false),
        (b"flush_all\r\n", Command::FlushAll, false),
        (b"flush_all 10\r\n", Command::FlushAll, false),
        (b"flush_all noreply\r\n", Command::FlushAll, true),
        (b"flush_all 0 noreply\r\n", Command::FlushAll, true),
        (b"verbosity 1\r\n", Command::Verbosity, false),
        (b"verbosity 1 noreply\r\n", Command::Verbosity, true),
        (b"quit\r\n", Command::Quit, false),
        (b"shutdown graceful\r\n", Command::Shutdown, false),
        (b"lru_crawler metadump all\r\n", Command::Misc, false),
        (b"watch\r\n", Command::Misc, false),
        (b"cache_memlimit 100\r\n", Command::Misc, false),
    ] {
        let r = ok(buf);
        assert_eq!(
            (r.command, r.len, r.noreply()),
            (command, buf.len(), noreply)
        );
        assert_eq!((r.key(), r.key_count()), (None, 0));
        assert!(!command.has_key());
    }
    assert_eq!(err(b"verbosity\r\n"), Error::WrongArgCount);
    assert_eq!(err(b"flush_all x\r\n"), Error::BadExptime);
    assert_eq!(err(b"flush_all 1 2 3\r\n"), Error::WrongArgCount);
    // Checked against memcached 1.6.18: noreply counts only as the last token, and the level of
    // verbosity must be a number.
    assert_eq!(err(b"flush_all noreply x\r\n"), Error::BadExptime);
    assert!(!ok(b"flush_all 5 x\r\n").noreply());
    assert_eq!(err(b"verbosity x\r\n"), Error::BadFormat);
    assert_eq!(err(b"verbosity noreply\r\n"), Error::BadFormat);
    assert_eq!(err(b"verbosity 1 2 3\r\n"), Error::WrongArgCount);
    assert!(!ok(b"verbosity 1 x\r\n").noreply());
    for unknown in [
        &b"foo\r\n"[..],
        b"GET a\r\n",
        b"\r\n",
        b"\n",
        b"   \r\n",
        b"mz a\r\n",
    ] {
        assert_eq!(err(unknown), Error::UnknownCommand, "{unknown:?}");
    }
}

#[test]
fn meta() {
    let r = ok(b"mg foo v f t\r\n");
    assert_eq!(
        (r.protocol, r.command, r.len),
        (Protocol::Meta, Command::MetaGet, 14)
    );
    assert_eq!(
        (r.key(), r.noreply(), r.base64_key()),
        (Some(&b"foo"[..]), false, false)
    );
    assert!(ok(b"mg foo v q\r\n").noreply());
    assert_eq!(ok(b"mg  foo\r\n").key(), Some(&b"foo"[..]));

    let r = ok(b"mg YWJj b v\r\n");
    assert_eq!((r.key(), r.base64_key()), (Some(&b"YWJj"[..]), true));
    assert_eq!(err(b"mg !!!! b v\r\n"), Error::BadBase64Key);
    assert_eq!(err(b"mg YWJ b\r\n"), Error::BadBase64Key);

    let r = ok(b"ms foo 3 T0 q\r\nabc\r\nmn\r\n");
    assert_eq!(
        (r.command, r.len, r.noreply()),
        (Command::MetaSet, 20, true)
    );
    assert_eq!((r.key(), r.data()), (Some(&b"foo"[..]), Some(&b"abc"[..])));
    assert_eq!(ok(b"ms foo 0\r\n\r\n").data(), Some(&b""[..]));
    assert_eq!(parse(b"ms foo 3\r\nab"), Ok(None));
    assert_eq!(err(b"ms foo 3\r\nabcd\r\n"), Error::BadDataChunk);
    assert_eq!(err(b"ms foo\r\nabc\r\n"), Error::BadFormat);
    assert_eq!(err(b"ms foo -1\r\n"), Error::BadFormat);
    assert_eq!(err(b"ms foo S3\r\nabc\r\n"), Error::BadFormat);
    assert_eq!(err(b"ms\r\n"), Error::WrongArgCount);

    for (buf, command, noreply) in [
        (&b"md foo q\r\n"[..], Command::MetaDelete, true),
        (b"md foo I T30\r\n", Command::MetaDelete, false),
        (b"ma foo N0 J13 D1 MI\r\n", Command::MetaArithmetic, false),
        (b"ma foo q\r\n", Command::MetaArithmetic, true),
        (b"me foo\r\n", Command::MetaDebug, false),
    ] {
        let r = ok(buf);
        assert_eq!(
            (r.command, r.len, r.noreply()),
            (command, buf.len(), noreply)
        );
        assert_eq!(r.key(), Some(&b"foo"[..]));
    }
    let r = ok(b"mn\r\n");
    assert_eq!((r.command, r.key(), r.len), (Command::MetaNoop, None, 4));

    assert_eq!(err(b"mg\r\n"), Error::WrongArgCount);
    assert_eq!(err(b"md\r\n"), Error::WrongArgCount);
    assert_eq!(err(b"ma\r\n"), Error::WrongArgCount);
    assert_eq!(err(b"me\r\n"), Error::BadFormat);
    assert_eq!(ok(b"me foo x\r\n").key(), Some(&b"foo"[..]));
    assert_eq!(err(b"me foo b\r\n"), Error::BadFormat);
    assert!(ok(b"me YWJj b\r\n").base64_key());
    assert_eq!(err(b"md foo b\r\n"), Error::BadMetaFlag);
    assert_eq!(err(b"ma !!!! b\r\n"), Error::BadMetaFlag);
    assert_eq!(ok(b"md YWJj q b\r\n").key(), Some(&b"YWJj"[..]));
    // memcached accepts control characters in meta keys.
    assert_eq!(ok(b"mg a\x01\x7f v\r\n").key(), Some(&b"a\x01\x7f"[..]));
}

/// Opcode, extras, key, value, whether quiet, whether the key is an item key.
type BinaryCase<'a> = (u8, &'a [u8], &'a [u8], &'a [u8], bool, bool);

#[test]
fn binary_commands() {
    let exp = [0u8; 4];
    let set = [0u8; 8];
    let arith = [0u8; 20];
    // (opcode, extras, key, value, quiet, item key)
    let table: &[BinaryCase] = &[
        (opcode::GET, b"", b"k", b"", false, true),
        (opcode::GETQ, b"", b"k", b"", true, true),
        (opcode::GETK, b"", b"k", b"", false, true),
        (opcode::GETKQ, b"", b"k", b"", true, true),
        (opcode::SET, &set, b"k", b"value", false, true),
        (opcode::SETQ, &set, b"k", b"value", true, true),
        (opcode::ADD, &set, b"k", b"v", false, true),
        (opcode::ADDQ, &set, b"k", b"v", true, true),
        (opcode::REPLACE, &set, b"k", b"", false, true),
        (opcode::REPLACEQ, &set, b"k", b"v", true, true),
        (opcode::APPEND, b"", b"k", b"v", false, true),
        (opcode::APPENDQ, b"", b"k", b"v", true, true),
        (opcode::PREPEND, b"", b"k", b"v", false, true),
        (opcode::PREPENDQ, b"", b"k", b"v", true, true),
        (opcode::DELETE, b"", b"k", b"", false, true),
        (opcode::DELETEQ, b"", b"k", b"", true, true),
        (opcode::INCREMENT, &arith, b"k", b"", false, true),
        (opcode::INCREMENTQ, &arith, b"k", b"", true, true),
        (opcode::DECREMENT, &arith, b"k", b"", false, true),
        (opcode::DECREMENTQ, &arith, b"k", b"", true, true),
        (opcode::TOUCH, &exp, b"k", b"", false, true),
        (opcode::GAT, &exp, b"k", b"", false, true),
        (opcode::GATQ, &exp, b"k", b"", true, true),
        (opcode::GATK, &exp, b"k", b"", false, true),
        (opcode::GATKQ, &exp, b"k", b"", true, true),
        (opcode::QUIT, b"", b"", b"", false, false),
        (opcode::QUITQ, b"", b"", b"", true, false),
        (opcode::FLUSH, b"", b"", b"", false, false),
        (opcode::FLUSH, &exp, b"", b"", false, false),
        (opcode::FLUSHQ, &exp, b"", b"", true, false),
        (opcode::NOOP, b"", b"", b"", false, false),
        (opcode::VERSION, b"", b"", b"", false, false),
        (opcode::STAT, b"", b"", b"", false, false),
        (opcode::STAT, b"", b"items", b"", false, false),
        (opcode::SASL_LIST_MECHS, b"", b"", b"", false, false),
        (opcode::SASL_AUTH, b"", b"PLAIN", b"\0u\0p", false, false),
    ];
    for &(op, extras, key, value, quiet, item_key) in table {
        let mut buf = bin(op, extras, key, value);
        let len = buf.len();
        buf.extend_from_slice(&bin(opcode::NOOP, b"", b"", b""));
        let r = ok(&buf);
        assert_eq!(
            (r.protocol, r.command, r.len),
            (Protocol::Binary, Command::Binary(op), len)
        );
        assert_eq!(
            (r.noreply(), r.opaque()),
            (quiet, Some(0xdead_beef)),
            "op {op:#x}"
        );
        assert_eq!(r.key(), item_key.then_some(key), "op {op:#x}");
        assert_eq!(r.key_count(), usize::from(item_key));
        assert_eq!(r.data(), Some(value));
        assert_eq!(r.command.has_key(), item_key);
        assert_eq!(opcode::is_quiet(op), quiet);
        check_prefixes(&buf[..len]);
    }
    assert!(Command::Binary(opcode::GETKQ).is_retrieval());
    assert!(Command::Binary(opcode::GAT).is_write());
    assert!(!Command::Binary(opcode::GET).is_write());
}

#[test]
fn binary_errors() {
    for n in 0..binary::HEADER_LEN {
        assert_eq!(
            parse(&bin(opcode::GET, b"", b"k", b"")[..n]),
            Ok(None),
            "{n}"
        );
    }
    let mut bad_body = bin(opcode::GET, b"", b"key", b"");
    bad_body[11] = 2;
    assert_eq!(err(&bad_body), Error::BadBinaryHeader);
    assert_eq!(err(&bad_body[..24]), Error::BadBinaryHeader);
    assert_eq!(err(&bin(0x50, b"", b"k", b"")), Error::UnknownCommand);
    assert_eq!(err(&bin(0x1f, b"", b"k", b"")), Error::UnknownCommand);
    // memcached 1.6.18 answers VERBOSITY "Unknown command", and checks the body and the key
    // length before the opcode.
    assert_eq!(
        err(&bin(opcode::VERBOSITY, &[0; 4], b"", b"")),
        Error::UnknownCommand
    );
    let mut unknown_bad_body = bin(0x50, b"", b"key", b"");
    unknown_bad_body[11] = 2;
    assert_eq!(err(&unknown_bad_body), Error::BadBinaryHeader);
    assert_eq!(err(&bin(0x50, b"", &[b'k'; 251], b"")), Error::KeyTooLong);
    for bad_args in [
        bin(opcode::GET, &[0; 4], b"k", b""),
        bin(opcode::GET, b"", b"", b""),
        bin(opcode::GET, b"", b"k", b"v"),
        bin(opcode::SET, &[0; 4], b"k", b"v"),
        bin(opcode::VERSION, b"", b"k", b""),
        bin(opcode::INCREMENT, &[0; 8], b"k", b""),
        bin(opcode::FLUSH, &[0; 8], b"", b""),
    ] {
        assert_eq!(err(&bad_args), Error::BadBinaryArgs, "{bad_args:?}");
        check_prefixes(&bad_args);
    }
    // The magic is judged once the whole header is in, as memcached judges it.
    assert_eq!(binary::parse_request(b"\x81"), Ok(None));
    assert_eq!(binary::parse_request(&[0x81; 24]), Err(Error::BadMagic));
    let mut response = bin(opcode::GET, &[0; 4], b"", b"abc");
    response[0] = binary::RESPONSE_MAGIC;
    assert_eq!(binary::parse_request(&response), Err(Error::BadMagic));
    // memcached reads a first byte other than 0x80 as a text line, here without its end.
    assert_eq!(parse(&response), Ok(None));

    response[6..8].copy_from_slice(&binary::status::KEY_NOT_FOUND.to_be_bytes());
    let header = binary::parse_response_header(&response).unwrap().unwrap();
    assert_eq!(
        (header.opcode, header.extras_len, header.opaque),
        (opcode::GET, 4, 0xdead_beef)
    );
    assert_eq!(
        (header.status(), header.packet_len(), header.value_len()),
        (1, 31, 3)
    );
    assert_eq!(binary::parse_response_header(&response[..23]), Ok(None));
    assert_eq!(
        binary::parse_response_header(&bin(0, b"", b"", b"")),
        Err(Error::BadMagic)
    );
    assert_eq!(Header::decode(&response[..10]), None);
}

#[test]
fn key_lengths() {
    let k250 = vec![b'k'; MAX_KEY_LEN];
    let k251 = vec![b'k'; MAX_KEY_LEN + 1];
    let line = |pre: &str, key: &[u8], post: &str| {
        let mut v = pre.as_bytes().to_vec();
        v.extend_from_slice(key);
        v.extend_from_slice(post.as_bytes());
        v
    };
    let forms = [
        ("get ", "\r\n"),
        ("get a ", " b\r\n"),
        ("gat 1 ", "\r\n"),
        ("set ", " 0 0 1\r\nx\r\n"),
        ("cas ", " 0 0 1 1\r\nx\r\n"),
        ("delete ", "\r\n"),
        ("incr ", " 1\r\n"),
        ("touch ", " 1\r\n"),
        ("mg ", " v\r\n"),
        ("ms ", " 1\r\nx\r\n"),
        ("md ", "\r\n"),
        ("ma ", "\r\n"),
        ("me ", "\r\n"),
    ];
    for (pre, post) in forms {
        let good = line(pre, &k250, post);
        assert!(ok(&good).keys().any(|k| k == &k250[..]), "{pre}");
        check_prefixes(&good);
        let bad = line(pre, &k251, post);
        assert_eq!(err(&bad), Error::KeyTooLong, "{pre}");
        check_prefixes(&bad);
    }
    assert_eq!(
        ok(&bin(opcode::GET, b"", &k250, b"")).key(),
        Some(&k250[..])
    );
    assert_eq!(err(&bin(opcode::GET, b"", &k251, b"")), Error::KeyTooLong);
}

#[test]
fn control_characters_in_text_keys() {
    // memcached splits a command line at spaces only: any other byte is part of the key.
    for odd in [0x01, b'\t', 0x0b, 0x0c, b'\r', 0x1f, 0x7f] {
        let key = [b'a', odd, b'b'];
        for (pre, post) in [
            ("get ", "\r\n"),
            ("set ", " 0 0 1\r\nx\r\n"),
            ("delete ", "\r\n"),
        ] {
            let mut buf = pre.as_bytes().to_vec();
            buf.extend_from_slice(&key);
            buf.extend_from_slice(post.as_bytes());
            assert_eq!(ok(&buf).key(), Some(&key[..]), "{buf:?}");
            check_prefixes(&buf);
        }
    }
    // memcached reads a line as a C string: a NUL ends it.
    assert_eq!(
        ok(b"get a\0b c\r\n").keys().collect::<Vec<_>>(),
        [&b"a"[..]]
    );
    assert_eq!(err(b"set a\0b 0 0 1\r\nx\r\n"), Error::WrongArgCount);
    assert_eq!(err(b"ms d\0k 3 c q\r\nabc\r\n"), Error::BadFormat);
    // A \r just before the \n ends the line; one more is part of the key.
    assert_eq!(ok(b"get a\r\r\n").key(), Some(&b"a\r"[..]));
    assert_eq!(ok(b"get \x80\xff\r\n").key(), Some(&b"\x80\xff"[..]));
}

#[test]
fn line_limits() {
    // Without its end, a line past the limit fails; once complete it is read like any other.
    let mut long_set = b"set ".to_vec();
    long_set.resize(MAX_LINE_LEN + 100, b'a');
    assert_eq!(err(&long_set), Error::LineTooLong);
    long_set.extend_from_slice(b" 0 0 1\r\nx\r\n");
    assert_eq!(err(&long_set), Error::KeyTooLong);
    let mut long_bogus = vec![b'x'; MAX_LINE_LEN + 100];
    long_bogus.extend_from_slice(b"\r\n");
    assert_eq!(err(&long_bogus), Error::UnknownCommand);

    assert_eq!(parse(&[b'x'; MAX_LINE_LEN]), Ok(None));
    assert_eq!(err(&[b'x'; MAX_LINE_LEN + 1]), Error::LineTooLong);
    assert_eq!(err(&[b' '; MAX_LINE_LEN + 5]), Error::LineTooLong);

    // A line of exactly MAX_LINE_LEN bytes is accepted.
    let mut exact = b"delete ".to_vec();
    exact.resize(MAX_LINE_LEN - 200, b' ');
    exact.extend_from_slice(b"k");
    exact.resize(MAX_LINE_LEN - 2, b' ');
    exact.extend_from_slice(b"\r\n");
    assert_eq!(ok(&exact).len, MAX_LINE_LEN);
    exact.insert(0, b' ');
    assert_eq!(ok(&exact).len, MAX_LINE_LEN + 1);
    assert_eq!(parse(&exact[..MAX_LINE_LEN]), Ok(None));
    assert_eq!(
        err(&[&exact[..MAX_LINE_LEN], b" "].concat()),
        Error::LineTooLong
    );

    // `get` and `gets` may be longer, as in memcached; `gat` and `gats` may not.
    for cmd in ["gat 0", "gats 0"] {
        let mut long = cmd.as_bytes().to_vec();
        long.resize(MAX_LINE_LEN + 1, b'k');
        assert_eq!(err(&long), Error::LineTooLong);
    }
    for cmd in ["get", "gets"] {
        let mut multiget = cmd.as_bytes().to_vec();
        for i in 0..2000 {
            multiget.extend_from_slice(format!(" key{i}").as_bytes());
        }
        assert_eq!(parse(&multiget), Ok(None));
        multiget.extend_from_slice(b"\r\n");
        let r = ok(&multiget);
        assert_eq!((r.key_count(), r.keys().count()), (2000, 2000));
        assert_eq!(r.keys().last(), Some(&b"key1999"[..]));
    }
}

#[test]
fn pipelined() {
    let mut buf = Vec::new();
    buf.extend_from_slice(b"get a b\r\n");
    buf.extend_from_slice(b"set k 1 2 5 noreply\r\nhello\r\n");
    buf.extend_from_slice(&bin(opcode::GETKQ, b"", b"bk", b""));
    buf.extend_from_slice(b"mg m v\r\n");
    buf.extend_from_slice(b"ms m 2\r\nhi\r\n");
    buf.extend_from_slice(&bin(opcode::NOOP, b"", b"", b""));
    buf.extend_from_slice(b"delete d noreply\n");
    buf.extend_from_slice(b"gat 5 x y z\r\n");
    buf.extend_from_slice(b"get incompl");
    let expected = [
        (Command::Get, Some(&b"a"[..]), false),
        (Command::Set, Some(b"k"), true),
        (Command::Binary(opcode::GETKQ), Some(b"bk"), true),
        (Command::MetaGet, Some(b"m"), false),
        (Command::MetaSet, Some(b"m"), false),
        (Command::Binary(opcode::NOOP), None, false),
        (Command::Delete, Some(b"d"), true),
        (Command::Gat, Some(b"x"), false),
    ];
    let mut at = 0;
    for (command, key, noreply) in expected {
        let r = ok(&buf[at..]);
        assert_eq!((r.command, r.key(), r.noreply()), (command, key, noreply));
        assert_eq!(r.bytes(), &buf[at..at + r.len]);
        at += r.len;
    }
    assert_eq!(parse(&buf[at..]), Ok(None));
}

/// Valid and invalid requests of every form: each prefix is incomplete or fails alike.
#[test]
fn prefixes() {
    let text: &[&[u8]] = &[
        b"get a b c\r\n",
        b"gat 10 a\r\n",
        b"set k 0 0 3\r\nabc\r\n",
        b"set k 0 0 3\r\nabcd\r\n",
        b"cas k 0 0 3 9 noreply\r\nabc\r\n",
        b"delete k 0 noreply\r\n",
        b"delete k 1\r\n",
        b"incr k 5\r\n",
        b"touch k x\r\n",
        b"mg k v q\r\n",
        b"ms k 3 b\r\nabc\r\n",
        b"ms YWJj 3 b\r\nabc\r\n",
        b"ms !!!! 3 b\r\nabc\r\n",
        b"mn\r\n",
        b"bogus\r\n",
        b"set k 0 0 -1\r\n",
    ];
    for buf in text {
        check_prefixes(buf);
    }
}

/// A small linear congruential generator, so the test needs no crate and repeats exactly.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }

    fn below(&mut self, n: usize) -> usize {
        self.next() as usize % n.max(1)
    }
}

/// Checks what a successful parse promises, whatever the input.
fn check_any(buf: &[u8]) {
    if let Ok(Some(r)) = parse(buf) {
        assert!(r.len > 0 && r.len <= buf.len());
        assert_eq!(r.bytes(), &buf[..r.len]);
        assert_eq!(r.keys().count(), r.key_count());
        assert_eq!(r.key(), r.keys().next());
        for key in r.keys() {
            assert!(!key.is_empty() && key.len() <= MAX_KEY_LEN);
        }
        let _ = (r.exptime_token(), r.data(), r.opaque(), r.noreply());
    }
    if let Ok(Some((items, used))) = parse_retrieval_reply(buf) {
        assert!(used <= buf.len());
        assert_eq!(items.clone().count(), items.count_all());
    }
    let _ = binary::parse_response_header(buf);
}

#[test]
fn random_buffers_never_panic() {
    let words: &[&[u8]] = &[
        b"get ",
        b"gets ",
        b"gat ",
        b"set ",
        b"cas ",
        b"delete ",
        b"incr ",
        b"touch ",
        b"mg ",
        b"ms ",
        b"md ",
        b"ma ",
        b"mn",
        b"me ",
        b"noreply",
        b" 0",
        b" 3",
        b" -1",
        b"\r\n",
        b"\n",
        b" ",
        b"VALUE ",
        b"END\r\n",
        b"b",
        b"q",
        b"YWJj",
        b"\x80",
        b"\x81",
        b"SERVER_ERROR ",
    ];
    let mut rng = Lcg(0x6b76_7377);
    let mut buf = Vec::new();
    for _ in 0..5000 {
        buf.clear();
        let parts = rng.below(12);
        for _ in 0..parts {
            if rng.below(3) == 0 {
                for _ in 0..rng.below(8) {
                    buf.push(rng.next() as u8);
                }
            } else {
                buf.extend_from_slice(words[rng.below(words.len())]);
            }
        }
        for n in 0..=buf.len() {
            check_any(&buf[..n]);
        }
    }
    // Binary headers with random fields, and random bytes after a request magic.
    for _ in 0..5000 {
        buf.clear();
        buf.push(0x80);
        buf.push(rng.below(0x30) as u8);
        for _ in 0..rng.below(60) {
            let b = rng.next() as u8;
            buf.push(if rng.below(2) == 0 { b & 0x07 } else { b });
        }
        check_any(&buf);
    }
}

#[test]
fn mutated_requests_never_panic() {
    let seeds: Vec<Vec<u8>> = vec![
        b"get a b c\r\n".to_vec(),
        b"set k 0 0 3 noreply\r\nabc\r\n".to_vec(),
        b"gat 10 a b\r\n".to_vec(),
        b"ms k 3 T0 q b\r\nabc\r\n".to_vec(),
        b"VALUE k 0 3 7\r\nabc\r\nEND\r\n".to_vec(),
        bin(opcode::SET, &[0; 8], b"key", b"value"),
        bin(opcode::GAT, &[0; 4], b"key", b""),
    ];
    let mut rng = Lcg(42);
    for _ in 0..3000 {
        let mut buf = seeds[rng.below(seeds.len())].clone();
        for _ in 0..1 + rng.below(3) {
            let at = rng.below(buf.len());
            match rng.below(3) {
                0 => buf[at] = rng.next() as u8,
                1 => buf.insert(at, rng.next() as u8),
                _ => {
                    buf.remove(at);
                }
            }
        }
        for n in 0..=buf.len() {
            check_any(&buf[..n]);
        }
    }
}

/// memcached 1.6 replies to each error on the text protocol, as memcached 1.6.18 sends them.
#[test]
fn error_replies_match_memcached() {
    let table: &[(&[u8], Error, &[u8])] = &[
        (b"foo\r\n", Error::UnknownCommand, b"ERROR\r\n"),
        (b"get\r\n", Error::WrongArgCount, b"ERROR\r\n"),
        (b"set k 0 0\r\n", Error::WrongArgCount, b"ERROR\r\n"),
        (
            b"set k 0 0 -1\r\n",
            Error::BadFormat,
            b"CLIENT_ERROR bad command line format\r\n",
        ),
        (
            b"set k 0 0 abc\r\n",
            Error::BadFormat,
            b"CLIENT_ERROR bad command line format\r\n",
        ),
        (
            b"ms k x\r\n",
            Error::BadFormat,
            b"CLIENT_ERROR bad command line format\r\n",
        ),
        (
            b"me\r\n",
            Error::BadFormat,
            b"CLIENT_ERROR bad command line format\r\n",
        ),
        (
            b"set k 0 0 3\r\nabcd\r\n",
            Error::BadDataChunk,
            b"CLIENT_ERROR bad data chunk\r\n",
        ),
        (
            b"ms k 3\r\nabcd\r\n",
            Error::BadDataChunk,
            b"CLIENT_ERROR bad data chunk\r\n",
        ),
        (
            b"gat x k\r\n",
            Error::BadExptime,
            b"CLIENT_ERROR invalid exptime argument\r\n",
        ),
        (
            b"touch k x\r\n",
            Error::BadExptime,
            b"CLIENT_ERROR invalid exptime argument\r\n",
        ),
        (
            b"flush_all x\r\n",
            Error::BadExptime,
            b"CLIENT_ERROR invalid exptime argument\r\n",
        ),
        (
            b"incr k x\r\n",
            Error::BadDelta,
            b"CLIENT_ERROR invalid numeric delta argument\r\n",
        ),
        (
            b"delete k 1\r\n",
            Error::BadDelete,
            b"CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n",
        ),
        (
            b"mg !!!! b v\r\n",
            Error::BadBase64Key,
            b"CLIENT_ERROR error decoding key\r\n",
        ),
        // memcached closes the connection without a reply.
        (&[b'x'; 3000], Error::LineTooLong, b""),
    ];
    for &(request, error, reply) in table {
        assert_eq!(err(request), error, "{request:?}");
        assert_eq!(error.text_reply(), reply, "{error:?}");
    }
    let mut long_key = b"get ".to_vec();
    long_key.extend_from_slice(&[b'k'; 251]);
    long_key.extend_from_slice(b"\r\n");
    assert_eq!(err(&long_key), Error::KeyTooLong);
    assert_eq!(
        Error::KeyTooLong.text_reply(),
        b"CLIENT_ERROR bad command line format\r\n"
    );
    // memcached 1.6 binary statuses: 0x0004 "Invalid arguments", 0x0081 "Unknown command".
    assert_eq!(Error::BadBinaryArgs.binary_status(), 0x0004);
    assert_eq!(Error::KeyTooLong.binary_status(), 0x0004);
    assert_eq!(Error::UnknownCommand.binary_status(), 0x0081);
    assert_eq!(Error::BadBinaryHeader.binary_status(), 0x0081);
    assert!(Error::LineTooLong.closes_connection() && !Error::BadFormat.closes_connection());
}

#[test]
fn command_classes() {
    assert!(Command::Get.is_retrieval() && !Command::Get.is_write());
    assert!(Command::Gat.is_retrieval() && Command::Gat.is_write());
    assert!(Command::MetaGet.is_retrieval() && Command::MetaGet.has_key());
    assert!(Command::MetaSet.is_write() && !Command::MetaNoop.has_key());
    assert!(Command::FlushAll.is_write() && !Command::FlushAll.has_key());
    assert!(!Command::Stats.is_write() && !Command::Version.has_key());
    for name in [
        "get",
        "gats",
        "cas",
        "touch",
        "mg",
        "me",
        "flush_all",
        "shutdown",
    ] {
        let command = Command::from_name(name.as_bytes()).unwrap();
        assert_eq!(command.name(), Some(name));
    }
    assert_eq!(Command::from_name(b"GET"), None);
}

#[test]
fn retrieval_replies() {
    let buf = b"VALUE a 0 3\r\nabc\r\nVALUE bb 5 0\r\n\r\nEND\r\nVALUE";
    let (items, used) = parse_retrieval_reply(buf).unwrap().unwrap();
    assert_eq!((used, items.count_all()), (39, 2));
    assert_eq!(items.raw(), &buf[..34]);
    let items: Vec<_> = items.collect();
    assert_eq!(
        (items[0].key, items[0].flags, items[0].bytes),
        (&b"a"[..], &b"0"[..], 3)
    );
    assert_eq!(
        (items[0].raw, items[0].data(), items[0].cas),
        (&buf[..18], &b"abc"[..], None)
    );
    assert_eq!(
        (items[1].key, items[1].flags, items[1].data()),
        (&b"bb"[..], &b"5"[..], &b""[..])
    );
    for n in 0..used {
        assert!(matches!(parse_retrieval_reply(&buf[..n]), Ok(None)), "{n}");
    }

    let gets = b"VALUE k 1 4 12345\r\n\r\n\r\n\r\nEND\r\n";
    let (items, used) = parse_retrieval_reply(gets).unwrap().unwrap();
    let item = items.clone().next().unwrap();
    assert_eq!(
        (used, item.cas, item.data()),
        (gets.len(), Some(&b"12345"[..]), &b"\r\n\r\n"[..])
    );

    let (items, used) = parse_retrieval_reply(b"END\r\n").unwrap().unwrap();
    assert_eq!((items.count_all(), used), (0, 5));

    let errors = b"VALUE a 0 1\r\nx\r\nSERVER_ERROR out of memory\r\n";
    assert_eq!(
        parse_retrieval_reply(errors),
        Err(ReplyError::ErrorLine { start: 16, end: 44 })
    );
    assert_eq!(
        parse_retrieval_reply(b"ERROR\r\n"),
        Err(ReplyError::ErrorLine { start: 0, end: 7 })
    );
    assert_eq!(
        parse_retrieval_reply(b"CLIENT_ERROR bad command line format\r\n"),
        Err(ReplyError::ErrorLine { start: 0, end: 38 })
    );
    assert!(matches!(parse_retrieval_reply(b"SERVER_ERR"), Ok(None)));
    for malformed in [
        &b"STORED\r\n"[..],
        b"NOT_FOUND",
        b"VALUE a 0 1\r\nxy\r\n",
        b"VALUE a 0\r\n",
        b"VALUE a 0 x\r\n",
        b"VALUE a 0 1 2 3\r\n",
        b"END\n",
        b"VALUE a 0 1\n",
    ] {
        assert_eq!(
            parse_retrieval_reply(malformed).err(),
            Some(ReplyError::Malformed)
        );
    }
    let mut long = b"VALUE ".to_vec();
    long.resize(MAX_LINE_LEN, b'k');
    assert_eq!(
        parse_retrieval_reply(&long).err(),
        Some(ReplyError::Malformed)
    );
}

#[test]
fn building_sub_requests() {
    let request = ok(b"gats 300 a b c d\r\n");
    let mut out = Vec::new();
    let subset = request.keys().step_by(2);
    assert!(write_retrieval_request(
        request.command,
        request.exptime_token(),
        subset,
        &mut out
    ));
    assert_eq!(out, b"gats 300 a c\r\n");
    let rebuilt = ok(&out);
    assert_eq!((rebuilt.command, rebuilt.key_count()), (Command::Gats, 2));

    out.clear();
    assert!(write_retrieval_request(
        Command::Get,
        None,
        [&b"x"[..]].into_iter(),
        &mut out
    ));
    assert_eq!(out, b"get x\r\n");
    assert!(!write_retrieval_request(
        Command::Gat,
        None,
        [&b"x"[..]].into_iter(),
        &mut out
    ));
    assert!(!write_retrieval_request(
        Command::Set,
        None,
        [&b"x"[..]].into_iter(),
        &mut out
    ));
    assert_eq!(out, b"get x\r\n");

    assert_eq!(reply::line_reply_len(b"STORED\r\nEND"), Some(8));
    assert_eq!(reply::line_reply_len(b"STORED\r"), None);
}

#[test]
fn requests_that_compare_a_cas_unique_say_so() {
    let compares = |bytes: &[u8]| parse(bytes).unwrap().unwrap().compares_cas();
    assert!(compares(b"cas k 0 0 1 42\r\nx\r\n"));
    assert!(compares(b"ms k 1 T0 C42\r\nx\r\n"));
    assert!(compares(b"md k C42 q\r\n"));
    assert!(compares(b"ma k C7\r\n"));
    assert!(!compares(b"set k 0 0 1\r\nx\r\n"));
    assert!(
        !compares(b"ms k 3 T0\r\nC42\r\n"),
        "a data block is not a flag"
    );
    assert!(!compares(b"ms C 1\r\nx\r\n"), "a key is not a flag");
    assert!(!compares(b"get k\r\n"));
    // Binary SET with a cas value in its header, then without.
    let mut set = vec![0x80, 0x01, 0, 1, 8, 0, 0, 0, 0, 0, 0, 10, 0, 0, 0, 0];
    set.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 9]);
    set.extend_from_slice(&[0; 8]);
    set.extend_from_slice(b"kx");
    assert!(compares(&set));
    set[16..24].fill(0);
    assert!(!compares(&set));
}

#[test]
fn replicas_agree_or_a_failure_or_the_owner_answers() {
    use super::reply::replicas_reply;
    assert_eq!(
        replicas_reply(&[b"STORED\r\n", b"STORED\r\n"]),
        b"STORED\r\n"
    );
    assert_eq!(
        replicas_reply(&[b"STORED\r\n", b"SERVER_ERROR out of memory\r\n"]),
        b"SERVER_ERROR out of memory\r\n"
    );
    assert_eq!(
        replicas_reply(&[b"DELETED\r\n", b"NOT_FOUND\r\n"]),
        b"DELETED\r\n"
    );
    let ok = [0x81, 1, 0, 0, 0, 0, 0, 0];
    let oom = [0x81, 1, 0, 0, 0, 0, 0, 0x82];
    let exists = [0x81, 1, 0, 0, 0, 0, 0, 2];
    assert_eq!(replicas_reply(&[&ok, &oom]), oom);
    assert_eq!(replicas_reply(&[&ok, &exists]), ok);
    assert_eq!(replicas_reply(&[]), b"");
}

#[test]
fn a_head_is_read_from_the_line_before_the_data_block_arrives() {
    let r = parse_text_head(b"set k 0 0 5\r\nhel").unwrap().unwrap();
    assert_eq!(
        (r.command, r.len, r.key()),
        (Command::Set, 20, Some(&b"k"[..]))
    );
    assert_eq!(r.bytes(), b"set k 0 0 5\r\n");
    let r = parse_text_head(b"ms k 3 T0\r\n").unwrap().unwrap();
    assert_eq!((r.command, r.len), (Command::MetaSet, 16));
    let r = parse_text_head(b"get a b\r\nget c\r\n").unwrap().unwrap();
    assert_eq!((r.len, r.key_count()), (9, 2));
    assert_eq!(parse_text_head(b"get a").unwrap(), None);
    assert_eq!(parse_text_head(b"").unwrap(), None);
    assert!(parse_text_head(b"bogus\r\n").is_err());
    // The same lengths as a whole parse once everything is there.
    let whole = b"cas k 1 2 3 4 noreply\r\nabc\r\n";
    assert_eq!(
        parse_text_head(whole).unwrap().unwrap().len,
        parse_text(whole).unwrap().unwrap().len
    );
}
