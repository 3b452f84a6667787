//! Merging the `stats` replies of several memcached servers into the one reply a proxy gives, so
//! that an operator reads the numbers of the whole pool as if it were one memcached.
//!
//! The rules, for text `STAT <name> <value>` lines and binary `STAT` packets alike:
//!
//! - Fields keep the order of the first reply; fields that only other replies have follow, in
//!   the order they first appear. A field that only one server reports is passed unchanged.
//! - Numbers are summed: integers exactly, decimals (`rusage_user 0.123456`) printed with six
//!   decimals as memcached prints them. State flags thus become counts: `accepting_conns 3`
//!   means three servers accept connections.
//! - Ages are the oldest on any server: `age`, `age_hot`, `age_warm`, `evicted_time` (of
//!   `stats items`).
//! - Fields that describe one process rather than a total come from the first server that has
//!   them: `pid`, `uptime`, `time`, `version`, `libevent`, `pointer_size`, `threads`,
//!   `hash_power_level`, and the slab geometry `chunk_size` and `chunks_per_page` (of
//!   `stats slabs`). So does any value that is not a number on every server.
//! - A value of several words is merged word by word (the counters of a `PREFIX` line of
//!   `stats detail dump` are summed per prefix); with different numbers of words, the first
//!   server's value is kept.
//! - `ITEM` lines (`stats cachedump`) are listed server after server; a key listed by two
//!   servers keeps the first one's line. Any other line (`RESET`, `OK`) is written once.
//! - If any reply is an error (`ERROR`, `CLIENT_ERROR ...`, `SERVER_ERROR ...`, or a binary
//!   error status), the merged reply is the first such error, alone.
//! - The merged reply ends with `END` (or the empty-key binary packet) if the first reply does:
//!   `stats sizes_enable` has no end marker.
//!
//! Names are matched on their part after the last `:`, so `items:1:age` is an age and
//! `1:chunk_size` slab geometry. These rules fit `stats`, `stats items`, `stats slabs`,
//! `stats sizes`, `stats detail dump`, `stats cachedump` and `stats reset`. They do not fit
//! `stats settings`, a configuration (its ports and factors would be summed), nor
//! `stats conns`, whose connection numbers differ per process: answer those from one server.
//!
//! This is control-plane code: it allocates, and it never panics, whatever the replies hold.

use std::collections::HashMap;
use std::io::Write;

use super::binary::{self, opcode, status};
use super::reply::is_error_line;

/// The word that starts a text stats line and names a binary stats packet.
const STAT: &[u8] = b"STAT";

/// Takes a proxy's own reads out of one server's text `stats` reply: `hits` and `misses` reads
/// the proxy made itself (its connection sentinels), which memcached counted in `cmd_get`,
/// `get_hits` and `get_misses`. Other lines are kept as they are.
pub fn discount_reads(reply: &[u8], hits: u64, misses: u64) -> Vec<u8> {
    if hits == 0 && misses == 0 {
        return reply.to_vec();
    }
    let mut out = Vec::with_capacity(reply.len());
    for line in reply.split_inclusive(|&b| b == b'\n') {
        let less = match line {
            l if l.starts_with(b"STAT cmd_get ") => hits + misses,
            l if l.starts_with(b"STAT get_hits ") => hits,
            l if l.starts_with(b"STAT get_misses ") => misses,
            _ => 0,
        };
        let value = std::str::from_utf8(line)
            .ok()
            .and_then(|l| l.trim_end().rsplit(' ').next())
            .and_then(|v| v.parse::<u64>().ok());
        match value {
            Some(v) if less > 0 => {
                let name_end = line.iter().rposition(|&b| b == b' ').unwrap_or(0);
                out.extend_from_slice(&line[..name_end]);
                let _ = write!(out, " {}\r\n", v.saturating_sub(less));
            }
            _ => out.extend_from_slice(line),
        }
    }
    out
}

/// Merges text `stats` replies (each as framed by [`super::reply::reply_len`]) into `out`.
/// Nothing is written for no replies.
pub fn merge_text(replies: &[&[u8]], out: &mut Vec<u8>) {
    if let Some(error) = replies.iter().find_map(|reply| text_error(reply)) {
        out.extend_from_slice(error);
        out.extend_from_slice(b"\r\n");
        return;
    }
    let mut fields = Fields::default();
    let mut ends = Vec::with_capacity(replies.len());
    for reply in replies {
        ends.push(read_text(reply, &mut fields));
    }
    let mut value = Vec::new();
    for field in &fields.list {
        if field.word.is_empty() {
            out.extend_from_slice(field.name);
        } else {
            value.clear();
            merge_value(field, &mut value);
            out.extend_from_slice(field.word);
            out.push(b' ');
            out.extend_from_slice(field.name);
            out.push(b' ');
            out.extend_from_slice(&value);
        }
        out.extend_from_slice(b"\r\n");
    }
    if ends.first() == Some(&true) {
        out.extend_from_slice(b"END\r\n");
    }
}

/// Merges binary `STAT` replies, each a sequence of response packets (as framed by
/// [`super::reply::reply_len`]), into one sequence with the client's `opaque`. Nothing is
/// written for no replies.
pub fn merge_binary(replies: &[&[u8]], opaque: u32, out: &mut Vec<u8>) {
    if let Some((op, status, value)) = replies.iter().find_map(|reply| binary_error(reply)) {
        binary::write_response(op, status, opaque, b"", value, out);
        return;
    }
    let mut fields = Fields::default();
    let mut ends = Vec::with_capacity(replies.len());
    for reply in replies {
        ends.push(read_binary(reply, &mut fields));
    }
    let mut value = Vec::new();
    for field in &fields.list {
        value.clear();
        merge_value(field, &mut value);
        binary::write_response(
            opcode::STAT,
            status::NO_ERROR,
            opaque,
            field.name,
            &value,
            out,
        );
    }
    if ends.first() == Some(&true) {
        binary::write_response(opcode::STAT, status::NO_ERROR, opaque, b"", b"", out);
    }
}

/// One field of the merged reply: its line's first word and name, and each server's value.
#[derive(Debug)]
struct Field<'a> {
    /// `STAT`, `ITEM` or `PREFIX`; empty for any other line, whose name is the whole line.
    word: &'a [u8],
    name: &'a [u8],
    /// In reply order; never empty.
    values: Vec<&'a [u8]>,
}

/// The fields in merged order, and where each is by word and name.
#[derive(Debug, Default)]
struct Fields<'a> {
    list: Vec<Field<'a>>,
    index: HashMap<(&'a [u8], &'a [u8]), usize>,
}

impl<'a> Fields<'a> {
    fn add(&mut self, word: &'a [u8], name: &'a [u8], value: &'a [u8]) {
        let at = *self.index.entry((word, name)).or_insert(self.list.len());
        match self.list.get_mut(at) {
            Some(field) => field.values.push(value),
            None => self.list.push(Field {
                word,
                name,
                values: vec![value],
            }),
        }
    }
}

/// The lines of a text reply, without their `\r\n`.
fn lines(reply: &[u8]) -> impl Iterator<Item = &[u8]> {
    reply
        .split(|&b| b == b'\n')
        .map(|line| line.strip_suffix(b"\r").unwrap_or(line))
}

/// The error line a text reply consists of, if it is one.
fn text_error(reply: &[u8]) -> Option<&[u8]> {
    lines(reply).next().filter(|line| is_error_line(line))
}

/// Adds the fields of a text reply; returns whether `END` ended it. Lines after `END` and empty
/// lines are ignored.
fn read_text<'a>(reply: &'a [u8], fields: &mut Fields<'a>) -> bool {
    for line in lines(reply) {
        if line == b"END" {
            return true;
        }
        if line.is_empty() {
            continue;
        }
        let mut parts = line.splitn(3, |&b| b == b' ');
        let word = parts.next().unwrap_or_default();
        match (word, parts.next()) {
            (b"STAT" | b"ITEM" | b"PREFIX", Some(name)) => {
                fields.add(word, name, parts.next().unwrap_or_default());
            }
            _ => fields.add(b"", line, b""),
        }
    }
    false
}

/// The opcode, status and value of a binary reply that is an error: its first packet has a
/// status other than success.
fn binary_error(reply: &[u8]) -> Option<(u8, u16, &[u8])> {
    let header = binary::parse_response_header(reply).ok()??;
    if header.status() == status::NO_ERROR {
        return None;
    }
    let packet = reply.get(..header.packet_len())?;
    let value = packet.get(header.key_range().1..).unwrap_or_default();
    Some((header.opcode, header.status(), value))
}

/// Adds the fields of a binary reply; returns whether the empty-key packet ended it. Reading
/// stops at the first packet that is not a whole, successful response.
fn read_binary<'a>(reply: &'a [u8], fields: &mut Fields<'a>) -> bool {
    let mut rest = reply;
    while let Ok(Some(header)) = binary::parse_response_header(rest) {
        let Some(packet) = rest.get(..header.packet_len()) else {
            break;
        };
        if header.status() != status::NO_ERROR {
            break;
        }
        if header.key_len == 0 {
            return true;
        }
        let (key_start, key_end) = header.key_range();
        let name = packet.get(key_start..key_end).unwrap_or_default();
        fields.add(STAT, name, packet.get(key_end..).unwrap_or_default());
        rest = &rest[packet.len()..];
    }
    false
}

/// How the values of one field combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    Sum,
    Max,
    First,
}

fn rule(word: &[u8], name: &[u8]) -> Rule {
    match word {
        b"STAT" => {}
        b"PREFIX" => return Rule::Sum,
        _ => return Rule::First,
    }
    let last = name.rsplit(|&b| b == b':').next().unwrap_or(name);
    match last {
        b"pid" | b"uptime" | b"time" | b"version" | b"libevent" | b"pointer_size" | b"threads"
        | b"hash_power_level" | b"chunk_size" | b"chunks_per_page" => Rule::First,
        b"age" | b"age_hot" | b"age_warm" | b"evicted_time" => Rule::Max,
        _ => Rule::Sum,
    }
}

/// Writes the merged value of `field`.
fn merge_value(field: &Field<'_>, out: &mut Vec<u8>) {
    let first = field.values.first().copied().unwrap_or_default();
    let rule = rule(field.word, field.name);
    if field.values.len() == 1 || rule == Rule::First {
        out.extend_from_slice(first);
        return;
    }
    let words = |value: &'_ [u8]| value.split(|&b| b == b' ').count();
    let count = words(first);
    if field.values.iter().any(|value| words(value) != count) {
        out.extend_from_slice(first);
        return;
    }
    let mut columns: Vec<_> = field
        .values
        .iter()
        .map(|value| value.split(|&b| b == b' '))
        .collect();
    for i in 0..count {
        if i > 0 {
            out.push(b' ');
        }
        let column: Vec<&[u8]> = columns.iter_mut().filter_map(Iterator::next).collect();
        merge_word(rule, &column, out);
    }
}

/// A number as memcached prints one: an integer, or a decimal with digits on both sides.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Number {
    Int(i128),
    Decimal(f64),
}

fn number(word: &[u8]) -> Option<Number> {
    let digits = word.strip_prefix(b"-").unwrap_or(word);
    let all_digits = |part: &[u8]| !part.is_empty() && part.iter().all(u8::is_ascii_digit);
    let text = std::str::from_utf8(word).ok()?;
    match digits.iter().position(|&b| b == b'.') {
        None if all_digits(digits) => text.parse().ok().map(Number::Int),
        Some(dot) if all_digits(&digits[..dot]) && all_digits(&digits[dot + 1..]) => {
            text.parse().ok().map(Number::Decimal)
        }
        _ => None,
    }
}

/// Writes the merge of one word of each server's value: summed or the largest if every one is
/// a number, else the first.
fn merge_word(rule: Rule, column: &[&[u8]], out: &mut Vec<u8>) {
    let first = column.first().copied().unwrap_or_default();
    let numbers: Option<Vec<Number>> = column.iter().map(|word| number(word)).collect();
    let Some(numbers) = numbers else {
        out.extend_from_slice(first);
        return;
    };
    let ints: Option<Vec<i128>> = numbers
        .iter()
        .map(|n| match n {
            Number::Int(i) => Some(*i),
            Number::Decimal(_) => None,
        })
        .collect();
    let written = match ints {
        Some(ints) => {
            let merged = match rule {
                Rule::Max => ints.into_iter().max(),
                _ => ints.into_iter().try_fold(0i128, i128::checked_add),
            };
            merged.map(|n| write!(out, "{n}"))
        }
        None => {
            let decimals = numbers.iter().map(|n| match *n {
                Number::Int(i) => i as f64,
                Number::Decimal(d) => d,
            });
            let merged = match rule {
                Rule::Max => decimals.fold(f64::MIN, f64::max),
                _ => decimals.sum(),
            };
            Some(write!(out, "{merged:.6}"))
        }
    };
    if !matches!(written, Some(Ok(()))) {
        out.extend_from_slice(first);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discounting_reads_touches_only_the_read_counters() {
        let reply = b"STAT pid 7\r\nSTAT cmd_get 10\r\nSTAT get_hits 4\r\nSTAT get_misses 6\r\nSTAT get_expired 0\r\nEND\r\n";
        assert_eq!(
            discount_reads(reply, 1, 2),
            b"STAT pid 7\r\nSTAT cmd_get 7\r\nSTAT get_hits 3\r\nSTAT get_misses 4\r\nSTAT get_expired 0\r\nEND\r\n"
        );
        assert_eq!(discount_reads(reply, 0, 0), reply);
        assert_eq!(
            discount_reads(b"STAT get_misses 1\r\n", 0, 5),
            b"STAT get_misses 0\r\n"
        );
        assert_eq!(discount_reads(b"ERROR\r\n", 1, 1), b"ERROR\r\n");
    }
    use crate::memcache::binary::Header;
    use crate::memcache::fixtures::*;
    use crate::memcache::reply::{reply_len, ReplyKind};

    fn text(replies: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        merge_text(replies, &mut out);
        out
    }

    fn binary(replies: &[&[u8]], opaque: u32) -> Vec<u8> {
        let mut out = Vec::new();
        merge_binary(replies, opaque, &mut out);
        out
    }

    /// The `STAT` lines of a text reply as (name, value).
    fn stats(reply: &[u8]) -> Vec<(String, String)> {
        String::from_utf8_lossy(reply)
            .lines()
            .filter_map(|line| line.strip_prefix("STAT "))
            .filter_map(|stat| stat.split_once(' '))
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect()
    }

    fn stat(reply: &[u8], name: &str) -> String {
        let found = stats(reply).into_iter().find(|(n, _)| n == name);
        found.map(|(_, value)| value).unwrap_or_default()
    }

    /// The packets of a binary reply as (opaque, key, value), checking that each is a
    /// successful `STAT` response.
    fn packets(reply: &[u8]) -> Vec<(u32, Vec<u8>, Vec<u8>)> {
        let mut out = Vec::new();
        let mut rest = reply;
        while let Some(header) = Header::decode(rest) {
            assert_eq!((header.opcode, header.status()), (opcode::STAT, 0));
            let packet = &rest[..header.packet_len()];
            let (start, end) = header.key_range();
            out.push((
                header.opaque,
                packet[start..end].to_vec(),
                packet[end..].to_vec(),
            ));
            rest = &rest[packet.len()..];
        }
        assert!(rest.is_empty());
        out
    }

    #[test]
    fn one_reply_is_passed_unchanged() {
        for reply in [
            STATS_A,
            STATS_SETTINGS,
            STATS_ITEMS_A,
            STATS_SLABS_A,
            STATS_DETAIL_DUMP,
            STATS_CACHEDUMP,
            STATS_SIZES,
            STATS_CONNS,
            b"RESET\r\n",
            b"STAT sizes_status enabled\r\n",
            b"END\r\n",
        ] {
            assert_eq!(text(&[reply]), reply, "{}", String::from_utf8_lossy(reply));
        }
        for (reply, opaque) in [
            (BIN_STATS_A, 0x11),
            (BIN_STATS_ITEMS, 0x33),
            (BIN_STATS_DETAIL_DUMP, 0x44),
            (BIN_STATS_BOGUS, 0x55),
            (BIN_STATS_RESET, 0x66),
        ] {
            assert_eq!(binary(&[reply], opaque), reply);
        }
        assert!(text(&[]).is_empty() && binary(&[], 1).is_empty());
    }

    #[test]
    fn general_stats_of_two_servers() {
        let merged = text(&[STATS_A, STATS_B]);
        let (a, b) = (stats(STATS_A), stats(STATS_B));
        let merged_stats = stats(&merged);
        // Both captured from memcached 1.6.18: the same fields, in the same order.
        let names = |stats: &[(String, String)]| -> Vec<String> {
            stats.iter().map(|(name, _)| name.clone()).collect()
        };
        assert_eq!(names(&merged_stats), names(&a));
        assert_eq!(names(&merged_stats), names(&b));
        assert!(merged.ends_with(b"\r\nEND\r\n"));
        for name in [
            "pid",
            "uptime",
            "time",
            "version",
            "libevent",
            "pointer_size",
            "threads",
            "hash_power_level",
        ] {
            assert_eq!(stat(&merged, name), stat(STATS_A, name), "{name}");
        }
        for name in [
            "curr_items",
            "total_items",
            "cmd_get",
            "get_hits",
            "get_misses",
            "cmd_set",
            "bytes",
            "limit_maxbytes",
            "curr_connections",
            "total_connections",
            "bytes_read",
        ] {
            let sum: u64 = [STATS_A, STATS_B]
                .iter()
                .map(|reply| stat(reply, name).parse::<u64>().unwrap())
                .sum();
            assert_eq!(stat(&merged, name), sum.to_string(), "{name}");
        }
        let seconds = |reply: &[u8]| stat(reply, "rusage_user").parse::<f64>().unwrap();
        let rusage = format!("{:.6}", seconds(STATS_A) + seconds(STATS_B));
        assert_eq!(stat(&merged, "rusage_user"), rusage);
        // The numbers of the captures, spelled out.
        assert_eq!(stat(&merged, "curr_items"), "10");
        assert_eq!(stat(&merged, "total_items"), "11");
        assert_eq!(stat(&merged, "pid"), "24710");
        assert_eq!(stat(&merged, "rusage_user"), "0.019284");
        assert_eq!(stat(&merged, "accepting_conns"), "2");
        assert_eq!(stat(&merged, "version"), "1.6.18");
        assert_eq!(reply_len(ReplyKind::Stats, &merged), Ok(Some(merged.len())));
    }

    #[test]
    fn slab_and_item_stats_of_two_servers() {
        // A has items in slab classes 1 and 17, B in class 4.
        let merged = text(&[STATS_SLABS_A, STATS_SLABS_B]);
        assert_eq!(stat(&merged, "active_slabs"), "3");
        assert_eq!(stat(&merged, "total_malloced"), "3145728");
        assert_eq!(stat(&merged, "4:chunk_size"), "192");
        assert_eq!(stat(&merged, "1:chunk_size"), "96");
        // Fields only B has come after all of A's.
        let names: Vec<String> = stats(&merged).into_iter().map(|(n, _)| n).collect();
        let totals = names.iter().position(|n| n == "total_malloced").unwrap();
        assert!(names[totals + 1..].iter().all(|n| n.starts_with("4:")));
        assert_eq!(names.len(), stats(STATS_SLABS_A).len() + 15);

        let merged = text(&[STATS_ITEMS_A, STATS_ITEMS_B]);
        assert_eq!(stat(&merged, "items:1:number"), "4");
        assert_eq!(stat(&merged, "items:4:number"), "5");
        let same_class = b"STAT items:1:number 2\r\nSTAT items:1:age 900\r\n\
STAT items:1:evicted_time 5\r\nSTAT items:1:mem_requested 100\r\nEND\r\n";
        let merged = text(&[STATS_ITEMS_A, same_class]);
        assert_eq!(stat(&merged, "items:1:number"), "6");
        assert_eq!(stat(&merged, "items:1:age"), "900");
        assert_eq!(stat(&merged, "items:1:evicted_time"), "5");
        assert_eq!(stat(&merged, "items:1:mem_requested"), "384");
        let merged = text(&[STATS_SIZES, b"STAT 96 1\r\nSTAT 192 5\r\nEND\r\n"]);
        assert_eq!(merged, b"STAT 96 5\r\nSTAT 3072 1\r\nSTAT 192 5\r\nEND\r\n");
    }

    #[test]
    fn prefixes_items_and_one_line_replies() {
        let other = b"PREFIX user get 1 hit 0 set 2 del 0\r\n\
PREFIX other get 5 hit 5 set 5 del 5\r\nEND\r\n";
        assert_eq!(
            text(&[STATS_DETAIL_DUMP, other]),
            b"PREFIX user get 4 hit 3 set 5 del 1\r\n\
PREFIX session get 1 hit 1 set 1 del 0\r\n\
PREFIX other get 5 hit 5 set 5 del 5\r\nEND\r\n"
        );
        let other = b"ITEM other:1 [100 b; 0 s]\r\nITEM user:1 [9 b; 9 s]\r\nEND\r\n";
        assert_eq!(
            text(&[STATS_CACHEDUMP, other]),
            b"ITEM counter [2 b; 0 s]\r\nITEM user:2 [5 b; 0 s]\r\n\
ITEM user:1 [5 b; 0 s]\r\nITEM other:1 [100 b; 0 s]\r\nEND\r\n"
        );
        assert_eq!(text(&[b"END\r\n", STATS_CACHEDUMP]), STATS_CACHEDUMP);
        assert_eq!(text(&[b"RESET\r\n", b"RESET\r\n"]), b"RESET\r\n");
        let enabled = b"STAT sizes_status enabled\r\n";
        assert_eq!(text(&[enabled, enabled]), enabled);
    }

    #[test]
    fn an_error_replaces_the_merge() {
        let merged = text(&[
            STATS_A,
            b"SERVER_ERROR out of memory writing stats\r\n",
            b"ERROR\r\n",
        ]);
        assert_eq!(merged, b"SERVER_ERROR out of memory writing stats\r\n");
        assert_eq!(text(&[b"ERROR\r\n", STATS_A]), b"ERROR\r\n");
        let merged = binary(&[BIN_STATS_A, BIN_STATS_BOGUS], 9);
        let mut expected = Vec::new();
        binary::write_error(opcode::STAT, status::KEY_NOT_FOUND, 9, &mut expected);
        assert_eq!(merged, expected);
    }

    #[test]
    fn binary_stats_of_two_servers() {
        let merged = binary(&[BIN_STATS_A, BIN_STATS_B], 0x99);
        assert_eq!(
            reply_len(ReplyKind::BinaryStats, &merged),
            Ok(Some(merged.len()))
        );
        let (a, b) = (packets(BIN_STATS_A), packets(BIN_STATS_B));
        let merged = packets(&merged);
        assert!(merged.iter().all(|(opaque, _, _)| *opaque == 0x99));
        assert_eq!(merged.len(), a.len());
        let value = |packets: &[(u32, Vec<u8>, Vec<u8>)], key: &[u8]| {
            let found = packets.iter().find(|(_, k, _)| k == key);
            String::from_utf8_lossy(&found.unwrap().2).into_owned()
        };
        assert_eq!(value(&merged, b"pid"), value(&a, b"pid"));
        assert_eq!(value(&merged, b"version"), "1.6.18");
        assert_eq!(value(&merged, b"curr_items"), "10");
        assert_eq!(value(&merged, b"accepting_conns"), "2");
        let cmd_get: u64 = [&a, &b]
            .iter()
            .map(|p| value(p, b"cmd_get").parse::<u64>().unwrap())
            .sum();
        assert_eq!(value(&merged, b"cmd_get"), cmd_get.to_string());
        let (_, last_key, last_value) = merged.last().unwrap();
        assert!(last_key.is_empty() && last_value.is_empty());
    }

    #[test]
    fn values() {
        let table: &[(&[u8], &[u8], &[u8])] = &[
            // Integers, decimals and a mix of both.
            (b"STAT a 1\r\n", b"STAT a 2\r\n", b"STAT a 3\r\n"),
            (b"STAT a -1\r\n", b"STAT a 2\r\n", b"STAT a 1\r\n"),
            (
                b"STAT a 0.5\r\n",
                b"STAT a 0.25\r\n",
                b"STAT a 0.750000\r\n",
            ),
            (b"STAT a 1\r\n", b"STAT a 0.5\r\n", b"STAT a 1.500000\r\n"),
            // Beyond 64 bits, and beyond 128 bits, where the first value is kept.
            (
                b"STAT a 18446744073709551615\r\n",
                b"STAT a 1\r\n",
                b"STAT a 18446744073709551616\r\n",
            ),
            (
                b"STAT a 99999999999999999999999999999999999999\r\n",
                b"STAT a 99999999999999999999999999999999999999\r\n",
                b"STAT a 99999999999999999999999999999999999999\r\n",
            ),
            // Not numbers on every server: the first.
            (b"STAT a on\r\n", b"STAT a off\r\n", b"STAT a on\r\n"),
            (b"STAT a 1\r\n", b"STAT a x\r\n", b"STAT a 1\r\n"),
            (b"STAT a 1.\r\n", b"STAT a 1\r\n", b"STAT a 1.\r\n"),
            (b"STAT a +1\r\n", b"STAT a 1\r\n", b"STAT a +1\r\n"),
            (
                b"STAT a 1.6.18\r\n",
                b"STAT a 1.6.19\r\n",
                b"STAT a 1.6.18\r\n",
            ),
            // Word by word, or the first with different numbers of words.
            (
                b"STAT a 1 x 2\r\n",
                b"STAT a 3 x 4\r\n",
                b"STAT a 4 x 6\r\n",
            ),
            (b"STAT a 1 2\r\n", b"STAT a 3\r\n", b"STAT a 1 2\r\n"),
            (b"STAT a \r\n", b"STAT a \r\n", b"STAT a \r\n"),
            // Ages and per-process fields.
            (
                b"STAT x:age 5\r\n",
                b"STAT x:age 7\r\n",
                b"STAT x:age 7\r\n",
            ),
            (
                b"STAT age 0.5\r\n",
                b"STAT age 7\r\n",
                b"STAT age 7.000000\r\n",
            ),
            (
                b"STAT uptime 5\r\n",
                b"STAT uptime 7\r\n",
                b"STAT uptime 5\r\n",
            ),
            (
                b"STAT 3:chunk_size 5\r\n",
                b"STAT 3:chunk_size 5\r\n",
                b"STAT 3:chunk_size 5\r\n",
            ),
        ];
        for &(a, b, merged) in table {
            assert_eq!(
                text(&[a, b]),
                merged,
                "{:?} + {:?}",
                String::from_utf8_lossy(a),
                String::from_utf8_lossy(b)
            );
        }
    }

    #[test]
    fn junk_never_panics() {
        let seeds: &[&[u8]] = &[
            STATS_A,
            STATS_DETAIL_DUMP,
            BIN_STATS_A,
            BIN_STATS_DETAIL_DUMP,
            BIN_STATS_BOGUS,
        ];
        let mut state = 0x5eed_u64;
        let mut next = move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as usize
        };
        for _ in 0..2000 {
            let mut a = seeds[next() % seeds.len()].to_vec();
            let mut b = seeds[next() % seeds.len()].to_vec();
            for buf in [&mut a, &mut b] {
                for _ in 0..1 + next() % 4 {
                    let at = next() % buf.len();
                    match next() % 3 {
                        0 => buf[at] = next() as u8,
                        1 => buf.truncate(at),
                        _ => {
                            let bytes = b" :.\r\n\x81-0";
                            buf.insert(at, bytes[next() % bytes.len()]);
                        }
                    }
                    if buf.is_empty() {
                        buf.push(0x81);
                    }
                }
            }
            let mut out = Vec::new();
            merge_text(&[&a, &b], &mut out);
            merge_binary(&[&a, &b], 1, &mut out);
        }
    }
}
