//! Serving a control API: on a thread of its own with a single-threaded runtime, behind the
//! [`crate::guard`], at a lower priority than the forwarding thread; and the bearer token's
//! check.

use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex, Weak};

use axum::http::{header, HeaderMap};
use axum::Router;

use crate::guard::{self, Guard};

/// How much lower than the rest of the process the API thread runs (a nice value).
pub const API_NICENESS: i32 = 10;

/// Lowers the calling thread's scheduling priority by [`API_NICENESS`], so that on a busy
/// machine the forwarding thread has the cores before the control plane does; a burst of
/// changes then slows the API, not forwarding.
fn lower_priority() {
    // SAFETY: gettid and setpriority take no pointers; PRIO_PROCESS with a thread id changes
    // that thread alone on Linux.
    let done = unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        let now = libc::getpriority(libc::PRIO_PROCESS, tid);
        libc::setpriority(libc::PRIO_PROCESS, tid, (now + API_NICENESS).min(19))
    };
    if done != 0 {
        tracing::debug!(
            "the API thread keeps its priority: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// The guards of the APIs this process serves over HTTPS, for [`reload_tls`].
static HTTPS: Mutex<Vec<Weak<Guard>>> = Mutex::new(Vec::new());

/// Reads the TLS files of every API this process serves over HTTPS again: what SIGHUP does.
/// Connections open keep their session; files that do not load leave the old ones in use,
/// and the log says why.
pub fn reload_tls() {
    let mut guards = HTTPS.lock().unwrap_or_else(|p| p.into_inner());
    guards.retain(|g| g.strong_count() > 0);
    for guard in guards.iter().filter_map(Weak::upgrade) {
        guard.reload_tls();
    }
}

/// Serves `app` behind `guard` on `listener` from a thread named `name` with a
/// single-threaded runtime (at [`API_NICENESS`] below the rest of the process when `lower`
/// is set); returns the address. The switch's API, the proxy's and the controller's all run
/// this way.
pub fn spawn_server(
    listener: TcpListener,
    app: Router,
    guard: Arc<Guard>,
    name: &str,
    lower: bool,
) -> anyhow::Result<SocketAddr> {
    if guard.https() {
        HTTPS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Arc::downgrade(&guard));
    }
    let app = guard::guarded(app, &guard);
    let addr = listener.local_addr()?;
    listener.set_nonblocking(true)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let name = name.to_string();
    std::thread::Builder::new()
        .name(name.clone())
        .spawn(move || {
            if lower {
                lower_priority();
            }
            runtime.block_on(async move {
                let listener = match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::error!("the {name} server cannot listen: {e}");
                        return;
                    }
                };
                guard::accept(listener, app, guard).await;
            })
        })?;
    Ok(addr)
}

/// Whether `headers` carry `Authorization: Bearer <token>`, compared in constant time.
pub fn bearer_is(headers: &HeaderMap, token: &str) -> bool {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|g| same(g.as_bytes(), token.as_bytes()))
}

/// Whether `given` is `secret`, compared without stopping at the first difference and in a
/// time that depends on the length of `given` alone, so that neither how much of a guess was
/// right nor the secret's length shows in it.
pub fn same(given: &[u8], secret: &[u8]) -> bool {
    let differs = given.iter().enumerate().fold(0u8, |acc, (i, x)| {
        acc | (x ^ secret.get(i).copied().unwrap_or(!x))
    });
    (differs | u8::from(given.len() != secret.len())) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_whole() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"ab"));
        assert!(!same(b"ab", b"abc"));
        assert!(same(b"", b""));
        assert!(!same(b"", b"a"));
    }
}
