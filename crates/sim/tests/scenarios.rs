//! Every scenario shipped in `scenarios/` runs in its small version (`[short]`) and shows the
//! qualitative result of the paper's figure it reproduces.

use std::collections::HashMap;
use std::path::PathBuf;

use config::scenario::{parse, parse_with};
use sim::Summary;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scenarios")
}

/// Runs by (variant, sweep value as written).
type ByRun<T> = HashMap<(String, String), T>;

/// Runs a shipped scenario's small version: (variant, x) → summary, and the series by run.
fn short(name: &str) -> (ByRun<Summary>, ByRun<String>) {
    let text = std::fs::read_to_string(dir().join(format!("{name}.toml"))).unwrap();
    let file = parse_with(&text, true).unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut out = HashMap::new();
    let mut series = HashMap::new();
    for r in &file.runs {
        let o = sim::run(r, 1, &mut |_| {}).unwrap();
        let at = (
            r.variant.clone(),
            r.x.map(|x| x.to_string()).unwrap_or_default(),
        );
        assert_eq!(
            o.summary.sent,
            o.summary.answered + o.summary.dropped + o.summary.in_flight
        );
        series.insert(at.clone(), o.series_csv);
        out.insert(at, o.summary);
    }
    (out, series)
}

fn at<'a>(runs: &'a ByRun<Summary>, variant: &str, x: &str) -> &'a Summary {
    runs.get(&(variant.to_string(), x.to_string()))
        .unwrap_or_else(|| {
            panic!(
                "no run {variant} at {x}: {:?}",
                runs.keys().collect::<Vec<_>>()
            )
        })
}

#[test]
fn every_shipped_scenario_parses_whole_and_short() {
    let mut n = 0;
    for entry in std::fs::read_dir(dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let text = std::fs::read_to_string(&path).unwrap();
            let whole = parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let small =
                parse_with(&text, true).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(!whole.runs.is_empty() && !small.runs.is_empty());
            n += 1;
        }
    }
    assert!(n >= 10, "{n} scenarios");
}

#[test]
fn every_shipped_scenario_gives_the_same_bytes_again_from_the_same_seed() {
    let mut n = 0;
    for entry in std::fs::read_dir(dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let file = parse_with(&text, true).unwrap();
        // The last run: the variant and sweep value furthest from the base.
        let run = file.runs.last().unwrap();
        let out = |seed| {
            let o = sim::run(run, seed, &mut |_| {}).unwrap();
            (
                config::scenario::summary_json(&o.summary),
                o.series_csv,
                sim::backends_csv(&o.backend_loads),
            )
        };
        let (a, b) = (out(11), out(11));
        assert!(a == b, "{}: two runs from seed 11 differ", path.display());
        n += 1;
    }
    assert!(n >= 10, "{n} scenarios");
}

#[test]
fn fig9_skew_piles_load_on_a_few_backends() {
    let (runs, _) = short("switchkv-fig9");
    let (uniform, zipf) = (at(&runs, "", "0"), at(&runs, "", "0.99"));
    assert!(uniform.imbalance < 1.4, "{uniform:?}");
    assert!(zipf.imbalance > 1.5, "{zipf:?}");
    assert!(zipf.throughput < 0.8 * uniform.throughput);
}

#[test]
fn fig10_the_cache_turns_skew_into_more_throughput() {
    let (runs, _) = short("switchkv-fig10");
    let (cache, none) = (at(&runs, "SwitchKV", "0.99"), at(&runs, "no cache", "0.99"));
    assert!(
        cache.throughput > 2.0 * none.throughput,
        "{} against {}",
        cache.throughput,
        none.throughput
    );
    assert!(cache.hit_ratio > 0.25 && cache.imbalance < none.imbalance);
    // Uniform: nothing to cache, the same throughput.
    let (cu, nu) = (at(&runs, "SwitchKV", "0"), at(&runs, "no cache", "0"));
    assert!((cu.throughput / nu.throughput - 1.0).abs() < 0.05);
}

#[test]
fn fig11_a_small_cache_balances_the_load() {
    let (runs, _) = short("switchkv-fig11");
    let (tiny, small) = (at(&runs, "", "10"), at(&runs, "", "1000"));
    assert!(
        small.throughput > 1.2 * tiny.throughput,
        "{} against {}",
        small.throughput,
        tiny.throughput
    );
    assert!(small.imbalance < tiny.imbalance && small.hit_ratio > tiny.hit_ratio);
}

#[test]
fn fig14_switchkv_scales_past_a_look_aside_cache() {
    let (runs, _) = short("switchkv-fig14");
    let (s, l) = (at(&runs, "SwitchKV", "64"), at(&runs, "look-aside", "64"));
    // The look-aside cache node takes every read and caps the system at its capacity.
    assert!(l.throughput < 110_000.0, "{l:?}");
    assert!(
        s.throughput > 2.0 * l.throughput,
        "{} against {}",
        s.throughput,
        l.throughput
    );
}

/// The lowest throughput in `(from, to]` over the mean in `(before, from]`.
fn dip(series: &str, before: f64, from: f64, to: f64) -> f64 {
    let t = sim::output::series_column(series, "throughput_rps").unwrap();
    let mean = sim::output::series_mean(series, "throughput_rps", before, from).unwrap();
    t.iter()
        .filter(|(x, _)| *x > from && *x <= to)
        .map(|p| p.1)
        .fold(f64::INFINITY, f64::min)
        / mean
}

#[test]
fn fig15_instant_reports_soften_a_hot_in_change() {
    let (_, series) = short("switchkv-fig15");
    let periodic = dip(
        &series[&("periodic only".to_string(), String::new())],
        2.5,
        4.0,
        5.0,
    );
    let both = dip(
        &series[&("SwitchKV".to_string(), String::new())],
        2.5,
        4.0,
        5.0,
    );
    assert!(periodic < 0.7, "{periodic}");
    assert!(both > periodic + 0.1, "{both} against {periodic}");
}

#[test]
fn fig16_and_fig17_instant_reports_alone_fall_short() {
    let (runs, _) = short("switchkv-fig16");
    assert!(at(&runs, "instant only", "").throughput < at(&runs, "SwitchKV", "").throughput);
    let (runs, _) = short("switchkv-fig17");
    let both = at(&runs, "SwitchKV", "").throughput;
    assert!(at(&runs, "periodic only", "").throughput < both);
}

#[test]
fn fig19_faster_changes_cost_throughput() {
    let (runs, _) = short("switchkv-fig19");
    for kind in ["hot-in", "hot-out", "random"] {
        let (slow, fast) = (at(&runs, kind, "10"), at(&runs, kind, "1000"));
        assert!(
            fast.throughput < slow.throughput,
            "{kind}: {} against {}",
            fast.throughput,
            slow.throughput
        );
    }
}

#[test]
fn incbricks_fig10_and_fig11_caches_cut_latency_more_with_skew() {
    let (runs, _) = short("incbricks-fig10");
    let (small, big_tor, big_root) = (
        at(&runs, "root 512", "512"),
        at(&runs, "root 512", "16384"),
        at(&runs, "root 16384", "512"),
    );
    // A bigger ToR cache answers more and faster; so does a bigger root cache.
    assert!(big_tor.tor_hits > small.tor_hits && big_tor.latency_mean_us < small.latency_mean_us);
    assert!(
        big_root.root_hits > small.root_hits && big_root.latency_mean_us < small.latency_mean_us,
        "{big_root:?} {small:?}"
    );
    // The ToR's size matters more than the root's: the same entries cut latency more at the
    // ToRs (IncBricks' Figure 10).
    assert!(
        big_tor.latency_mean_us < big_root.latency_mean_us,
        "ToRs of 16,384: {} µs; roots of 16,384: {} µs",
        big_tor.latency_mean_us,
        big_root.latency_mean_us
    );
    // What a bigger ToR answers no longer reaches a root, whose hits fall (IncBricks' reason
    // for its roots mattering little).
    for root in ["root 512", "root 4096", "root 16384"] {
        let (small, big) = (at(&runs, root, "512"), at(&runs, root, "16384"));
        assert!(big.root_hits < small.root_hits, "{root}: {big:?} {small:?}");
    }
    for s in runs.values() {
        assert_eq!(s.violations, 0, "{s:?}");
    }
    let (runs, _) = short("incbricks-fig11");
    let gain = |x: &str| {
        at(&runs, "no caches", x).latency_mean_us / at(&runs, "IncBricks", x).latency_mean_us
    };
    assert!(
        gain("0.99") > gain("0.5"),
        "{} against {}",
        gain("0.99"),
        gain("0.5")
    );
    assert!(at(&runs, "IncBricks", "0.99").hit_ratio > at(&runs, "IncBricks", "0.5").hit_ratio);
}

#[test]
fn a_fat_tree_shares_its_cores_and_survives_losing_one() {
    let (runs, _) = short("fat-tree");
    for x in ["0.5", "0.99"] {
        let (fat, flat) = (at(&runs, "fat-tree", x), at(&runs, "two-level tree", x));
        // The same caches answer as much; the fat-tree's aggregation level costs latency.
        assert!(
            (fat.hit_ratio - flat.hit_ratio).abs() < 0.03,
            "{fat:?} {flat:?}"
        );
        assert!(
            fat.latency_mean_us > flat.latency_mean_us + 6.0,
            "{fat:?} {flat:?}"
        );
        assert!(fat.root_imbalance < 1.5, "{fat:?}");
        assert_eq!(fat.violations, 0);
    }
    let (runs, series) = short("fat-tree-failure");
    let failed = at(&runs, "a core fails", "");
    assert!(
        failed.dropped_switch_down > 0 && failed.tables_installed > 0,
        "{failed:?}"
    );
    assert_eq!(failed.violations, 0, "{failed:?}");
    assert_eq!(at(&runs, "no failure", "").dropped, 0);
    let curve = &series[&("a core fails".to_string(), String::new())];
    // Down to a third at most while the ToRs still send a quarter of the keys to the lost
    // core, and back once its writes go on.
    assert!(dip(curve, 0.05, 0.2, 0.4) < 0.33, "{curve}");
    let mean = |from, to| sim::output::series_mean(curve, "throughput_rps", from, to).unwrap();
    assert!(mean(0.8, 1.0) > 0.95 * mean(0.05, 0.2), "{curve}");
}

#[test]
fn one_kvswitch_at_frame_level_answers_hot_keys_from_its_cache() {
    let (runs, _) = short("switch");
    let (cache, writes, none) = (
        at(&runs, "cache", "0.99"),
        at(&runs, "cache, 1% writes", "0.99"),
        at(&runs, "no cache", "0.99"),
    );
    for s in [cache, writes, none] {
        assert_eq!(s.violations, 0, "{s:?}");
    }
    assert_eq!(none.cache_hits, 0);
    // The busiest server sets the pace of the closed loop; the switch's cache takes the
    // hottest keys' reads off it.
    assert!(cache.hit_ratio > 0.15, "{cache:?}");
    assert!(
        cache.throughput > 1.4 * none.throughput,
        "{cache:?} {none:?}"
    );
    // Writes to a hot key close its copy until the write's reply has passed the switch, and
    // behind a saturated server that is most of the time: the cache helps far less.
    assert!(writes.hit_ratio < cache.hit_ratio, "{writes:?}");
    assert!(
        writes.throughput > none.throughput && writes.throughput < cache.throughput,
        "{writes:?}"
    );
}
