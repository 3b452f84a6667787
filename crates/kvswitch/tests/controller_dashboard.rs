//! The controller's dashboard in headless Chromium (Debian's `chromium`), with two kvswitch
//! proxies in front of real memcached servers on loopback: the page loads without a console
//! message, shows every switch and server, and its request rates (read from the page, not
//! from the API) are zero while nothing runs and rise while load runs.
//!
//! Requires memcached and chromium.

mod common;

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::fleet::{controller_toml, proxies, servers};
use common::proxy::PoolOpts;
use testbed::local::{self, TempDir};

/// The page as Chromium leaves it after `budget` of virtual time (the page polls once a
/// second), and whatever the page wrote to the console.
fn render(url: &str, budget: Duration, dir: &TempDir) -> (String, Vec<String>) {
    let bin = local::require("chromium").expect("chromium is installed (scripts/setup.sh)");
    let out = Command::new(bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--enable-logging=stderr",
        ])
        .arg("--v=0")
        .arg(format!(
            "--user-data-dir={}",
            dir.path().join("profile").display()
        ))
        .arg(format!("--virtual-time-budget={}", budget.as_millis()))
        .arg("--dump-dom")
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .expect("chromium runs");
    let console = String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| l.contains(":CONSOLE"))
        .map(str::to_string)
        .collect();
    (String::from_utf8_lossy(&out.stdout).into_owned(), console)
}

/// The number in the cell of `class` whose `data-{attr}` is `value`.
fn figure(dom: &str, class: &str, attr: &str, value: &str) -> f64 {
    let marker = format!("class=\"{class}\" data-{attr}=\"{value}\">");
    let at = dom
        .find(&marker)
        .unwrap_or_else(|| panic!("no {marker} in the page:\n{dom}"));
    let rest = &dom[at + marker.len()..];
    rest[..rest.find('<').unwrap_or(0)]
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{marker} holds no number"))
}

#[test]
fn the_dashboard_shows_the_fleet_and_its_rates_rise_under_load() {
    let dir = TempDir::new("kvswitch-dashboard").unwrap();
    let names = ["s1", "s2", "s3"];
    let (_servers, list) = servers(&names);
    let (proxies, clients) = proxies(2, &list, &PoolOpts::default());
    let apis: Vec<SocketAddr> = clients.iter().map(|c| c.api).collect();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let api = listener.local_addr().unwrap();
    let text = controller_toml(api, "", &apis, &list);
    let file = config::controller::parse(&text, Path::new("controller.toml")).unwrap();
    let _controller = controller::start(file, listener, None, None, None).unwrap();
    let url = format!("http://{api}/");

    // Idle: every switch and server shown, no traffic.
    let (dom, console) = render(&url, Duration::from_secs(3), &dir);
    assert!(
        console.is_empty(),
        "the page wrote to the console: {console:#?}"
    );
    for name in ["p0", "p1"] {
        assert_eq!(figure(&dom, "num rate-tcp", "switch", name), 0.0, "{dom}");
    }
    for name in names {
        assert!(
            dom.contains(&format!("data-server=\"{name}\"")),
            "{name} is not on the page:\n{dom}"
        );
    }

    // Under load through both proxies, the page's rates rise.
    let stop = Arc::new(AtomicBool::new(false));
    let loads: Vec<_> = proxies
        .iter()
        .map(|p| {
            let (front, stop) = (p.addr, stop.clone());
            std::thread::spawn(move || {
                let keys: Vec<Vec<u8>> = (0..50).map(|i| format!("d{i}").into_bytes()).collect();
                while !stop.load(Ordering::Relaxed) {
                    let _ = local::store(front, &keys);
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let (dom, console) = render(&url, Duration::from_secs(4), &dir);
    stop.store(true, Ordering::Relaxed);
    for l in loads {
        l.join().unwrap();
    }
    assert!(
        console.is_empty(),
        "the page wrote to the console: {console:#?}"
    );
    for name in ["p0", "p1"] {
        let r = figure(&dom, "num rate-tcp", "switch", name);
        assert!(r > 0.0, "{name}: {r} requests/s under load:\n{dom}");
    }
    let by_server: f64 = names
        .iter()
        .map(|n| figure(&dom, "num server-rate", "server", n))
        .sum();
    assert!(
        by_server > 0.0,
        "no server shows requests under load:\n{dom}"
    );
    eprintln!(
        "the page under load: p0 {} TCP requests/s, p1 {}, the servers {by_server} in all",
        figure(&dom, "num rate-tcp", "switch", "p0"),
        figure(&dom, "num rate-tcp", "switch", "p1")
    );
}
