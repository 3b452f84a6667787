//! Where frames go: the ports a received frame leaves by given its fate, and the ports a frame
//! the application originates leaves by. Pure rules, shared by every driver.
//!
//! - `Out(p)` leaves by `p`, the in-port included: the application alone decides that a frame
//!   may go back where it came from (the switch allows it only for a request routed by key to
//!   a server behind the client's own port). A port that does not exist gets nothing.
//! - A flood leaves by every port but the in-port and the local port: the host's end of the
//!   local port needs only frames for the VIP's MAC, which the application sends it by name.
//! - An originated frame for `Dest::Port(p)` leaves by `p`; `Dest::Flood` by every port but the
//!   local port (it came from no port).

use switch::{Dest, Fate};

/// Calls `out` with every port a frame received on `in_port` leaves by, in port order
/// ([`Fate::each_port`], the rule the switch follows itself). `ports` is the number of ports,
/// `local` the local port if there is one.
pub fn fate_ports(
    fate: Fate,
    in_port: usize,
    ports: usize,
    local: Option<usize>,
    out: impl FnMut(usize),
) {
    fate.each_port(in_port, ports, local, out);
}

/// Whether a frame the application originates for `dest` leaves by `port`.
pub fn emit_goes_to(dest: Dest, port: usize, local: Option<usize>) -> bool {
    match dest {
        Dest::Port(p) => usize::from(p) == port,
        Dest::Flood => Some(port) != local,
    }
}

/// Whether a fate names a port that does not exist (the frame is lost, and the driver counts
/// it).
pub fn out_of_range(fate: Fate, ports: usize) -> bool {
    matches!(fate, Fate::Out(p) if usize::from(p) >= ports)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ports_of(fate: Fate, in_port: usize, ports: usize, local: Option<usize>) -> Vec<usize> {
        let mut v = Vec::new();
        fate_ports(fate, in_port, ports, local, |p| v.push(p));
        v
    }

    #[test]
    fn a_flood_skips_the_in_port_and_the_local_port() {
        assert_eq!(ports_of(Fate::Flood, 1, 4, Some(3)), vec![0, 2]);
        assert_eq!(ports_of(Fate::Flood, 3, 4, Some(3)), vec![0, 1, 2]);
        assert_eq!(ports_of(Fate::Flood, 0, 3, None), vec![1, 2]);
        assert_eq!(ports_of(Fate::Flood, 0, 1, None), Vec::<usize>::new());
    }

    #[test]
    fn out_names_one_port_even_the_in_port_and_never_one_that_does_not_exist() {
        assert_eq!(ports_of(Fate::Out(2), 0, 4, Some(3)), vec![2]);
        assert_eq!(ports_of(Fate::Out(0), 0, 4, Some(3)), vec![0]);
        assert_eq!(
            ports_of(Fate::Out(3), 0, 4, Some(3)),
            vec![3],
            "by name, even the local port"
        );
        assert!(ports_of(Fate::Out(4), 0, 4, Some(3)).is_empty());
        assert!(out_of_range(Fate::Out(4), 4));
        assert!(!out_of_range(Fate::Out(3), 4));
        assert!(!out_of_range(Fate::Flood, 0));
        assert!(ports_of(Fate::Consumed, 0, 4, None).is_empty());
    }

    #[test]
    fn originated_floods_skip_only_the_local_port() {
        let goes = |dest, local| (0..4).filter(|&p| emit_goes_to(dest, p, local)).collect();
        let v: Vec<usize> = goes(Dest::Flood, Some(3));
        assert_eq!(v, vec![0, 1, 2]);
        let v: Vec<usize> = goes(Dest::Flood, None);
        assert_eq!(v, vec![0, 1, 2, 3]);
        let v: Vec<usize> = goes(Dest::Port(3), Some(3));
        assert_eq!(v, vec![3]);
        let v: Vec<usize> = goes(Dest::Port(9), None);
        assert!(v.is_empty());
    }
}
