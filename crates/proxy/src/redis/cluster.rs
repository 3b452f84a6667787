//! Redis Cluster pools: each worker asks the cluster for its slots (`CLUSTER SLOTS`) when it
//! starts, whenever a redirection says its map is out of date, and every 30 s, from the first
//! of the pool's servers that answers. What it learns goes into the worker's
//! [`Cluster`](crate::pool::Cluster) map; a redirection (`MOVED`, `ASK`) is followed by the
//! client's slot in the meantime, so no error reaches a client while a slot moves.

use crate::backend::ServerStream;
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::time::{sleep, timeout};
use wire::resp;

use crate::pool::PoolRt;

/// Longest wait between two askings.
const EVERY: Duration = Duration::from_secs(30);
/// Shortest: redirections during a migration ask again at most this often.
const AT_MOST_EVERY: Duration = Duration::from_millis(100);

/// Keeps the worker's slot map of `pool` (a cluster pool) up to date, for ever.
pub(crate) async fn keep_slots(pool: Rc<PoolRt>) {
    let Some(cluster) = pool.cluster() else {
        return;
    };
    loop {
        if let Err(e) = refresh(&pool).await {
            tracing::warn!(pool = %pool.stats.spec.name, "cluster slots not learned: {e}");
        }
        sleep(AT_MOST_EVERY).await;
        let _ = timeout(EVERY, cluster.wanted.notified()).await;
    }
}

/// Asks the pool's servers in turn for the cluster's slots until one answers, and learns
/// them.
async fn refresh(pool: &PoolRt) -> anyhow::Result<()> {
    let servers: Vec<(SocketAddr, String)> = pool
        .stats
        .pool
        .spec()
        .servers
        .iter()
        .map(|s| (s.addr, s.host.clone()))
        .collect();
    let mut last = anyhow::anyhow!("the pool has no server");
    for (addr, host) in servers {
        let asked = timeout(pool.stats.spec.timeout, ask(pool, addr, &host)).await;
        match asked {
            Ok(Ok(ranges)) => {
                for (slots, node) in ranges {
                    if let Some(server) = pool.server_at(node) {
                        pool.learn_slots(slots, server);
                    }
                }
                return Ok(());
            }
            Ok(Err(e)) => last = e.context(format!("{addr}")),
            Err(_) => last = anyhow::anyhow!("{addr}: no answer in time"),
        }
    }
    Err(last)
}

/// One node's `CLUSTER SLOTS`, asked of the pool's server at `addr` (its certificate checked
/// against `host`, as the pool names it): each range of slots and the address of its master.
async fn ask(
    pool: &PoolRt,
    addr: SocketAddr,
    host: &str,
) -> anyhow::Result<Vec<(std::ops::RangeInclusive<u16>, SocketAddr)>> {
    let stream = crate::backend::connect(addr, pool.source()).await?;
    let mut stream = match pool.server_tls() {
        None => ServerStream::Plain(stream),
        Some(tls) => ServerStream::Tls(Box::new(tls.connect(host, stream).await?)),
    };
    let mut request = Vec::new();
    let auth = pool
        .stats
        .spec
        .redis
        .as_ref()
        .and_then(|r| r.auth.as_deref());
    if let Some(password) = auth {
        resp::encode_command(&[&b"AUTH"[..], password.as_bytes()], &mut request);
    }
    resp::encode_command(&[&b"CLUSTER"[..], b"SLOTS"], &mut request);
    stream.write_all(&request).await?;
    let mut buf = Vec::with_capacity(4096);
    if auth.is_some() {
        // An AUTH refused shows in the answer to CLUSTER SLOTS (NOAUTH).
        crate::backend::read_reply(&mut stream, &mut buf).await?;
    }
    let slots = &crate::backend::read_reply(&mut stream, &mut buf).await?;
    anyhow::ensure!(
        !slots.starts_with(b"-"),
        "{}",
        String::from_utf8_lossy(slots).trim()
    );
    parse_slots(slots, addr.ip()).ok_or_else(|| anyhow::anyhow!("CLUSTER SLOTS unreadable"))
}

/// `CLUSTER SLOTS`'s reply: per range `[start, end, [ip, port, id, ...], replicas...]`. An empty
/// ip is the address the question went to.
fn parse_slots(
    reply: &[u8],
    asked: IpAddr,
) -> Option<Vec<(std::ops::RangeInclusive<u16>, SocketAddr)>> {
    let mut out = Vec::new();
    for range in resp::array_elements(reply)? {
        let fields = resp::array_elements(range)?;
        let start = u16::try_from(resp::integer(fields.first()?)?).ok()?;
        let end = u16::try_from(resp::integer(fields.get(1)?)?).ok()?;
        let master = resp::array_elements(fields.get(2)?)?;
        let ip = bulk_text(master.first()?)?;
        let port = u16::try_from(resp::integer(master.get(1)?)?).ok()?;
        let ip = if ip.is_empty() {
            asked
        } else {
            ip.parse().ok()?
        };
        if start <= end && (end as usize) < resp::SLOTS {
            out.push((start..=end, SocketAddr::new(ip, port)));
        }
    }
    Some(out)
}

/// The text of a bulk string reply.
fn bulk_text(reply: &[u8]) -> Option<&str> {
    let body = reply.strip_prefix(b"$")?;
    let nl = body.iter().position(|&b| b == b'\n')?;
    std::str::from_utf8(body[nl + 1..].strip_suffix(b"\r\n")?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_slots_are_read_with_their_masters() {
        let reply = b"*2\r\n\
            *3\r\n:0\r\n:5460\r\n*3\r\n$9\r\n127.0.0.1\r\n:7000\r\n$2\r\nid\r\n\
            *4\r\n:5461\r\n:16383\r\n*3\r\n$0\r\n\r\n:7001\r\n$2\r\nid\r\n\
            *3\r\n$9\r\n127.0.0.1\r\n:7002\r\n$2\r\nid\r\n";
        let asked: IpAddr = "10.0.0.9".parse().unwrap();
        assert_eq!(
            parse_slots(reply, asked),
            Some(vec![
                (0..=5460, "127.0.0.1:7000".parse().unwrap()),
                (5461..=16383, "10.0.0.9:7001".parse().unwrap()),
            ])
        );
        assert_eq!(parse_slots(b"*1\r\n:1\r\n", asked), None);
        assert_eq!(parse_slots(b"*0\r\n", asked), Some(vec![]));
    }
}
