//! The simulator at frame level: IncBricks' fabric through the fabric's own switches,
//! repeatable, every request accounted for, and coherent by the history checker.

use config::scenario::parse;

const FABRIC: &str = r#"
name = "fabric"
level = "frame"
duration_s = 0.3
warmup_s = 0.1
[workload]
keys = 20_000
skew = 0.99
write_ratio = 0.1
value_size = 200
[clients]
model = "closed"
count = 60
think_us = 200
timeout_ms = 20
[network]
link_us = 5.0
[backends]
count = 4
capacity = 100_000
queue = 64
[fabric]
tors = 4
roots = 2
hosts_per_rack = 4
servers = 4
tor_items = 512
root_items = 2048
"#;

fn run(text: &str, seed: u64) -> sim::Outcome {
    let file = parse(text).expect("scenario");
    sim::run(&file.runs[0], seed, &mut |_| {}).expect("run")
}

#[test]
fn the_fabric_is_coherent_and_every_request_is_accounted_for() {
    let o = run(FABRIC, 1);
    let s = &o.summary;
    assert!(s.sent > 20_000, "{s:?}");
    assert_eq!(s.sent, s.answered + s.dropped + s.in_flight, "{s:?}");
    assert!(s.tor_hits > 0 && s.root_hits > 0, "{s:?}");
    // Every answer and every give-up, and the preload of each key read, are in the history.
    assert!(s.history_ops >= s.answered + s.dropped, "{s:?}");
    assert_eq!(s.violations, 0, "{s:?}");
    // The time series counts the switches' hits and the busiest server, bin by bin.
    let hits = sim::output::series_column(&o.series_csv, "hit_ratio").unwrap();
    assert!(hits.iter().any(|&(_, h)| h > 0.2), "{}", o.series_csv);
    let busiest = sim::output::series_column(&o.series_csv, "backend_max_rps").unwrap();
    assert!(busiest.iter().all(|&(_, b)| b > 0.0), "{}", o.series_csv);
}

#[test]
fn the_same_seed_gives_the_same_bytes_at_frame_level() {
    let a = run(FABRIC, 4);
    let b = run(FABRIC, 4);
    let c = run(FABRIC, 5);
    assert_eq!(
        config::scenario::summary_json(&a.summary),
        config::scenario::summary_json(&b.summary)
    );
    assert_eq!(a.series_csv, b.series_csv);
    assert_ne!(
        config::scenario::summary_json(&a.summary),
        config::scenario::summary_json(&c.summary)
    );
}

#[test]
fn caches_in_the_fabric_answer_reads_and_cut_latency() {
    let off = FABRIC
        .replace("tor_items = 512", "tor_items = 0")
        .replace("root_items = 2048", "root_items = 0");
    let (with, without) = (run(FABRIC, 2).summary, run(&off, 2).summary);
    assert_eq!(without.cache_hits, 0);
    assert!(with.hit_ratio > 0.3, "{with:?}");
    assert!(
        with.latency_mean_us < without.latency_mean_us,
        "{} against {}",
        with.latency_mean_us,
        without.latency_mean_us
    );
    assert_eq!(without.violations, 0);
}

#[test]
fn the_servers_racks_cache_only_what_server_tor_items_allows() {
    // Servers in the first rack, clients in the other three.
    let cross = FABRIC.replace("root_items = 2048", "root_items = 0\ncross_rack = true");
    let hits = |text: &str| {
        let s = run(text, 3).summary;
        assert_eq!(s.violations, 0, "{s:?}");
        s.tor_hits
    };
    let every_tor = hits(&cross);
    let clients_only = hits(&cross.replace(
        "cross_rack = true",
        "cross_rack = true\nserver_tor_items = 0",
    ));
    let servers_only =
        hits(&cross.replace("tor_items = 512", "tor_items = 0\nserver_tor_items = 512"));
    // The servers' ToR sees every rack's misses: it answers some of them, and nothing when
    // told to cache nothing.
    assert!(servers_only > 0, "{servers_only}");
    assert!(
        clients_only < every_tor && every_tor < clients_only + servers_only,
        "{clients_only} + {servers_only} against {every_tor}"
    );
    let none = hits(&cross.replace("tor_items = 512", "tor_items = 0\nserver_tor_items = 0"));
    assert_eq!(none, 0);
}

#[test]
fn a_switch_processor_of_limited_capacity_queues_its_frames_and_drops_past_its_queue() {
    let (free, limited) = (
        run(FABRIC, 3).summary,
        run(
            &FABRIC.replace(
                "root_items = 2048",
                "root_items = 2048\nswitch_capacity = 200_000",
            ),
            3,
        )
        .summary,
    );
    assert_eq!((free.tor_sojourn_us, free.dropped_switch_queue), (0.0, 0));
    // Each frame takes 5 µs of its processor at least, and waits behind the others.
    assert!(
        limited.tor_sojourn_us >= 5.0 && limited.root_sojourn_us >= 5.0,
        "{limited:?}"
    );
    assert!(
        limited.latency_mean_us > free.latency_mean_us + 10.0,
        "{limited:?}"
    );
    assert_eq!(limited.dropped_switch_queue, 0, "{limited:?}");
    // A processor far too slow for its load, with room for 4 frames: the rest are dropped and
    // counted, their requests time out, and every request is still accounted for.
    let starved = run(
        &FABRIC.replace(
            "root_items = 2048",
            "root_items = 2048\nswitch_capacity = 20_000\nswitch_queue = 4",
        ),
        3,
    )
    .summary;
    assert!(starved.dropped_switch_queue > 100, "{starved:?}");
    assert!(starved.dropped > 0, "{starved:?}");
    assert_eq!(
        starved.sent,
        starved.answered + starved.dropped + starved.in_flight,
        "{starved:?}"
    );
    assert_eq!(starved.violations, 0, "{starved:?}");
}

/// The same racks and caches as a k = 4 fat-tree, as a two-level tree.
fn fat_tree(text: &str) -> String {
    text.replace("tors = 4\nroots = 2", "topology = \"fat-tree\"\nk = 4")
}

#[test]
fn a_fat_tree_spreads_keys_over_its_cores_and_pays_for_its_extra_level() {
    let tree = FABRIC.replace("tors = 4\nroots = 2", "tors = 8\nroots = 4");
    let (flat, fat) = (run(&tree, 6).summary, run(&fat_tree(FABRIC), 6).summary);
    for s in [&flat, &fat] {
        assert_eq!(s.sent, s.answered + s.dropped + s.in_flight, "{s:?}");
        assert!(s.tor_hits > 0 && s.root_hits > 0, "{s:?}");
        assert_eq!(s.violations, 0, "{s:?}");
    }
    // Each key crosses the core the registration table designates: the four cores (four
    // paths between two pods) share the load.
    assert!(fat.root_imbalance < 1.5, "{fat:?}");
    // The same switches cache the same keys...
    assert!(
        (fat.hit_ratio - flat.hit_ratio).abs() < 0.05,
        "{fat:?} {flat:?}"
    );
    // ...but a request that crosses a core also crosses two aggregation switches each way (a
    // link of 5 µs and a switch's 1 µs each).
    assert!(
        fat.latency_mean_us > flat.latency_mean_us + 6.0,
        "{} against {}",
        fat.latency_mean_us,
        flat.latency_mean_us
    );
    let again = run(&fat_tree(FABRIC), 6).summary;
    assert_eq!(
        config::scenario::summary_json(&fat),
        config::scenario::summary_json(&again)
    );
}

#[test]
fn a_fat_tree_that_loses_a_core_detours_and_recovers_once_the_controller_names_it() {
    let text = fat_tree(FABRIC)
        .replace("duration_s = 0.3", "duration_s = 0.8\nbin_ms = 50")
        .replace(
            "root_items = 2048",
            "root_items = 2048\nlease_ms = 100\nfail_root = 0\nfail_at_s = 0.15\ncontroller_ms = 300",
        );
    let o = run(&text, 8);
    let s = &o.summary;
    assert_eq!(s.sent, s.answered + s.dropped + s.in_flight, "{s:?}");
    assert_eq!(s.violations, 0, "{s:?}");
    assert!(s.dropped_switch_down > 0 && s.detours > 0, "{s:?}");
    // Every switch but the failed core took the controller's table.
    assert_eq!(s.tables_installed, 8 + 4 - 1, "{s:?}");
    let mean =
        |from, to| sim::output::series_mean(&o.series_csv, "throughput_rps", from, to).unwrap();
    let (before, after_fail, recovered) = (mean(0.05, 0.15), mean(0.15, 0.2), mean(0.65, 0.8));
    // A quarter of the keys' requests are lost until the ToRs find the core gone (200 ms
    // without its greetings) and send them by other cores (the detours); writes wait for its
    // ACKs until a lease after the controller named it (at 0.45 s); then the three cores
    // left carry everything.
    assert!(
        after_fail < 0.8 * before,
        "{before} {after_fail} {recovered}"
    );
    assert!(
        recovered > 0.9 * before,
        "{before} {after_fail} {recovered}"
    );
    // The failure's aftermath (writes released, relays acknowledged) comes in the same order
    // every run: the same seed gives the same bytes.
    let again = run(&text, 8);
    assert_eq!(again.series_csv, o.series_csv);
    assert_eq!(format!("{:?}", again.summary), format!("{s:?}"));
}

#[test]
fn frame_level_scenarios_are_checked() {
    for (from, to, want) in [
        (
            "model = \"closed\"",
            "model = \"open\"\nrate = 1000",
            "closed-loop",
        ),
        ("value_size = 200", "value_size = 5000", "value_size"),
        ("servers = 4", "servers = 16", "fabric.servers"),
        ("roots = 2", "roots = 2\nk = 4", "fabric.k"),
        (
            "tors = 4\nroots = 2",
            "topology = \"fat-tree\"\nk = 3",
            "fabric.k",
        ),
        (
            "tors = 4\nroots = 2",
            "topology = \"fat-tree\"\nk = 4\ntors = 8",
            "follow from fabric.k",
        ),
        ("tors = 4\nroots = 2", "topology = \"mesh\"", "topology"),
        (
            "roots = 2",
            "roots = 2\ntopology = \"switch\"",
            "single switch",
        ),
        (
            "tors = 4\nroots = 2",
            "topology = \"switch\"",
            "fabric.root_items: a single switch has no root",
        ),
        ("roots = 2", "roots = 2\nfail_root = 2", "fabric.fail_root"),
        (
            "roots = 2",
            "roots = 2\nserver_tor_items = 0",
            "server_tor_items needs cross_rack",
        ),
        (
            "roots = 2",
            "roots = 2\ncontroller_ms = 10",
            "needs fabric.fail_root",
        ),
        ("roots = 2", "roots = 2\nlease_ms = 0", "fabric.lease_ms"),
        (
            "roots = 2",
            "roots = 2\nfail_at_s = 0.1",
            "needs fabric.fail_root",
        ),
        (
            "tors = 4\nroots = 2",
            "topology = \"switch\"\nfail_root = 0",
            "a single switch has no root",
        ),
        (
            "tors = 4\nroots = 2\nhosts_per_rack = 4",
            "topology = \"fat-tree\"\nk = 16\nhosts_per_rack = 200",
            "fabric.hosts_per_rack",
        ),
        (
            "root_items = 2048",
            "root_items = 2048\nswitch_capacity = 0.5",
            "fabric.switch_capacity",
        ),
        (
            "root_items = 2048",
            "root_items = 2048\nswitch_queue = 0",
            "fabric.switch_queue",
        ),
        (
            "root_items = 2048",
            "root_items = 2048\n[cache]\nitems = 10",
            "[cache]",
        ),
    ] {
        let err = parse(&FABRIC.replace(from, to))
            .map(|_| ())
            .expect_err(want)
            .to_string();
        assert!(err.contains(want), "{want}: {err}");
    }
    let err = parse(&FABRIC.replace("[fabric]", "[fabric_]"))
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(err.contains("fabric"), "{err}");
}
