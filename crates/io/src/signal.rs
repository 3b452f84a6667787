//! Signals as requests the long-running commands poll for: SIGINT and SIGTERM ask them to stop
//! ([`stop_requested`]: the switch, a fabric switch, the proxy, the controller and the network
//! functions' agents stop cleanly, removing what they installed), SIGHUP to read their
//! configuration again ([`reload_requested`]). The handlers only set a flag
//! (`signal_hook::flag`), which is all a signal handler may safely do.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

static STOP: OnceLock<Arc<AtomicBool>> = OnceLock::new();
static RELOAD: OnceLock<Arc<AtomicBool>> = OnceLock::new();

fn flag(cell: &'static OnceLock<Arc<AtomicBool>>) -> &'static Arc<AtomicBool> {
    cell.get_or_init(|| Arc::new(AtomicBool::new(false)))
}

/// Sets `flag` when one of `signals` arrives; a signal whose handler cannot be installed is
/// logged, and keeps its default action.
fn register(signals: &[i32], flag: &Arc<AtomicBool>) {
    for &signal in signals {
        if let Err(e) = signal_hook::flag::register(signal, flag.clone()) {
            tracing::warn!(signal, "cannot handle the signal: {e}");
        }
    }
}

/// Makes SIGINT and SIGTERM ask the running command to stop (see [`stop_requested`]).
pub fn install_stop_handlers() {
    register(&[SIGINT, SIGTERM], flag(&STOP));
}

/// Whether SIGINT or SIGTERM has arrived since [`install_stop_handlers`].
pub fn stop_requested() -> bool {
    flag(&STOP).load(Ordering::Relaxed)
}

/// Makes SIGHUP ask for the configuration to be read again (see [`reload_requested`]).
pub fn install_reload_handler() {
    register(&[SIGHUP], flag(&RELOAD));
}

/// Whether SIGHUP has come since the last call.
pub fn reload_requested() -> bool {
    flag(&RELOAD).swap(false, Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_sets_its_flag_and_a_reload_is_taken_once() {
        install_reload_handler();
        assert!(!reload_requested());
        signal_hook::low_level::raise(SIGHUP).expect("SIGHUP raised");
        assert!(reload_requested());
        assert!(!reload_requested(), "a reload is taken once");
    }
}
