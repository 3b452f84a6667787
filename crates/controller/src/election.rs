//! Who leads: with a store, the elector campaigns for the lead, keeps the lease alive while
//! leading, and stops acting the moment it cannot.

use super::*;

/// Leads when it can: takes the pool from etcd (or puts the file's there, the first time),
/// keeps the lease alive while leading, and stops acting the moment it cannot.
pub(crate) fn elector(shared: &Shared) {
    let mut complained = false;
    let until = |asked: Instant| Some(asked + etcd::LEASE_TTL.saturating_sub(etcd::LEAD_MARGIN));
    while !shared.stop.load(Ordering::Relaxed) {
        let leading = shared.fleet().leads;
        if leading {
            let asked = Instant::now();
            let kept = shared.store().is_some_and(|mut e| e.keep_leading());
            let mut f = shared.fleet();
            match kept {
                true => f.lead_until = until(asked),
                false => {
                    tracing::warn!("lost the lead (the lease ran out or etcd is out of reach)");
                    f.leads = false;
                    f.lead_until = None;
                    f.leader = None;
                }
            }
        } else {
            let asked = Instant::now();
            let outcome = shared.store().map(|mut e| {
                let won = e.campaign(&shared.me)?;
                if !won {
                    return anyhow::Ok((false, None, e.leader()?));
                }
                match e.servers() {
                    Ok(stored) => Ok((true, stored, None)),
                    Err(err) => {
                        // Not leading on a lease that is not being kept alive.
                        e.forget();
                        Err(err)
                    }
                }
            });
            match outcome {
                Some(Ok((true, stored, _))) => {
                    let mut f = shared.fleet();
                    if let Some(list) = stored {
                        f.standing_in = vec![None; list.len()];
                        f.servers = list;
                    } else {
                        let list = f.servers.clone();
                        if let Some(e) = shared.store() {
                            if let Err(err) = e.store_servers(&list) {
                                tracing::warn!("cannot store the pool: {err:#}");
                            }
                        }
                    }
                    // Health starts unknown: the switches change only after a probe round.
                    f.health = vec![Health::default(); f.servers.len()];
                    f.spare_health = vec![Health::default(); f.file.failover.len()];
                    f.leads = true;
                    f.led_since = Some(Instant::now());
                    f.lead_until = until(asked);
                    f.leader = None;
                    tracing::info!("leading");
                    shared.bump(&mut f);
                    complained = false;
                }
                Some(Ok((false, _, leader))) => {
                    shared.fleet().leader = leader;
                    complained = false;
                }
                Some(Err(e)) => {
                    if !complained {
                        tracing::warn!("cannot reach etcd: {e:#}");
                        complained = true;
                    }
                }
                None => return,
            }
        }
        std::thread::sleep(CAMPAIGN_INTERVAL);
    }
}
