//! One worker thread: a single-threaded runtime that accepts clients on every pool's address
//! (the kernel spreads connections over the workers, `SO_REUSEPORT`) and keeps its own
//! connections to the servers, so workers share nothing but counters.

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::watch;

use super::client;
use super::pool::PoolRt;
use super::redis;
use super::stats::{add, get, ProxyStats, Refused};
use super::tls::{ClientTls, Handshake, HANDSHAKE_LIMIT};
use super::{Limits, Settings};

/// Binds `addr` so that every worker can bind it too.
pub fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.set_reuseport(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

/// Runs one worker until `stop` turns true, on `settings` (its limits with the client
/// connection cap settled).
pub fn run(
    proxy: Arc<ProxyStats>,
    listeners: Vec<std::net::TcpListener>,
    settings: Settings,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let Settings {
        source,
        limits,
        caches,
        tls,
        server_tls,
        server_sasl,
        ..
    } = settings;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    hold_spare(&mut lock_spare());
    local.block_on(&runtime, async move {
        let limits = Rc::new(limits);
        for (index, listener) in listeners.into_iter().enumerate() {
            let listener = TcpListener::from_std(listener)?;
            let cache = caches.get(index).cloned().flatten();
            let pool = PoolRt::new(
                proxy.clone(),
                index,
                source,
                (server_tls.clone(), server_sasl.clone()),
                cache,
            );
            if pool.cluster().is_some() {
                tokio::task::spawn_local(redis::cluster::keep_slots(pool.clone()));
            }
            tokio::task::spawn_local(accept(listener, pool, limits.clone(), tls.clone()));
        }
        tokio::task::spawn_local(super::memory::give_back_memory());
        while !*stop.borrow() {
            if stop.changed().await.is_err() {
                break;
            }
        }
        Ok(())
    })
}

/// Accepts clients for ever. A connection past the process's or the pool's cap is closed at
/// once; so is one that arrives while the process is out of descriptors, accepted on the
/// spare descriptor given up for it. Either way it is counted, and the listener's backlog
/// never fills with connections no one will serve.
async fn accept(
    listener: TcpListener,
    pool: Rc<PoolRt>,
    limits: Rc<Limits>,
    tls: Option<Arc<ClientTls>>,
) {
    let cap = limits.client_connections.unwrap_or(usize::MAX) as u64;
    let pool_cap = pool.stats.client_cap.map_or(u64::MAX, |c| c as u64);
    loop {
        let accepted = std::future::poll_fn(|cx| {
            // Under the spare's lock: no worker's accept takes the descriptor another has
            // just given up to refuse a connection.
            let _spare = lock_spare();
            listener.poll_accept(cx)
        })
        .await;
        match accepted {
            Ok((stream, _)) => {
                let stats = &pool.stats;
                add(&stats.client_connections_total, 1);
                let open = pool.proxy.clients_open.fetch_add(1, Ordering::Relaxed);
                if open >= cap || get(&stats.client_connections) >= pool_cap {
                    pool.proxy.clients_open.fetch_sub(1, Ordering::Relaxed);
                    refuse(&pool, stream, Refused::Limit);
                    continue;
                }
                add(&stats.client_connections, 1);
                let requests: Option<Box<dyn client::Requests>> = match pool.stats.spec.redis {
                    Some(_) => Some(Box::new(redis::Session::new())),
                    None => None,
                };
                match &tls {
                    None => {
                        let serve = client::serve(stream, pool.clone(), limits.clone(), requests);
                        tokio::task::spawn_local(serve);
                    }
                    Some(tls) => {
                        let serve =
                            handshake(stream, tls.clone(), pool.clone(), limits.clone(), requests);
                        tokio::task::spawn_local(serve);
                    }
                }
            }
            Err(e) if is_out_of_descriptors(&e) => {
                add(&pool.stats.client_connections_total, 1);
                if !refuse_one(&listener, &pool) {
                    // No spare to give up (something else took the descriptor it had, and
                    // none is free to take it back): wait for one to be freed rather than
                    // spin.
                    tracing::warn!(pool = %pool.stats.spec.name, "accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
            }
            Err(e) => {
                tracing::warn!(pool = %pool.stats.spec.name, "accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        }
    }
}

/// The client's TLS handshake, bounded in time, then the client served; a client whose
/// handshake fails is counted and let go.
async fn handshake(
    stream: tokio::net::TcpStream,
    tls: Arc<ClientTls>,
    pool: Rc<PoolRt>,
    limits: Rc<Limits>,
    requests: Option<Box<dyn client::Requests>>,
) {
    let _ = stream.set_nodelay(true);
    let accepted = tokio::time::timeout(HANDSHAKE_LIMIT, tls.acceptor().accept(stream)).await;
    let why = match accepted {
        Ok(Ok(stream)) => {
            tls.count(Handshake::Done);
            client::serve_tls(stream, pool, limits, requests).await;
            return;
        }
        Ok(Err(e)) => (Handshake::Failed, e.to_string()),
        Err(_) => (Handshake::TimedOut, "not done in time".to_string()),
    };
    tls.count(why.0);
    let n = tls.handshakes(why.0);
    // One line per power of two, so that a flood does not flood the log too.
    if n.is_power_of_two() {
        tracing::warn!(
            pool = %pool.stats.spec.name, handshakes = n,
            "a client's TLS handshake failed: {}", why.1
        );
    }
    client::gone(&pool);
}

/// Closes a connection accepted only to be refused: with a reset (linger 0), so that neither
/// side keeps it in `TIME_WAIT`, and the client's read fails at once.
fn refuse(pool: &PoolRt, stream: tokio::net::TcpStream, why: Refused) {
    pool.stats.refused(why);
    // Deprecated because a linger time blocks the thread on drop; a linger of zero does not
    // (the close resets the connection at once).
    #[allow(deprecated)]
    let _ = stream.set_linger(Some(std::time::Duration::ZERO));
    drop(stream);
    let refused = get(&pool.stats.clients_refused[why as usize]);
    // One line per power of two, so that a flood does not flood the log too.
    if refused.is_power_of_two() {
        tracing::warn!(
            pool = %pool.stats.spec.name, reason = why.label(), refused,
            "client connection refused"
        );
    }
}

fn is_out_of_descriptors(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE))
}

/// One descriptor held back (`/dev/null` open) for refusing connections when the process has
/// none left: given up, it makes room to accept the waiting connection and close it, and is
/// taken again. Without it, a listener out of descriptors leaves its backlog to fill, and
/// clients wait in it for a connection that never comes. One for the whole process, behind a
/// lock every worker's accept takes: a spare per worker let one worker's accept take the
/// descriptor another had just given up, after which neither had a spare and the backlogs
/// filled for good.
static SPARE: std::sync::Mutex<Option<std::fs::File>> = std::sync::Mutex::new(None);

fn lock_spare() -> std::sync::MutexGuard<'static, Option<std::fs::File>> {
    SPARE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Takes the spare descriptor if it is not held yet (at a worker's start, and after a spare
/// was lost).
fn hold_spare(spare: &mut Option<std::fs::File>) {
    if spare.is_none() {
        *spare = std::fs::File::open("/dev/null").ok();
    }
}

/// Gives up the spare, accepts one connection and closes it (counted as refused), and takes the
/// spare again; false when there was no spare to give up.
fn refuse_one(listener: &TcpListener, pool: &PoolRt) -> bool {
    let mut spare = lock_spare();
    let Some(file) = spare.take() else {
        hold_spare(&mut spare);
        return false;
    };
    drop(file);
    // The connection is waiting (the accept that failed said so), but another worker may have
    // taken it meanwhile: then there is nothing to refuse.
    if let Some(stream) = listener_accept_now(listener) {
        // Closed before the spare is taken again: it holds the descriptor the spare had.
        refuse(pool, stream, Refused::Descriptors);
    }
    hold_spare(&mut spare);
    true
}

/// One connection from `listener` if one is waiting, without waiting.
fn listener_accept_now(listener: &TcpListener) -> Option<tokio::net::TcpStream> {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match listener.poll_accept(&mut cx) {
        std::task::Poll::Ready(Ok((stream, _))) => Some(stream),
        _ => None,
    }
}
