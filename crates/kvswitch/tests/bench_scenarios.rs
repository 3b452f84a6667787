//! Every testbed scenario of `kvswitch bench` in its short mode, through the real binary:
//! each builds its testbed, measures, tears it down, and leaves well-formed results — JSON with
//! a figure for every system, PNG files, SVG files that parse as XML and name every series, and
//! a markdown summary — and nothing of its testbed behind. The scenarios run one at a time, so
//! that their measurements do not share the cores with each other.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// One scenario at a time.
static SERIAL: Mutex<()> = Mutex::new(());

const PNG_SIGNATURE: [u8; 8] = [0x89, b'P', b'N', b'G', b'\r', b'\n', 0x1a, b'\n'];

fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    assert_eq!(
        uid, 0,
        "the bench scenarios build network namespaces and need root"
    );
}

/// Runs `kvswitch bench <scenario> --short` with its own prefix and results folder, checks
/// that nothing of the testbed is left, and returns the folder and the parsed results.
fn run(scenario: &str, prefix: &str) -> (PathBuf, serde_json::Value) {
    run_with(scenario, prefix, &[])
}

/// `kvswitch bench SCENARIO --short` with `extra` arguments.
fn run_with(scenario: &str, prefix: &str, extra: &[&str]) -> (PathBuf, serde_json::Value) {
    require_root();
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let out =
        std::env::temp_dir().join(format!("kvswitch-bench-{scenario}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let started = std::time::Instant::now();
    let result = Command::new(env!("CARGO_BIN_EXE_kvswitch"))
        .args(["bench", scenario, "--short", "--prefix", prefix, "--out"])
        .arg(&out)
        .args(extra)
        .output()
        .expect("running kvswitch bench");
    let stdout = String::from_utf8_lossy(&result.stdout);
    let stderr = String::from_utf8_lossy(&result.stderr);
    eprintln!(
        "{scenario}: {:.1} s\n{stderr}",
        started.elapsed().as_secs_f64()
    );
    assert!(
        result.status.success(),
        "kvswitch bench {scenario} failed:\n{stdout}\n{stderr}"
    );
    assert_left_nothing(prefix);
    let text = std::fs::read_to_string(out.join("results.json")).expect("results.json");
    let json: serde_json::Value = serde_json::from_str(&text).expect("results.json is JSON");
    assert_eq!(json["scenario"], scenario);
    assert_eq!(json["settings"]["short"], true);
    assert!(
        json["machine"]["cores"].as_u64().unwrap_or(0) >= 1,
        "{}",
        json["machine"]
    );
    let summary = std::fs::read_to_string(out.join("summary.md")).expect("summary.md");
    assert!(summary.starts_with("# "), "{summary}");
    assert!(summary.contains("Machine: "), "{summary}");
    assert!(
        stdout.contains(summary.lines().next().unwrap_or("")),
        "summary not printed"
    );
    (out, json)
}

/// No namespace, link or state file of the prefix is left.
fn assert_left_nothing(prefix: &str) {
    let tag = format!("{prefix}-");
    let netns = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns");
    let links = Command::new("ip")
        .args(["-o", "link", "show"])
        .output()
        .expect("ip link");
    for text in [netns.stdout, links.stdout] {
        let text = String::from_utf8_lossy(&text).into_owned();
        assert!(
            !text
                .split_whitespace()
                .any(|w| w.trim_end_matches(':').starts_with(&tag)),
            "left behind:\n{text}"
        );
    }
    assert!(
        !testbed::default_state_path(prefix).exists(),
        "state file left"
    );
}

/// The plot `name` exists as a PNG and as an SVG that parses and names every series given.
fn check_plot(dir: &Path, name: &str, series: &[String]) {
    let png = std::fs::read(dir.join(format!("{name}.png"))).expect("png");
    assert_eq!(&png[..8], &PNG_SIGNATURE, "{name}.png is not a PNG");
    assert!(png.len() > 5_000, "{name}.png is nearly empty");
    let svg = std::fs::read_to_string(dir.join(format!("{name}.svg"))).expect("svg");
    let doc =
        roxmltree::Document::parse(&svg).unwrap_or_else(|e| panic!("{name}.svg is not XML: {e}"));
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let text: Vec<&str> = doc
        .descendants()
        .filter(|n| n.is_text())
        .filter_map(|n| n.text())
        .collect();
    for s in series {
        assert!(
            text.iter().any(|t| t.contains(s.as_str())),
            "{name}.svg does not name {s:?}; its text: {text:?}"
        );
    }
}

/// The display names of the systems in the results, as the plots label them.
fn system_names(json: &serde_json::Value) -> Vec<String> {
    let names = [
        ("direct_udp", "memcached direct (UDP)"),
        ("direct_tcp", "memcached direct (TCP)"),
        ("nutcracker", "nutcracker (TCP)"),
        ("kvswitch_udp", "kvswitch switch (UDP)"),
        ("kvswitch_tcp", "kvswitch splice (TCP)"),
        ("kvswitch_tcp_proxy", "kvswitch proxy path (TCP)"),
        ("kvswitch_cache_udp", "kvswitch + cache (UDP)"),
        ("kvswitch_cache_tcp", "kvswitch + cache (TCP)"),
        ("switchkv_udp", "SwitchKV cache node (UDP)"),
        ("switchkv_encoded_udp", "SwitchKV, client-encoded (UDP)"),
        ("look_through_udp", "look-through cache node (UDP)"),
        ("look_aside_udp", "look-aside cache node (UDP)"),
    ];
    json["systems"]
        .as_array()
        .expect("systems")
        .iter()
        .map(|s| {
            let slug = s.as_str().expect("system");
            names
                .iter()
                .find(|(k, _)| *k == slug)
                .map(|(_, v)| v.to_string())
                .unwrap_or_else(|| panic!("unknown system {slug}"))
        })
        .collect()
}

fn medians(json: &serde_json::Value) -> &Vec<serde_json::Value> {
    json["medians"].as_array().expect("medians")
}

/// Run with two servers, as MemSwitch's Figure 3 runs one and two. Its result (the switch's
/// highest rate doubles with a second server, the proxy's does not) is not asserted: the short
/// run's rates are sustained by every system, and on 2 cores the client and the middle boxes
/// saturate before one memcached does (see docs/results.md).
#[test]
fn latency_throughput_short() {
    let (dir, json) = run_with("latency-throughput", "kvbl", &["--servers", "2"]);
    assert_eq!(json["settings"]["servers"], 2);
    let systems = system_names(&json);
    // The peers, kvswitch's three ways in (UDP, TCP spliced, TCP on the proxy's path), and
    // UDP and TCP with its cache.
    assert_eq!(systems.len(), 8);
    let rates = json["settings"]["rates"].as_array().expect("rates").len();
    assert_eq!(medians(&json).len(), systems.len() * rates);
    for p in medians(&json) {
        assert!(p["get_rps"].as_f64().unwrap() > 0.0, "{p}");
        assert!(p["p50_us"].as_f64().unwrap() > 0.0, "{p}");
        assert!(
            p["p99_us"].as_f64().unwrap() >= p["p50_us"].as_f64().unwrap(),
            "{p}"
        );
    }
    let series: Vec<String> = systems.iter().map(|s| format!("{s} p99")).collect();
    check_plot(&dir, "latency", &series);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn value_size_short() {
    let (dir, json) = run("value-size", "kvbv");
    let systems = system_names(&json);
    let sizes = json["settings"]["sizes"].as_array().expect("sizes");
    assert_eq!(sizes.last().and_then(|s| s.as_u64()), Some(11_000));
    assert_eq!(medians(&json).len(), systems.len() * sizes.len());
    for p in medians(&json) {
        assert!(p["p50_us"].as_f64().unwrap() > 0.0, "{p}");
    }
    check_plot(&dir, "value-size", &systems);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn skew_short() {
    // Three times the backends' capacity, not the bench's six times: far enough past what the
    // backends serve for every cache to pass 1.2 times it (asserted below), while the
    // look-aside cache node (a miss, the backend, then the fill: three round trips) keeps its
    // queue under the requests' 100 ms timeout. At six times on two busy cores its queue held
    // every reply past it, and no request completed; at twice, the switch's cache of 100 keys
    // fell short of it.
    let (dir, json) = run_with("skew", "kvbs", &["--load", "3"]);
    let servers = json["settings"]["servers"].as_u64().expect("servers");
    assert!(servers >= 8);
    for p in medians(&json) {
        assert!(p["get_rps"].as_f64().unwrap() > 0.0, "{p}");
        let loads = p["backend_rps"].as_array().expect("backend loads");
        assert_eq!(loads.len() as u64, servers);
        // kvswitch spreads the load over every backend (but for the hits-only points, which
        // a cache answers without them).
        if p["sweep"] != "hits" {
            assert!(loads.iter().all(|l| l.as_f64().unwrap() > 0.0), "{p}");
        }
    }
    check_plot(
        &dir,
        "throughput-skew",
        &[
            "kvswitch switch (UDP)".to_string(),
            "kvswitch + cache (UDP)".to_string(),
            "SwitchKV cache node (UDP)".to_string(),
            "look-through cache node (UDP)".to_string(),
            "look-aside cache node (UDP)".to_string(),
        ],
    );
    assert!(dir.join("throughput-cache-size.png").exists());
    // Every system at every point of the write-ratio sweeps (Zipf and uniform writes) and
    // the latency sweep.
    let systems = json["systems"].as_array().expect("systems").len();
    for (sweep, settings) in [
        ("write_ratio", "write_ratios"),
        ("uniform_writes", "write_ratios"),
        ("load", "latency_loads"),
        ("hits", "latency_loads"),
        ("misses", "latency_loads"),
    ] {
        let points: Vec<&serde_json::Value> = medians(&json)
            .iter()
            .filter(|p| p["sweep"] == sweep)
            .collect();
        let per_system = json["settings"][settings].as_array().expect(settings).len();
        assert_eq!(points.len(), systems * per_system, "{sweep}: {json}");
        for p in points {
            assert!(p["rps"].as_f64().unwrap() > 0.0, "{p}");
            assert!(
                p["p99_us"].as_f64().unwrap() >= p["p50_us"].as_f64().unwrap(),
                "{p}"
            );
        }
    }
    check_plot(
        &dir,
        "throughput-write-ratio",
        &[
            "look-aside cache node (UDP)".to_string(),
            "look-aside cache node (UDP), uniform writes".to_string(),
        ],
    );
    check_plot(
        &dir,
        "latency-load",
        &[
            "SwitchKV cache node (UDP) p50".to_string(),
            "look-through cache node (UDP) p99".to_string(),
        ],
    );
    // SwitchKV's Figure 13b: a miss of the look-aside cache node costs the client a trip to
    // the node and then one to the backend, where SwitchKV's switch sends a read of a key the
    // node does not hold straight to the backend.
    let p50 = |system: &str, sweep: &str| {
        medians(&json)
            .iter()
            .find(|p| p["system"] == system && p["sweep"] == sweep)
            .and_then(|p| p["p50_us"].as_f64())
            .unwrap_or_else(|| panic!("no {system} {sweep}: {json}"))
    };
    assert!(
        p50("look_aside_udp", "misses") > p50("switchkv_udp", "misses"),
        "misses: look-aside {} µs, SwitchKV {} µs",
        p50("look_aside_udp", "misses"),
        p50("switchkv_udp", "misses")
    );
    for plot in ["latency-load-hits", "latency-load-misses"] {
        check_plot(&dir, plot, &["SwitchKV cache node (UDP) p50".to_string()]);
    }
    // With the cache, the skewed load gets past the backends' capacity. A sized cache is
    // judged on its cache-size point, where it starts empty: in the skew sweep it comes from
    // the uniform point, whose keys a short run's few seconds do not all turn over.
    let at = |system: &str, skew: f64| {
        let point = |sweep: &str| {
            medians(&json).iter().find(|p| {
                p["system"] == system && p["sweep"] == sweep && p["skew"].as_f64() == Some(skew)
            })
        };
        point("cache_size")
            .or_else(|| point("skew"))
            .map(|p| p["get_rps"].as_f64().unwrap())
            .unwrap_or_else(|| panic!("no {system} at zipf {skew}"))
    };
    let capacity = json["settings"]["capacity_rps"].as_f64().unwrap() * servers as f64;
    assert!(at("kvswitch_udp", 0.99) <= capacity * 1.1);
    // Every cache, in the switch or on a node reached any of SwitchKV's ways, answers hot
    // keys beyond the backends' capacity: past 1.2 times it, clear of the 1.1 that bounds the
    // cacheless switch above. A node that every request crosses (look-through) shares the two
    // cores with the client and the switch, and a busy machine holds it near 1.3 times.
    // Judged on its best point at Zipf 0.99 of any sweep: each point of a short run lasts
    // seconds, and a node's cache may still be filling during the first (a look-through node
    // served exactly the backends' capacity there on a busy machine, then 2.3 times it).
    let best = |system: &str| {
        medians(&json)
            .iter()
            .filter(|p| p["system"] == system && p["skew"].as_f64() == Some(0.99))
            .filter_map(|p| p["get_rps"].as_f64())
            .fold(0.0, f64::max)
    };
    for system in [
        "kvswitch_cache_udp",
        "switchkv_udp",
        "switchkv_encoded_udp",
        "look_through_udp",
        "look_aside_udp",
    ] {
        assert!(
            best(system) > capacity * 1.2,
            "{system} does not get past the backends' capacity: {json}"
        );
    }
    check_plot(
        &dir,
        "load-per-backend",
        &["s1".to_string(), format!("s{servers}")],
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn popularity_change_short() {
    let (dir, json) = run("popularity-change", "kvbp");
    // Every system (no cache, kvswitch's, SwitchKV's cache node steered to, on the path of
    // every request and asked first) under every kind of change, in order.
    let kinds = ["no change", "hot-in", "hot-out", "random"];
    let systems = json["systems"].as_array().expect("systems");
    assert_eq!(systems.len(), 5, "{json}");
    let every = &json["settings"]["change_every_s"];
    let of = |system: &str, variant: &serde_json::Value, every: &serde_json::Value| {
        medians(&json)
            .iter()
            .filter(|r| {
                r["system"] == system && r["variant"] == *variant && r["change_every_s"] == *every
            })
            .map(|r| r["change"].as_str().expect("change"))
            .collect::<Vec<&str>>()
    };
    for system in systems {
        let system = system.as_str().expect("system");
        assert_eq!(
            of(system, &serde_json::Value::Null, every),
            kinds,
            "{system}"
        );
    }
    // SwitchKV with periodic or instant reports only, without its rule buffer, and with the
    // traditional update.
    for (variant, changes) in [
        ("periodic_only", &kinds[..]),
        ("instant_only", &kinds[..]),
        ("no_rule_buffer", &kinds[..2]),
        ("traditional", &kinds[..2]),
    ] {
        let variant = serde_json::Value::from(variant);
        assert_eq!(of("switchkv_udp", &variant, every), changes, "{variant}");
    }
    // Both caches against the change rate, under hot-in and random changes.
    for rate in json["settings"]["change_rates_s"]
        .as_array()
        .expect("rates")
    {
        for system in ["kvswitch_cache_udp", "switchkv_udp"] {
            assert_eq!(
                of(system, &serde_json::Value::Null, rate),
                ["hot-in", "random"],
                "{system} every {rate} s"
            );
        }
    }
    for r in medians(&json) {
        let series = r["series"].as_array().expect("series");
        // 100 ms intervals over the measured window.
        let expect = (json["settings"]["duration_s"].as_f64().unwrap() * 10.0).round() as usize;
        assert_eq!(series.len(), expect, "{r}");
        assert!(r["get_rps"].as_f64().unwrap() > 0.0, "{r}");
    }
    let names: Vec<String> = ["hot-in", "hot-out", "random"].map(String::from).to_vec();
    check_plot(&dir, "throughput-over-time-kvswitch_udp", &names);
    check_plot(&dir, "throughput-over-time-kvswitch_cache_udp", &names);
    check_plot(&dir, "throughput-over-time-switchkv_udp", &names);
    check_plot(&dir, "throughput-over-time-look_through_udp", &names);
    check_plot(&dir, "throughput-over-time-look_aside_udp", &names);
    check_plot(
        &dir,
        "throughput-over-time-switchkv_udp-instant-only",
        &names,
    );
    check_plot(
        &dir,
        "throughput-over-time-switchkv_udp-no-rule-buffer",
        &["hot-in".to_string()],
    );
    check_plot(
        &dir,
        "throughput-change-rate",
        &[
            "SwitchKV cache node (UDP), hot-in".to_string(),
            "kvswitch + cache (UDP), random".to_string(),
        ],
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn cost_short() {
    let (dir, json) = run("cost", "kvbc");
    let systems = system_names(&json);
    assert_eq!(medians(&json).len(), systems.len());
    for p in medians(&json) {
        // With the XDP fast path the kernel forwards what needs no user space, so the
        // kvswitch process may spend less than a clock tick on a whole run: only the middle
        // boxes every request passes through in user space must show CPU.
        let middle = p["middle_us"].as_f64().unwrap();
        assert!(middle.is_finite() && middle >= 0.0, "{p}");
        match p["system"].as_str() {
            Some("nutcracker") => {
                assert!(p["nutcracker_us"].as_f64().unwrap() > 0.0, "{p}");
                assert!(middle > 0.0, "{p}");
            }
            Some("kvswitch_tcp" | "kvswitch_tcp_proxy" | "kvswitch_cache_tcp") => {
                assert!(middle > 0.0, "{p}")
            }
            _ => {}
        }
    }
    check_plot(&dir, "cpu-per-request", &["kvswitch process".to_string()]);
    let _ = std::fs::remove_dir_all(dir);
}

/// ServerSwitch's Figure 10 in short: at no hits the server answers every request; at all
/// hits it answers none, the agent answering them all from the CPU path.
#[test]
fn reqcache_short() {
    let (dir, json) = run("reqcache", "kvbr");
    let points = json["points"].as_array().expect("points");
    assert_eq!(points.len(), 2, "no hits and all hits");
    let at = |ratio: f64| {
        points
            .iter()
            .find(|p| p["hit_ratio"].as_f64() == Some(ratio))
            .unwrap_or_else(|| panic!("hit ratio {ratio}: {points:?}"))
    };
    let n = |p: &serde_json::Value, f: &str| p[f].as_f64().unwrap_or(f64::NAN);
    for p in points {
        assert!(n(p, "sent") > 0.0, "{p}");
        assert!(n(p, "answered") >= 0.9 * n(p, "sent"), "{p}");
    }
    let (none, all) = (at(0.0), at(1.0));
    assert!(n(none, "server_replies") >= 0.9 * n(none, "sent"), "{none}");
    assert_eq!(
        n(all, "server_replies"),
        0.0,
        "every hit is answered by the agent: {all}"
    );
    // ServerSwitch's CPU rising with the hit ratio is not asserted: over the CPU channel an
    // answered hit costs the agent about what examining a miss's reply does (1.5% and 1.8%
    // of a core at 2,000 requests/s, measured), below what /proc's ticks resolve in a short
    // run, and kvswitch's own CPU is its busy-polling loop's at any ratio. The benchmark
    // prints the figures.
    for p in points {
        assert!(n(p, "kvswitch_cpu_pct") > 0.0, "{p}");
    }
    check_plot(&dir, "cpu", &["agent (nf reqcache)".to_string()]);
    let _ = std::fs::remove_dir_all(dir);
}

/// AppSwitch's Table 1 in short: the switch routing each request by key beats the proxy hop
/// (nutcracker, the paper's McRouter) in requests per second and in the middle boxes' CPU per
/// request. Five short runs here gave the VIP over UDP 1.23x to 1.59x nutcracker's rate and
/// about 0.55x its CPU per request; over TCP the splice gave 1.03x to 1.58x, too close to
/// assert.
#[test]
fn appswitch_short() {
    let (dir, json) = run("appswitch", "kvba");
    assert_eq!(json["settings"]["get_ratio"], 0.5);
    assert_eq!(json["settings"]["servers"], 1);
    let medians = medians(&json);
    assert_eq!(
        medians.len(),
        5,
        "nutcracker, the VIP over UDP and TCP, direct over both"
    );
    let duration = json["settings"]["duration_s"].as_f64().unwrap();
    for p in medians {
        let figure = |f: &str| p[f].as_f64().unwrap_or(f64::NAN);
        assert!(figure("qps") > 0.0 && figure("mean_us") > 0.0, "{p}");
        // A lost datagram or two may time out on a busy machine; no more than 0.1%.
        assert!(figure("failed") <= figure("qps") * duration / 1000.0, "{p}");
    }
    let of = |system: &str, f: &str| {
        medians
            .iter()
            .find(|p| p["system"] == system)
            .and_then(|p| p[f].as_f64())
            .unwrap_or_else(|| panic!("{system} {f}"))
    };
    // One short run on a shared 2-core machine: the switch's rate was 0.96x to 1.4x
    // nutcracker's from run to run, so only a collapse is a failure here; the full bench
    // (`docs/results.md`) gives the ratio.
    assert!(
        of("kvswitch_udp", "qps") > 0.5 * of("nutcracker", "qps"),
        "the switch's route answers less than half the proxy's: {medians:?}"
    );
    assert!(
        of("kvswitch_udp", "middle_us") < of("nutcracker", "middle_us"),
        "and spends less CPU per request: {medians:?}"
    );
    let summary = std::fs::read_to_string(dir.join("summary.md")).unwrap();
    assert!(
        summary.contains("AppSwitch / McRouter (paper) | 1.83x"),
        "{summary}"
    );
    check_plot(&dir, "latency", &["mean".to_string(), "p99".to_string()]);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn fastpath_short() {
    let (dir, json) = run("fastpath", "kvbf");
    let medians = medians(&json);
    assert_eq!(
        medians.len(),
        12,
        "two datapaths, six targets each (the VIP and direct over UDP and TCP, nutcracker, the \
         VIP with the cache)"
    );
    for p in medians {
        assert!(p["get_rps"].as_f64().unwrap() > 0.0, "{p}");
        assert!(p["light_p50_us"].as_f64().unwrap() > 0.0, "{p}");
        assert!(p["machine_us"].as_f64().unwrap() > 0.0, "{p}");
        // The program's own run time is read only where it runs.
        match p["datapath"].as_str() {
            Some("xdp") => assert!(p["xdp_ns"].as_f64().unwrap() > 0.0, "{p}"),
            Some("af_packet") => assert!(p["xdp_ns"].is_null(), "{p}"),
            other => panic!("datapath {other:?}"),
        }
        // nutcracker's own CPU is read for nutcracker alone.
        let nutcracker = p["system"].as_str() == Some("nutcracker");
        assert_eq!(p["nutcracker_us"].is_null(), !nutcracker, "{p}");
    }
    check_plot(
        &dir,
        "cpu-per-get",
        &[
            "kvswitch process".to_string(),
            "nutcracker process".to_string(),
            "whole machine".to_string(),
        ],
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn forwarding_short() {
    let (dir, json) = run("forwarding", "kvbw");
    let medians = medians(&json);
    let sizes = json["settings"]["sizes"].as_array().expect("sizes").len();
    assert_eq!(medians.len(), 3 * sizes, "three systems, every size");
    for p in medians {
        // Every system forwards: what arrives is most of what was sent, never more.
        let (offered, forwarded) = (
            p["offered_fps"].as_f64().unwrap(),
            p["forwarded_fps"].as_f64().unwrap(),
        );
        assert!(forwarded > 0.0 && forwarded <= offered * 1.01, "{p}");
        assert!(p["rtt_us"].as_f64().unwrap() > 0.0, "{p}");
    }
    check_plot(&dir, "forwarding-rate", &["Linux bridge".to_string()]);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn bcube_short() {
    let (dir, json) = run("bcube", "kvbb");
    let medians = json["medians"].as_array().unwrap();
    let of = |role: &str| {
        medians
            .iter()
            .find(|m| m["role"] == role)
            .unwrap_or_else(|| panic!("no {role} in {medians:?}"))
    };
    let pct = |m: &serde_json::Value, part: &str| m[part].as_f64().unwrap();
    assert!(json["median_mbps"].as_f64().unwrap() > 1.0, "{json}");
    // The relays' cards forwarded the transfer; their hosts spent (next to) nothing on it,
    // while the ends' hosts did the header work. One clock tick over 2 s is 0.5%.
    let relay = of("relay");
    assert!(pct(relay, "card_pct") > 1.0, "{relay}");
    assert!(pct(relay, "host_pct") <= 2.0, "{relay}");
    assert!(
        pct(of("source"), "host_pct") > pct(relay, "host_pct"),
        "{medians:?}"
    );
    check_plot(
        &dir,
        "cpu",
        &[
            "card (kvswitch pipeline)".to_string(),
            "host (BCube header)".to_string(),
        ],
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn qcn_short() {
    let (dir, json) = run("qcn", "kvbq");
    let q_eq = json["settings"]["q_eq_bytes"].as_f64().unwrap();
    // Without congestion control the queue would fill its depth (a second at the lowest
    // rate) and drop; with QCN nothing is dropped, and in the second half of every step the
    // queue stays within 5 set points and the sender and receiver follow the port. (On a
    // loaded machine notifications come late and bunched, and a step's second second may
    // still be recovering from a deep cut: hence the wide lower bounds. With both cores
    // busy, a sender was seen at 0.27 of a 40 Mb/s port in the second half of its step.)
    assert_eq!(json["drops"], 0, "{}", json["steps"]);
    let steps = json["steps"].as_array().unwrap();
    assert_eq!(
        steps.len(),
        json["settings"]["steps_mbps"].as_array().unwrap().len()
    );
    for st in steps {
        let port = st["port_mbps"].as_f64().unwrap();
        let p90 = st["queue_p90"].as_f64().unwrap();
        assert!(p90 <= 5.0 * q_eq, "queue p90 {p90} past 5 x {q_eq}: {st}");
        let (sender, received) = (
            st["sender_mbps"].as_f64().unwrap(),
            st["received_mbps"].as_f64().unwrap(),
        );
        assert!(sender >= 0.2 * port && sender <= 1.3 * port, "{st}");
        assert!(received >= 0.2 * port && received <= 1.1 * port, "{st}");
    }
    // The agent may still answer frames queued when the sender stopped.
    let (sent, received) = (
        json["cp"]["notifications"].as_u64().unwrap(),
        json["notifications_received"].as_u64().unwrap(),
    );
    assert!(
        received > 0 && received <= sent,
        "{sent} sent, {received} received"
    );
    // The run's agent took its frames over the CPU channel.
    assert_eq!(json["over_channel"], true);
    assert!(json["echo_rtt_us"].as_f64().unwrap() > 0.0);
    // The delay and ServerSwitch's register test over each way: (mean, median, p99) of
    // each call.
    let ways = json["ways"].as_array().unwrap();
    let names: Vec<_> = ways.iter().map(|w| w["way"].as_str().unwrap()).collect();
    assert_eq!(names, ["http", "channel"]);
    for w in ways {
        assert!(w["query_rtt_us"].as_f64().unwrap() > 0.0, "{w}");
        for what in ["register_read_us", "register_write_us"] {
            let f = |i: usize| w[what][i].as_f64().unwrap_or(f64::NAN);
            assert!(f(0) > 0.0 && f(1) > 0.0, "{what}: {w}");
        }
    }
    check_plot(&dir, "queue", &["set point".to_string()]);
    check_plot(
        &dir,
        "rate",
        &["sender rate (QCN)".to_string(), "port rate".to_string()],
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn bad_arguments_are_refused_with_a_reason() {
    let bench = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_kvswitch"))
            .arg("bench")
            .args(args)
            .output()
            .expect("running kvswitch bench")
    };
    for (args, says) in [
        (&["skew", "--skews", "0,-1"][..], "Zipf exponent"),
        (&["latency-throughput", "--rates", "0"][..], "--rates"),
        (&["value-size", "--sizes", "20000"][..], "--sizes"),
        (&["cost", "--prefix", "Bad_Prefix"][..], "prefix"),
        (&["forwarding", "--sizes", "40"][..], "--sizes"),
        (&["qcn", "--steps-mbps", "500"][..], "--steps-mbps"),
        (&["qcn", "--payload", "4"][..], "--payload"),
        (
            &["appswitch", "--get-ratio", "1.5"][..],
            "a share from 0 to 1",
        ),
        (
            &["popularity-change", "--change-keys", "0"][..],
            "--change-keys",
        ),
        (&["fleet", "--switches", "0"][..], "--switches"),
    ] {
        let out = bench(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    let help = bench(&["--help"]);
    let text = String::from_utf8_lossy(&help.stdout);
    for s in [
        "latency-throughput",
        "value-size",
        "skew",
        "popularity-change",
        "cost",
        "fastpath",
        "forwarding",
        "qcn",
        "appswitch",
        "reqcache",
        "fleet",
        "all",
    ] {
        assert!(text.contains(s), "bench --help does not list {s}:\n{text}");
    }
}

#[test]
fn fleet_short() {
    let (_, json) = run("fleet", "kflt");
    let points = json["points"].as_array().expect("points");
    let sizes: Vec<(u64, &str)> = points
        .iter()
        .map(|p| (p["switches"].as_u64().unwrap(), p["mode"].as_str().unwrap()))
        .collect();
    assert_eq!(
        sizes,
        [(2, "each"), (2, "together"), (8, "each"), (8, "together")],
        "{json}"
    );
    for p in points {
        // Taken together, every switch reported when it took each change.
        if p["mode"] == "together" {
            assert!(p["skew_ms"].as_f64().is_some_and(|s| s >= 0.0), "{p}");
        }
        // Every change, added and removed, reached every switch, and took some time to.
        let times = p["reached_ms"].as_array().expect("times");
        assert_eq!(times.len(), 4, "{p}");
        for t in times {
            let ms = t.as_f64().expect("a time");
            assert!(ms > 0.0 && ms < 30_000.0, "{p}");
        }
        assert!(p["median_ms"].as_f64().unwrap() > 0.0, "{p}");
    }
}

#[test]
fn bounded_short() {
    let (dir, json) = run("bounded", "kbnd");
    let points = json["points"].as_array().expect("points");
    assert_eq!(points.len(), 4, "4 and 8 servers, two bounds: {json}");
    for p in points {
        let f = |k: &str| p[k].as_f64().unwrap_or_else(|| panic!("{k}: {p}"));
        let epsilon = f("epsilon");
        // Within 1 + ε, or the heaviest arc alone when that is more, and never worse than ketama.
        assert!(
            f("bounded_max_over_mean") <= (1.0 + epsilon).max(f("heaviest_arc_over_mean")) + 1e-9,
            "{p}"
        );
        assert!(
            f("bounded_max_over_mean") <= f("ketama_max_over_mean"),
            "{p}"
        );
        for change in ["add", "remove"] {
            for k in ["ketama_keys", "bounded_keys", "ketama_load", "bounded_load"] {
                let x = p[change][k].as_f64().unwrap();
                assert!(x > 0.0 && x < 1.0, "{change} {k}: {p}");
            }
        }
    }
    // At 4 and 8 servers ketama leaves the busiest past 1.25 times the mean; bounded loads do not.
    for p in points.iter().filter(|p| p["epsilon"] == 0.25) {
        assert!(p["ketama_max_over_mean"].as_f64().unwrap() > 1.25, "{p}");
        assert!(
            p["bounded_max_over_mean"].as_f64().unwrap() <= 1.25 + 1e-9,
            "{p}"
        );
    }
    let summary = std::fs::read_to_string(dir.join("summary.md")).expect("summary.md");
    assert!(summary.contains("| 8 | 0.25 |"), "{summary}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn fabric_short() {
    let (dir, json) = run("fabric", "kfd");
    let curves = json["curves"].as_array().unwrap();
    // Two rates and a closed loop, with and without the caches, in one rack and across two.
    assert_eq!(curves.len(), 3 * 2 * 2, "{json}");
    for p in curves {
        assert!(p["throughput_rps"].as_f64().unwrap() > 0.0, "{p}");
        assert!(p["mean_us"].as_f64().unwrap() > 0.0, "{p}");
    }
    assert_eq!(json["cache_size"].as_array().unwrap().len(), 4);
    assert_eq!(json["skew"].as_array().unwrap().len(), 4);
    let compute = json["compute"].as_array().unwrap();
    // A conditional put and an increment, each at the client, the server and in the network.
    assert_eq!(compute.len(), 6);
    for p in compute {
        assert!(p["ops_per_s"].as_f64().unwrap() > 0.0, "{p}");
    }
    // The IncBox split against one program per switch, at two skews: the split's switch
    // stage passes misses by, so fewer reads reach a processor; one program's reach it all.
    let incbox = json["incbox"].as_array().unwrap();
    assert_eq!(incbox.len(), 4, "{json}");
    for p in incbox {
        assert!(p["throughput_rps"].as_f64().unwrap() > 0.0, "{p}");
        let (steered, bypassed) = (
            p["steered"].as_u64().unwrap(),
            p["bypassed"].as_u64().unwrap(),
        );
        assert!(steered > 0, "{p}");
        if p["hit_check"] == true {
            assert!(bypassed > 0, "no miss passed the processors by: {p}");
        } else {
            assert_eq!(bypassed, 0, "{p}");
        }
    }
    // IncBricks' Figure 9: every SET answered; across racks the home holds each for the
    // invalidation of the copies its get filled (the client's ToR and a root), where within
    // the server's rack the only copy is the home's own, dropped at once.
    let sets = json["set_breakdown"].as_array().unwrap();
    assert_eq!(sets.len(), 4, "{json}");
    let at = |deployment: &str, caches: bool| {
        sets.iter()
            .find(|p| p["deployment"] == deployment && p["caches"] == caches)
            .unwrap_or_else(|| panic!("{deployment} {caches}: {json}"))
    };
    for p in sets {
        assert!(p["sets"].as_u64().unwrap() > 10, "{p}");
        assert!(p["server_us"].as_f64().unwrap() > 0.0, "{p}");
    }
    let (across, within) = (
        at("across", true)["held_us"].as_f64().unwrap(),
        at("within", true)["held_us"].as_f64().unwrap(),
    );
    assert!(
        across > within,
        "invalidations held the sets across racks: {across} µs against {within} µs within"
    );
    // Coherence protocols: under write-update the homes send stored values to the copies'
    // switches, whose next reads hit, so fewer requests reach a server than when the writes
    // only invalidate.
    let protocols = json["coherence"].as_array().unwrap();
    assert_eq!(protocols.len(), 2, "{json}");
    let by = |protocol: &str| {
        protocols
            .iter()
            .find(|p| p["protocol"] == protocol)
            .unwrap_or_else(|| panic!("{protocol}: {json}"))
    };
    let (invalidate, update) = (by("invalidate"), by("update"));
    assert_eq!(invalidate["updates_sent"], 0, "{invalidate}");
    assert!(update["updates_sent"].as_u64().unwrap() > 0, "{update}");
    let share = |p: &serde_json::Value| p["to_server_per_request"].as_f64().unwrap();
    assert!(
        share(update) < share(invalidate),
        "to a server per request: update {update}, invalidate {invalidate}"
    );
    let on_off = ["with the fabric's caches", "caches off (plain network)"].map(String::from);
    check_plot(&dir, "latency-throughput-within", &on_off);
    check_plot(&dir, "latency-throughput-across", &on_off);
    check_plot(&dir, "skew", &on_off);
    check_plot(
        &dir,
        "cache-size",
        &["ToR caches (roots 16,384)", "root caches (ToRs 512)"].map(String::from),
    );
    check_plot(&dir, "compute", &["thousand ops/s".to_string()]);
    let _ = std::fs::remove_dir_all(dir);
}
