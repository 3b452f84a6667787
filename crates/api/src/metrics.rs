//! The one writer of Prometheus' text exposition (format 0.0.4) behind every `/metrics` of
//! kvswitch: the switch's, the proxy's, the cache node's, the fabric switch's and the
//! controller's. It escapes help texts and label values as the format asks, keeps each family's
//! samples under its `# HELP` and `# TYPE`, names counters with `_total`, writes histograms as
//! cumulative buckets with `_sum` and `_count`, and adds what every Prometheus exporter is
//! expected to give: `kvswitch_build_info` and the `process_*` families.
//!
//! ```
//! use api::metrics::{Exposition, Kind};
//! let mut m = Exposition::new();
//! m.family("kvswitch_demo_requests_total", Kind::Counter, "Requests seen.");
//! m.sample("kvswitch_demo_requests_total", &[("pool", "a\"b")], 3);
//! assert!(m.finish().contains("kvswitch_demo_requests_total{pool=\"a\\\"b\"} 3\n"));
//! ```

use std::fmt::{Display, Write as _};

/// The content type of the exposition.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A family's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (but for a restart); its name ends in `_total`.
    Counter,
    /// Goes up and down.
    Gauge,
    /// Observations counted into buckets.
    Histogram,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// An exposition being written.
#[derive(Default)]
pub struct Exposition {
    out: String,
}

impl Exposition {
    pub fn new() -> Exposition {
        Exposition {
            out: String::with_capacity(4096),
        }
    }

    /// Starts the family `name`; its samples follow. A counter's name must end in `_total`.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) -> &mut Exposition {
        debug_assert!(valid_name(name), "metric name {name:?}");
        debug_assert!(
            kind != Kind::Counter || name.ends_with("_total"),
            "counter {name} must end in _total"
        );
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        // Writing to a String cannot fail.
        let _ = writeln!(
            self.out,
            "# HELP {name} {help}\n# TYPE {name} {}",
            kind.name()
        );
        self
    }

    /// One sample of the family just started (or, for a histogram, one of its series).
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl Display) {
        self.out.push_str(name);
        write_labels(&mut self.out, labels, None);
        let _ = writeln!(self.out, " {value}");
    }

    /// The families `<side>_handshakes_total` and `<side>_reloads_total` of a TLS
    /// configuration in use, by outcome, with their helps.
    pub fn tls(&mut self, side: &str, helps: [&str; 2], counts: &tls::Counts) {
        let name = format!("{side}_handshakes_total");
        self.family(&name, Kind::Counter, helps[0]);
        for (outcome, n) in counts.handshakes {
            self.sample(&name, &[("outcome", outcome)], n);
        }
        let name = format!("{side}_reloads_total");
        self.family(&name, Kind::Counter, helps[1]);
        for (outcome, n) in counts.reloads {
            self.sample(&name, &[("outcome", outcome)], n);
        }
    }

    /// A family of one sample with no labels.
    pub fn single(&mut self, name: &str, kind: Kind, help: &str, value: impl Display) {
        self.family(name, kind, help);
        self.sample(name, &[], value);
    }

    /// One histogram of the family `name` just started: `buckets` are the upper bounds with
    /// the count of observations at most that bound (cumulative), `sum` and `count` over all
    /// observations. The `+Inf` bucket is written from `count`.
    pub fn histogram(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        buckets: &[(f64, u64)],
        sum: f64,
        count: u64,
    ) {
        let bucket = format!("{name}_bucket");
        for (le, n) in buckets {
            self.out.push_str(&bucket);
            write_labels(&mut self.out, labels, Some(&le.to_string()));
            let _ = writeln!(self.out, " {n}");
        }
        self.out.push_str(&bucket);
        write_labels(&mut self.out, labels, Some("+Inf"));
        let _ = writeln!(self.out, " {count}");
        self.sample(&format!("{name}_sum"), labels, sum);
        self.sample(&format!("{name}_count"), labels, count);
    }

    /// `kvswitch_build_info` (with `component`: which of kvswitch's services this is) and the
    /// `process_*` families of this process (from `/proc/self`; a value that cannot be read is
    /// left out).
    pub fn standard(&mut self, component: &str) {
        self.family(
            "kvswitch_build_info",
            Kind::Gauge,
            "Always 1; the labels say which kvswitch and which of its services this is.",
        );
        self.sample(
            "kvswitch_build_info",
            &[
                ("version", env!("CARGO_PKG_VERSION")),
                ("component", component),
            ],
            1,
        );
        let p = process();
        if let Some(cpu) = p.cpu_seconds {
            self.single(
                "process_cpu_seconds_total",
                Kind::Counter,
                "User and system CPU time spent, in seconds.",
                cpu,
            );
        }
        if let Some(rss) = p.resident_bytes {
            self.single(
                "process_resident_memory_bytes",
                Kind::Gauge,
                "Resident memory size in bytes.",
                rss,
            );
        }
        if let Some(vsz) = p.virtual_bytes {
            self.single(
                "process_virtual_memory_bytes",
                Kind::Gauge,
                "Virtual memory size in bytes.",
                vsz,
            );
        }
        if let Some(start) = p.start_time_seconds {
            self.single(
                "process_start_time_seconds",
                Kind::Gauge,
                "Start time of the process since the Unix epoch, in seconds.",
                start,
            );
        }
        if let Some(fds) = p.open_fds {
            self.single(
                "process_open_fds",
                Kind::Gauge,
                "Open file descriptors.",
                fds,
            );
        }
        if let Some(max) = p.max_fds {
            self.single(
                "process_max_fds",
                Kind::Gauge,
                "The limit of open file descriptors.",
                max,
            );
        }
        if let Some(threads) = p.threads {
            self.single(
                "process_threads",
                Kind::Gauge,
                "Threads of the process.",
                threads,
            );
        }
    }

    /// The text written so far.
    pub fn finish(self) -> String {
        self.out
    }
}

/// Checks an exposition against the conventions this module writes by: every sample under its
/// family's `# HELP` and `# TYPE`, each family declared once, counters named `_total`,
/// histograms with `_bucket` (with `le`), `_sum` and `_count`, label values quoted and
/// escaped, values numbers, and `kvswitch_build_info` present. The first fault found, with
/// its line.
pub fn lint(text: &str) -> Result<(), String> {
    let mut seen = std::collections::HashSet::new();
    let mut current: Option<(String, String)> = None;
    let mut help_for: Option<String> = None;
    for (n, line) in text.lines().enumerate() {
        let at = |why: String| format!("line {}: {why}: {line:?}", n + 1);
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap_or("");
            if !valid_name(name) {
                return Err(at("bad family name".into()));
            }
            help_for = Some(name.to_string());
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            if help_for.as_deref() != Some(name) {
                return Err(at("a TYPE without its HELP just before".into()));
            }
            if !seen.insert(name.to_string()) {
                return Err(at("family declared twice".into()));
            }
            match kind {
                "counter" if !name.ends_with("_total") => {
                    return Err(at("a counter not named _total".into()))
                }
                "counter" | "gauge" | "histogram" => {}
                _ => return Err(at(format!("unknown type {kind:?}"))),
            }
            current = Some((name.to_string(), kind.to_string()));
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let Some((family, kind)) = &current else {
            return Err(at("a sample before any family".into()));
        };
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let name = &line[..name_end];
        let (labels, value) = match line[name_end..].strip_prefix('{') {
            Some(rest) => {
                let end = label_end(rest).ok_or_else(|| at("unterminated labels".into()))?;
                (&rest[..end], rest[end + 1..].trim_start())
            }
            None => ("", line[name_end..].trim_start()),
        };
        let belongs = match kind.as_str() {
            "histogram" => ["_bucket", "_sum", "_count"]
                .iter()
                .any(|s| name.strip_suffix(s) == Some(family)),
            _ => name == family,
        };
        if !belongs {
            return Err(at(format!("a sample outside its family {family}")));
        }
        if kind == "histogram" && name.ends_with("_bucket") && !labels.contains("le=\"") {
            return Err(at("a bucket without le".into()));
        }
        check_labels(labels).map_err(at)?;
        let number = match value {
            "+Inf" | "-Inf" | "NaN" => true,
            v => v.parse::<f64>().is_ok(),
        };
        if !number {
            return Err(at("the value is not a number".into()));
        }
    }
    if !seen.contains("kvswitch_build_info") {
        return Err("no kvswitch_build_info".into());
    }
    Ok(())
}

/// Where the label set that `rest` starts ends (the index of its `}`).
fn label_end(rest: &str) -> Option<usize> {
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in rest.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '}' if !quoted => return Some(i),
            _ => {}
        }
    }
    None
}

/// `k="v",k2="v2"`, values with only `\\`, `\"` and `\n` escapes.
fn check_labels(labels: &str) -> Result<(), String> {
    let mut rest = labels;
    while !rest.is_empty() {
        let (key, after) = rest
            .split_once("=\"")
            .ok_or_else(|| "a label without =\"".to_string())?;
        if !valid_name(key) || key.contains(':') {
            return Err(format!("bad label name {key:?}"));
        }
        let mut chars = after.char_indices();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, '\\' | '"' | 'n')) => {}
                    _ => return Err("a bad escape in a label value".into()),
                },
                '"' => {
                    end = Some(i);
                    break;
                }
                '\n' => return Err("a newline in a label value".into()),
                _ => {}
            }
        }
        let end = end.ok_or_else(|| "an unterminated label value".to_string())?;
        rest = &after[end + 1..];
        if let Some(next) = rest.strip_prefix(',') {
            rest = next;
        } else if !rest.is_empty() {
            return Err("labels not separated by commas".into());
        }
    }
    Ok(())
}

/// Letters, digits, `_` and `:`, not starting with a digit.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn write_labels(out: &mut String, labels: &[(&str, &str)], le: Option<&str>) {
    if labels.is_empty() && le.is_none() {
        return;
    }
    out.push('{');
    let mut first = true;
    for (k, v) in labels.iter().copied().chain(le.map(|le| ("le", le))) {
        if !first {
            out.push(',');
        }
        first = false;
        out.push_str(k);
        out.push_str("=\"");
        for c in v.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '"' => out.push_str("\\\""),
                '\n' => out.push_str("\\n"),
                c => out.push(c),
            }
        }
        out.push('"');
    }
    out.push('}');
}

/// What `/proc/self` says of this process.
#[derive(Default)]
struct Process {
    cpu_seconds: Option<f64>,
    resident_bytes: Option<u64>,
    virtual_bytes: Option<u64>,
    start_time_seconds: Option<f64>,
    open_fds: Option<u64>,
    max_fds: Option<u64>,
    threads: Option<u64>,
}

fn process() -> Process {
    let mut p = Process::default();
    // SAFETY: sysconf reads a configuration value and has no other effect.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    // SAFETY: as above.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    if let Ok(stat) = std::fs::read_to_string("/proc/self/stat") {
        // The fields after the command name, which is in parentheses and may hold spaces.
        let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
        let f: Vec<&str> = rest.split_whitespace().collect();
        // Field n of proc(5) is f[n - 3].
        let num = |n: usize| f.get(n - 3).and_then(|v| v.parse::<u64>().ok());
        if let (Some(utime), Some(stime)) = (num(14), num(15)) {
            if ticks > 0.0 {
                p.cpu_seconds = Some((utime + stime) as f64 / ticks);
            }
        }
        p.threads = num(20);
        p.virtual_bytes = num(23);
        p.resident_bytes = num(24).map(|pages| pages * page);
        if let (Some(start), Some(boot)) = (num(22), boot_time()) {
            if ticks > 0.0 {
                p.start_time_seconds = Some(boot as f64 + start as f64 / ticks);
            }
        }
    }
    p.open_fds = std::fs::read_dir("/proc/self/fd")
        .ok()
        .map(|d| d.count() as u64);
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the limit into the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 {
        p.max_fds = Some(limit.rlim_cur);
    }
    p
}

/// The system's boot time, seconds since the Unix epoch (`btime` of `/proc/stat`).
fn boot_time() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_help_are_escaped() {
        let mut m = Exposition::new();
        m.family("x_total", Kind::Counter, "a \\ b\nc");
        m.sample("x_total", &[("k", "q\"\\\nz"), ("j", "v")], 2);
        assert_eq!(
            m.finish(),
            "# HELP x_total a \\\\ b\\nc\n# TYPE x_total counter\n\
             x_total{k=\"q\\\"\\\\\\nz\",j=\"v\"} 2\n"
        );
    }

    #[test]
    fn a_histogram_ends_with_inf_sum_and_count() {
        let mut m = Exposition::new();
        m.family("t_seconds", Kind::Histogram, "Time.");
        m.histogram(
            "t_seconds",
            &[("s", "a")],
            &[(0.001, 2), (0.01, 5)],
            0.03,
            6,
        );
        let text = m.finish();
        assert!(
            text.contains("t_seconds_bucket{s=\"a\",le=\"0.001\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("t_seconds_bucket{s=\"a\",le=\"+Inf\"} 6\n"),
            "{text}"
        );
        assert!(text.contains("t_seconds_sum{s=\"a\"} 0.03\n"), "{text}");
        assert!(text.ends_with("t_seconds_count{s=\"a\"} 6\n"), "{text}");
    }

    #[test]
    fn what_it_writes_passes_the_lint_and_faults_do_not() {
        let mut m = Exposition::new();
        m.family("a_total", Kind::Counter, "A.");
        m.sample("a_total", &[("k", "x\"}\\\n,y")], 1);
        m.family("t_seconds", Kind::Histogram, "T.");
        m.histogram("t_seconds", &[], &[(0.5, 1)], 0.25, 1);
        m.standard("test");
        let good = m.finish();
        assert_eq!(lint(&good), Ok(()), "{good}");
        for (bad, why) in [
            ("# HELP a A.\n# TYPE a counter\na 1\n", "_total"),
            (
                "# HELP a_total A.\n# TYPE a_total counter\nb_total 1\n",
                "outside",
            ),
            ("x 1\n", "before any family"),
            ("# HELP g G.\n# TYPE g gauge\ng{k=\"v} 1\n", "unterminated"),
            ("# HELP g G.\n# TYPE g gauge\ng{k=\"\\q\"} 1\n", "escape"),
            ("# HELP g G.\n# TYPE g gauge\ng one\n", "number"),
            (
                "# HELP g G.\n# TYPE g gauge\n# HELP g G.\n# TYPE g gauge\n",
                "twice",
            ),
            ("# HELP h H.\n# TYPE h histogram\nh_bucket 1\n", "le"),
        ] {
            let text = format!("{bad}{good}");
            let e = lint(&text).expect_err(bad);
            assert!(e.contains(why), "{bad:?}: {e}");
        }
        assert!(lint("").unwrap_err().contains("kvswitch_build_info"));
    }

    #[test]
    fn the_standard_families_describe_this_process() {
        let mut m = Exposition::new();
        m.standard("test");
        let text = m.finish();
        assert!(text.contains("kvswitch_build_info{version=\""), "{text}");
        assert!(text.contains("component=\"test\"} 1\n"), "{text}");
        let value = |name: &str| -> f64 {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{name} ")))
                .unwrap_or_else(|| panic!("{name} missing from {text}"))
                .parse()
                .unwrap()
        };
        assert!(value("process_resident_memory_bytes") > 1_000_000.0);
        assert!(value("process_open_fds") >= 3.0);
        assert!(value("process_max_fds") >= value("process_open_fds"));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let start = value("process_start_time_seconds");
        assert!(
            start <= now + 1.0 && start > now - 3600.0,
            "{start} vs {now}"
        );
    }
}
