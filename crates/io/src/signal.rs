//! SIGINT and SIGTERM as a request to stop: the long-running commands (the switch, a fabric
//! switch, the network functions' agents) poll [`stop_requested`] in their loops and stop
//! cleanly, removing what they installed.

use std::sync::atomic::{AtomicBool, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// Makes SIGINT and SIGTERM ask the running command to stop (see [`stop_requested`]).
pub fn install_stop_handlers() {
    let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
    }
}

/// Whether SIGINT or SIGTERM has arrived since [`install_stop_handlers`].
pub fn stop_requested() -> bool {
    STOP.load(Ordering::Relaxed)
}
