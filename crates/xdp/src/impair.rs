//! Loss for tests of TCP through the switch (`bpf/impair.c`): an XDP program on a host's own
//! interface that drops a seeded share of the TCP segments arriving there, SYNs excepted.
//! This kernel has no netem; the switch's `impair` action serves tests of the user-space
//! switch, but an operator's entry turns the fast path off, so tests of what the fast path
//! sends on impair the hosts' ends instead.

use libbpf_rs::{MapCore, MapFlags, MapHandle, Object, ObjectBuilder};

use crate::Error;

static OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/impair.o"));
const PROGRAM: &str = "kvswitch_impair";

/// The program attached to one interface; detached when dropped.
pub struct Impair {
    _object: Object,
    _link: libbpf_rs::Link,
    counts: MapHandle,
}

impl Impair {
    /// Loads the program to drop `permille` of every thousand TCP segments (by a hash of
    /// `seed` and each segment's number) and attaches it to interface `ifindex` of the calling
    /// thread's network namespace.
    pub fn attach(ifindex: u32, permille: u32, seed: u64) -> Result<Impair, Error> {
        let load = |e: libbpf_rs::Error| Error::Load(e.to_string());
        let object = ObjectBuilder::default()
            .name("kvswitch_impair")
            .map_err(load)?
            .open_memory(OBJECT)
            .map_err(load)?
            .load()
            .map_err(load)?;
        let handle = |name: &str| -> Result<MapHandle, Error> {
            let map = object
                .maps()
                .find(|m| m.name() == name)
                .ok_or_else(|| Error::Load(format!("the object has no map {name}")))?;
            MapHandle::try_from(&map).map_err(load)
        };
        let mut cfg = Vec::with_capacity(16);
        cfg.extend_from_slice(&seed.to_ne_bytes());
        cfg.extend_from_slice(&permille.min(1000).to_ne_bytes());
        cfg.extend_from_slice(&0u32.to_ne_bytes());
        handle("impair_cfg")?
            .update(&0u32.to_ne_bytes(), &cfg, MapFlags::ANY)
            .map_err(|e| Error::Map {
                map: "impair_cfg",
                reason: e.to_string(),
            })?;
        let counts = handle("impair_counts")?;
        let index = i32::try_from(ifindex).map_err(|_| Error::Attach {
            ifindex,
            reason: "ifindex out of range".into(),
        })?;
        let link = object
            .progs_mut()
            .find(|p| p.name() == PROGRAM)
            .ok_or_else(|| Error::Load(format!("the object has no program {PROGRAM}")))?
            .attach_xdp(index)
            .map_err(|e| Error::Attach {
                ifindex,
                reason: e.to_string(),
            })?;
        Ok(Impair {
            _object: object,
            _link: link,
            counts,
        })
    }

    /// TCP segments the program has seen, and dropped.
    pub fn counts(&self) -> (u64, u64) {
        let read = |i: u32| -> u64 {
            self.counts
                .lookup(&i.to_ne_bytes(), MapFlags::ANY)
                .ok()
                .flatten()
                .and_then(|v| v.get(..8).and_then(|b| b.try_into().ok()))
                .map_or(0, u64::from_ne_bytes)
        };
        (read(0), read(1))
    }
}
