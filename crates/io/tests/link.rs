//! `kvio::link` against the kernel: veth pairs and a TUN device made, configured and removed
//! in this network namespace, each setting read back from `/sys/class/net`, `/proc/sys`, `ip`
//! and `ethtool`, which check what `link` did without being what it does.
//!
//! These tests need root (CAP_NET_ADMIN), `ip` and `ethtool`; they fail, not skip, without
//! them. Interfaces are named `kvnl<tag><end><pid>` and removed by a guard on drop, whatever
//! the test did; addresses and routes are in 198.18.0.0/15 (set aside for tests) and go with
//! the interfaces.

use std::io;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Command, Stdio};

use kvio::link::{self, VethPair};
use kvio::Tun;

fn require_root() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "link tests need root (CAP_NET_ADMIN); run them as root"
    );
}

fn has_tool(name: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Runs a command that checks something, panicking with its stderr if it fails.
fn run(args: &[&str]) -> String {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `/sys/class/net/<name>/<file>`, without its newline.
fn sys(name: &str, file: &str) -> String {
    let path = Path::new("/sys/class/net").join(name).join(file);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
        .trim_end()
        .to_string()
}

fn is_up(name: &str) -> bool {
    let flags = sys(name, "flags");
    let flags = u32::from_str_radix(flags.trim_start_matches("0x"), 16).unwrap();
    flags & libc::IFF_UP as u32 != 0
}

/// The state of one feature group in `ethtool -k <name>`, e.g. `tx-checksumming`.
fn offload(name: &str, feature: &str) -> bool {
    let text = run(&["ethtool", "-k", name]);
    let line = text
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{feature}: ")))
        .unwrap_or_else(|| panic!("no {feature} in `ethtool -k {name}`:\n{text}"));
    match line.split_whitespace().next() {
        Some("on") => true,
        Some("off") => false,
        _ => panic!("{feature}: {line}"),
    }
}

/// The route to `dest` in the main table, as `ip -d route` prints it (with its type and
/// protocol); empty if there is none.
fn route_to(dest: Ipv4Addr) -> String {
    run(&[
        "ip",
        "-d",
        "-4",
        "route",
        "show",
        "table",
        "main",
        &format!("{dest}/32"),
    ])
    .trim()
    .to_string()
}

/// Names for one test's interfaces, deleted (with `ip`, not the code under test) on drop.
struct Names {
    names: Vec<String>,
}

impl Names {
    /// `count` names `kvnl<tag><i><pid>`, none of which exists yet.
    fn new(tag: char, count: u8) -> Names {
        require_root();
        assert!(has_tool("ip"), "these tests need iproute2's `ip`");
        assert!(has_tool("ethtool"), "these tests need `ethtool`");
        let pid = std::process::id();
        let names: Vec<String> = (0..count).map(|i| format!("kvnl{tag}{i}{pid}")).collect();
        for name in &names {
            assert!(link::valid_ifname(name), "{name}");
            assert!(!link::exists(name), "{name} is left from an earlier run");
        }
        Names { names }
    }

    fn get(&self, i: usize) -> &str {
        &self.names[i]
    }
}

impl Drop for Names {
    fn drop(&mut self) {
        for name in &self.names {
            if Path::new("/sys/class/net").join(name).exists() {
                let _ = Command::new("ip")
                    .args(["link", "delete", "dev", name])
                    .stderr(Stdio::null())
                    .status();
            }
        }
    }
}

const ADDR: Ipv4Addr = Ipv4Addr::new(198, 18, 77, 1);
const HOST: Ipv4Addr = Ipv4Addr::new(198, 18, 78, 5);

#[test]
fn a_veth_pair_is_made_configured_and_removed() {
    let names = Names::new('v', 2);
    let (a, b) = (names.get(0), names.get(1));

    let pair = VethPair::create(a, b).expect("creating the pair");
    assert_eq!((pair.a(), pair.b()), (a, b));
    assert!(link::exists(a) && link::exists(b));
    // Each end's peer is the other, and both start down.
    assert_eq!(sys(a, "iflink"), sys(b, "ifindex"));
    assert_eq!(sys(b, "iflink"), sys(a, "ifindex"));
    assert!(run(&["ip", "-d", "link", "show", "dev", a]).contains("veth"));
    assert!(!is_up(a) && !is_up(b));
    let again = VethPair::create(a, b).unwrap_err();
    assert_eq!(again.kind(), io::ErrorKind::AlreadyExists, "{again}");

    // MAC and MTU.
    link::set_mac(b, [0x02, 0x6b, 0x76, 0x6e, 0x6c, 0x01]).expect("set_mac");
    assert_eq!(sys(b, "address"), "02:6b:76:6e:6c:01");
    link::set_mtu(b, 1400).expect("set_mtu");
    assert_eq!(sys(b, "mtu"), "1400");
    let err = link::set_mtu(b, 70_000).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
    let text = err.to_string();
    assert!(
        text.starts_with(&format!("{b}: setting the MTU to 70000: ")),
        "{text}"
    );
    assert!(text.contains("os error 22"), "{text}");
    assert_eq!(sys(b, "mtu"), "1400");
    let err = link::set_mtu(b, usize::MAX).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");

    // The alias: `alias` reads it back and `ip` shows it; "" removes it; 255 bytes fit.
    link::set_alias(a, "kvswitch test").expect("set_alias");
    assert_eq!(link::alias(a).as_deref(), Some("kvswitch test"));
    assert!(run(&["ip", "link", "show", "dev", a]).contains("alias kvswitch test"));
    link::set_alias(a, "").expect("clearing the alias");
    assert_eq!(link::alias(a), None);
    assert!(!run(&["ip", "link", "show", "dev", a]).contains("alias"));
    let longest = "k".repeat(255);
    link::set_alias(a, &longest).expect("an alias of 255 bytes");
    assert_eq!(link::alias(a), Some(longest));
    assert!(link::set_alias(a, &"k".repeat(256)).is_err());

    // Sysctls.
    link::disable_ipv6(a).expect("disable_ipv6");
    link::disable_ipv6(b).expect("disable_ipv6");
    if Path::new("/proc/sys/net/ipv6").exists() {
        for name in [a, b] {
            let knob = format!("/proc/sys/net/ipv6/conf/{name}/disable_ipv6");
            assert_eq!(std::fs::read_to_string(&knob).unwrap().trim(), "1");
        }
    }
    link::set_ipv4_conf(b, "arp_ignore", "1").expect("set_ipv4_conf");
    let knob = format!("/proc/sys/net/ipv4/conf/{b}/arp_ignore");
    assert_eq!(std::fs::read_to_string(&knob).unwrap().trim(), "1");

    // Up.
    link::set_up(a).expect("set_up");
    link::set_up(b).expect("set_up");
    assert!(is_up(a) && is_up(b));

    // An address, with the route to its network; a second time is refused.
    link::add_ipv4(b, ADDR, 24).expect("add_ipv4");
    let addrs = run(&["ip", "-4", "-o", "addr", "show", "dev", b]);
    // What `ip addr add ADDR/24 dev b` makes: no broadcast address, global scope.
    assert!(
        addrs.contains(&format!("inet {ADDR}/24 scope global {b}")),
        "{addrs}"
    );
    let net = run(&["ip", "-4", "route", "show", "dev", b]);
    assert!(net.contains("198.18.77.0/24"), "{net}");
    let err = link::add_ipv4(b, ADDR, 24).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::AlreadyExists, "{err}");
    assert!(link::add_ipv4(b, ADDR, 33).is_err());

    // A host route, as `ip route add HOST/32 dev b src ADDR` makes it (a unicast route of
    // protocol `boot`); a second is refused.
    assert_eq!(route_to(HOST), "");
    link::add_host_route(b, HOST, ADDR).expect("add_host_route");
    assert_eq!(
        route_to(HOST),
        format!("unicast {HOST} dev {b} proto boot scope link src {ADDR}")
    );
    let err = link::add_host_route(b, HOST, ADDR).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::AlreadyExists, "{err}");
    assert!(err.to_string().contains(b), "{err}");
    // Replaced to go out of the other end, and replaced with the same is no error.
    link::replace_host_route(a, HOST, ADDR).expect("replace_host_route");
    assert_eq!(
        route_to(HOST),
        format!("unicast {HOST} dev {a} proto boot scope link src {ADDR}")
    );
    link::replace_host_route(a, HOST, ADDR).expect("replacing a route with itself");

    // Offloads: a veth starts with transmit checksumming and segmentation on.
    assert!(offload(b, "tx-checksumming"));
    assert!(offload(b, "generic-segmentation-offload"));
    link::disable_offloads(b).expect("disable_offloads");
    for feature in [
        "tx-checksumming",
        "tcp-segmentation-offload",
        "generic-segmentation-offload",
        "generic-receive-offload",
    ] {
        assert!(
            !offload(b, feature),
            "{feature} is still on on {b}:\n{}",
            run(&["ethtool", "-k", b])
        );
    }
    assert!(offload(a, "tx-checksumming"), "the other end was changed");

    // Deleting one end deletes both, and takes the route along; what is gone is no error.
    link::delete(b).expect("delete");
    assert!(!link::exists(a) && !link::exists(b));
    assert_eq!(route_to(HOST), "");
    link::delete(b).expect("deleting what is gone");
    pair.remove().expect("removing a pair that is gone");
}

#[test]
fn a_pair_is_deleted_when_dropped_or_removed() {
    let names = Names::new('d', 4);
    let pair = VethPair::create(names.get(0), names.get(1)).expect("creating the pair");
    drop(pair);
    assert!(!link::exists(names.get(0)) && !link::exists(names.get(1)));

    let pair = VethPair::create(names.get(2), names.get(3)).expect("creating the pair");
    pair.remove().expect("remove");
    assert!(!link::exists(names.get(2)) && !link::exists(names.get(3)));
}

#[test]
fn a_tun_device_takes_an_mtu_and_a_route() {
    let names = Names::new('t', 1);
    let name = names.get(0);
    let tun = Tun::open(name).expect("opening a TUN device");
    link::set_mtu(name, 1300).expect("set_mtu");
    assert_eq!(sys(name, "mtu"), "1300");
    link::set_up(name).expect("set_up");
    assert!(is_up(name));
    link::add_ipv4(name, Ipv4Addr::new(198, 18, 79, 1), 32).expect("add_ipv4");
    let host = Ipv4Addr::new(198, 18, 79, 9);
    link::replace_host_route(name, host, Ipv4Addr::new(198, 18, 79, 1))
        .expect("replace_host_route");
    assert_eq!(
        route_to(host),
        format!("unicast {host} dev {name} proto boot scope link src 198.18.79.1")
    );
    drop(tun);
    assert!(!link::exists(name));
    assert_eq!(route_to(host), "");
}

#[test]
fn a_missing_interface_is_an_error_naming_it() {
    let names = Names::new('m', 1);
    let name = names.get(0);
    let addr = Ipv4Addr::new(198, 18, 80, 1);
    let attempts: [(&str, io::Result<()>); 7] = [
        ("set_up", link::set_up(name)),
        ("set_mac", link::set_mac(name, [2, 0, 0, 0, 0, 1])),
        ("set_mtu", link::set_mtu(name, 1400)),
        ("set_alias", link::set_alias(name, "x")),
        ("add_ipv4", link::add_ipv4(name, addr, 24)),
        ("add_host_route", link::add_host_route(name, addr, addr)),
        ("disable_offloads", link::disable_offloads(name)),
    ];
    for (what, result) in attempts {
        let err = result.expect_err(what);
        assert!(
            err.to_string().starts_with(&format!("{name}: ")),
            "{what}: {err}"
        );
    }
    // The kernel's own errno, ENODEV, reaches the caller in the text.
    let err = link::set_up(name).unwrap_err();
    assert!(err.to_string().contains("os error 19"), "{err}");
    link::delete(name).expect("deleting what does not exist");
    assert_eq!(
        link::set_up("no/such").unwrap_err().kind(),
        io::ErrorKind::InvalidInput
    );
}

/// `ethtool -k <name>` without its first line, which names the interface.
fn features(name: &str) -> String {
    let text = run(&["ethtool", "-k", name]);
    text.lines().skip(1).collect::<Vec<_>>().join("\n")
}

#[test]
fn offloads_end_as_ethtool_leaves_them() {
    let names = Names::new('o', 4);
    let _ours = VethPair::create(names.get(0), names.get(1)).expect("creating a pair");
    let _theirs = VethPair::create(names.get(2), names.get(3)).expect("creating a pair");
    let (ours, theirs) = (names.get(1), names.get(3));
    assert_eq!(features(ours), features(theirs), "two fresh veths differ");

    link::disable_offloads(ours).expect("disable_offloads");
    run(&[
        "ethtool", "-K", theirs, "tx", "off", "tso", "off", "gso", "off", "gro", "off",
    ]);
    assert_eq!(features(ours), features(theirs));
    assert_ne!(features(ours), features(names.get(0)), "nothing changed");
    // A second time changes nothing and is no error.
    link::disable_offloads(ours).expect("disable_offloads again");
    assert_eq!(features(ours), features(theirs));
}

#[test]
fn a_transmit_checksum_that_stays_on_is_an_error() {
    require_root();
    assert!(has_tool("ethtool"), "these tests need `ethtool`");
    // Loopback's checksum offload cannot be turned off; a network namespace of this thread's
    // own has a loopback to try it on without touching the host's.
    std::thread::spawn(|| {
        // SAFETY: plain system call; it moves only this thread into a new namespace.
        let ret = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        assert_eq!(ret, 0, "unshare: {}", io::Error::last_os_error());
        let before = features("lo");
        assert!(
            before.contains("tx-checksum-ip-generic: on [fixed]"),
            "{before}"
        );
        let err = link::disable_offloads("lo").unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("lo: turning offloads off: ")
                && text.contains("still on: ")
                && text.contains("tx-checksum-ip-generic"),
            "{text}"
        );
    })
    .join()
    .expect("the test's thread");
}
