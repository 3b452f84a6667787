//! The simulator's files: a scenario's TOML (its base, `[[variant]]`s, `[sweep]` and
//! `[short]`) read into `sim`'s runs, and a run's summary written as JSON. The simulator
//! itself knows no file format; this is where its files meet it.

use sim::{File, Run, Scenario, Summary};

/// What is wrong with a scenario file.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("not TOML: {0}")]
    Toml(String),
    #[error("{0}")]
    Field(String),
}

fn field(msg: impl Into<String>) -> ScenarioError {
    ScenarioError::Field(msg.into())
}

/// Reads a scenario file's text: the base, `[[variant]]` tables (`name`, `set`: dotted keys to
/// values, `remove`: dotted keys to take away) and `[sweep]` (`key`, `values`).
pub fn parse(text: &str) -> Result<File, ScenarioError> {
    parse_with(text, false)
}

/// As [`parse`]; with `short`, the file's `[short]` table is applied first: its `set` (dotted
/// keys to values) and `values` (the sweep's values), a small version of the scenario for the
/// test suite and a quick look.
pub fn parse_with(text: &str, short: bool) -> Result<File, ScenarioError> {
    parse_set(text, short, &[])
}

/// As [`parse_with`], with `KEY=VALUE` settings (a dotted key, a TOML value) applied to the
/// base after `[short]`: `duration_s=15`, `cache.items=1000`.
pub fn parse_set(text: &str, short: bool, set: &[String]) -> Result<File, ScenarioError> {
    let mut root: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| ScenarioError::Toml(e.to_string()))?;
    let variants = root.remove("variant");
    let mut sweep = root.remove("sweep");
    let small = root.remove("short");
    if let (true, Some(small)) = (short, small) {
        let toml::Value::Table(mut small) = small else {
            return Err(field("short: must be a table"));
        };
        if let Some(set) = small.remove("set") {
            let toml::Value::Table(set) = set else {
                return Err(field("short.set: must be a table of dotted keys"));
            };
            for (k, value) in set {
                set_path(&mut root, &k, Some(value))
                    .map_err(|e| field(format!("short.set.\"{k}\": {e}")))?;
            }
        }
        if let Some(values) = small.remove("values") {
            match &mut sweep {
                Some(toml::Value::Table(s)) => {
                    s.insert("values".into(), values);
                }
                _ => return Err(field("short.values: the scenario has no sweep")),
            }
        }
        if let Some((k, _)) = small.iter().next() {
            return Err(field(format!(
                "short.{k}: unknown (short has set and values)"
            )));
        }
    }
    for kv in set {
        let Some((k, v)) = kv.split_once('=') else {
            return Err(field(format!("--set {kv}: expected KEY=VALUE")));
        };
        let value: toml::Table = format!("v = {v}").parse().map_err(|_| {
            field(format!(
                "--set {kv}: {v} is not a TOML value (quote strings)"
            ))
        })?;
        let value = value
            .get("v")
            .cloned()
            .unwrap_or(toml::Value::Boolean(false));
        set_path(&mut root, k.trim(), Some(value))
            .map_err(|e| field(format!("--set {kv}: {e}")))?;
    }
    let base = to_scenario(&root, "the scenario")?;
    let mut variants_list: Vec<(String, toml::Table)> = Vec::new();
    match variants {
        None => variants_list.push((String::new(), root.clone())),
        Some(toml::Value::Array(all)) => {
            for (i, v) in all.into_iter().enumerate() {
                let at = format!("variant[{i}]");
                let toml::Value::Table(mut v) = v else {
                    return Err(field(format!("{at}: must be a table")));
                };
                let name = match v.remove("name") {
                    Some(toml::Value::String(s)) if !s.is_empty() => s,
                    _ => return Err(field(format!("{at}.name: a non-empty string is required"))),
                };
                let mut table = root.clone();
                if let Some(set) = v.remove("set") {
                    let toml::Value::Table(set) = set else {
                        return Err(field(format!("{at}.set: must be a table of dotted keys")));
                    };
                    for (k, value) in set {
                        set_path(&mut table, &k, Some(value))
                            .map_err(|e| field(format!("{at}.set.\"{k}\": {e}")))?;
                    }
                }
                if let Some(remove) = v.remove("remove") {
                    let toml::Value::Array(keys) = remove else {
                        return Err(field(format!("{at}.remove: must be a list of dotted keys")));
                    };
                    for k in keys {
                        let toml::Value::String(k) = k else {
                            return Err(field(format!("{at}.remove: must be a list of strings")));
                        };
                        set_path(&mut table, &k, None)
                            .map_err(|e| field(format!("{at}.remove \"{k}\": {e}")))?;
                    }
                }
                if let Some((k, _)) = v.iter().next() {
                    return Err(field(format!(
                        "{at}.{k}: unknown (a variant has name, set and remove)"
                    )));
                }
                if variants_list.iter().any(|(n, _)| *n == name) {
                    return Err(field(format!("{at}.name: \"{name}\" is used twice")));
                }
                variants_list.push((name, table));
            }
            if variants_list.is_empty() {
                return Err(field("variant: an empty list; leave it out for one run"));
            }
        }
        Some(_) => return Err(field("variant: must be an array of tables ([[variant]])")),
    }
    let (sweep_key, values) = match sweep {
        None => (None, vec![None]),
        Some(toml::Value::Table(mut s)) => {
            let key: Vec<String> = match s.remove("key") {
                Some(toml::Value::String(k)) => vec![k],
                Some(toml::Value::Array(ks)) if !ks.is_empty() => ks
                    .into_iter()
                    .map(|k| match k {
                        toml::Value::String(k) => Ok(k),
                        _ => Err(field("sweep.key: a list of dotted keys must hold strings")),
                    })
                    .collect::<Result<_, _>>()?,
                _ => return Err(field("sweep.key: a dotted key such as \"workload.skew\" (or a list of them) is required")),
            };
            let values = match s.remove("values") {
                Some(toml::Value::Array(v)) if !v.is_empty() => v,
                _ => return Err(field("sweep.values: a non-empty list is required")),
            };
            if let Some((k, _)) = s.iter().next() {
                return Err(field(format!(
                    "sweep.{k}: unknown (a sweep has key and values)"
                )));
            }
            (Some(key), values.into_iter().map(Some).collect())
        }
        Some(_) => return Err(field("sweep: must be a table")),
    };
    let mut runs = Vec::new();
    for (name, table) in &variants_list {
        for value in &values {
            let mut t = table.clone();
            let mut x = None;
            let mut at = if name.is_empty() {
                "the scenario".to_string()
            } else {
                format!("variant \"{name}\"")
            };
            if let (Some(key), Some(value)) = (&sweep_key, value) {
                x = Some(match value {
                    toml::Value::Integer(i) => *i as f64,
                    toml::Value::Float(f) => *f,
                    _ => return Err(field(format!("sweep.values: {value} is not a number"))),
                });
                for k in key {
                    // A variant that took away the table a swept key is in (the cache) takes
                    // no part in the sweep: its line stays flat.
                    if !has_parent(&t, k) {
                        continue;
                    }
                    set_path(&mut t, k, Some(value.clone()))
                        .map_err(|e| field(format!("sweep.key \"{k}\": {e}")))?;
                }
                at = format!("{at} at {} = {value}", key[0]);
            }
            let scenario = to_scenario(&t, &at)?;
            runs.push(Run {
                variant: name.clone(),
                x,
                scenario,
            });
        }
    }
    Ok(File {
        runs,
        sweep: sweep_key.map(|k| k[0].clone()),
        base,
    })
}

fn to_scenario(table: &toml::Table, at: &str) -> Result<Scenario, ScenarioError> {
    let s: Scenario = toml::Value::Table(table.clone())
        .try_into()
        .map_err(|e: toml::de::Error| field(format!("{at}: {}", e.to_string().trim())))?;
    s.validate().map_err(|e| field(format!("{at}: {e}")))?;
    Ok(s)
}

/// Whether the table holding a dotted key's last part is there.
fn has_parent(table: &toml::Table, key: &str) -> bool {
    let parts: Vec<&str> = key.split('.').collect();
    let mut t = table;
    for p in &parts[..parts.len().saturating_sub(1)] {
        match t.get(*p) {
            Some(toml::Value::Table(inner)) => t = inner,
            _ => return false,
        }
    }
    true
}

/// Sets (or with `None` removes) the value at a dotted key, making tables on the way.
fn set_path(table: &mut toml::Table, key: &str, value: Option<toml::Value>) -> Result<(), String> {
    let parts: Vec<&str> = key.split('.').collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err("not a dotted key".into());
    }
    let mut t = table;
    for p in &parts[..parts.len() - 1] {
        let next = t
            .entry(p.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        t = match next {
            toml::Value::Table(inner) => inner,
            _ => return Err(format!("{p} is not a table")),
        };
    }
    let last = parts[parts.len() - 1];
    match value {
        Some(v) => {
            t.insert(last.to_string(), v);
        }
        None => {
            if t.remove(last).is_none() {
                return Err("not in the scenario".into());
            }
        }
    }
    Ok(())
}

/// The summary as JSON, fields in a fixed order.
pub fn summary_json(s: &Summary) -> String {
    let mut out = serde_json::to_string_pretty(s).unwrap_or_default();
    out.push('\n');
    out
}

/// A summary figure by name, for plots and sweeps' tables.
pub fn figure(s: &Summary, name: &str) -> Option<f64> {
    let v = serde_json::to_value(s).ok()?;
    v.get(name)?.as_f64()
}

#[cfg(test)]
mod tests {
    use super::*;
    use sim::scenario::{
        Backends, CacheNodes, Change, ChangeKind, ClientModel, Clients, Fabric, Workload,
    };

    /// The defaults a file leaves out are the simulator's `Default`s, which a caller that
    /// builds a scenario in code starts from.
    #[test]
    fn left_out_fields_take_the_simulators_defaults() {
        let file = parse(
            r#"
            name = "ahead"
            duration_s = 1.0
            [workload]
            keys = 100_000
            skew = 0.99
            [workload.change]
            kind = "hot-in"
            keys = 1000
            every_s = 1.0
            [clients]
            model = "open"
            rate = 10_000
            [backends]
            count = 8
            capacity = 10_000
            [cache]
            items = 100
            "#,
        )
        .unwrap();
        let built = Scenario {
            name: "ahead".into(),
            duration_s: 1.0,
            workload: Workload {
                keys: 100_000,
                skew: 0.99,
                change: Some(Change {
                    kind: ChangeKind::HotIn,
                    keys: 1000,
                    every_s: 1.0,
                    start_s: None,
                }),
                ..Workload::default()
            },
            clients: Clients {
                model: ClientModel::Open,
                rate: 10_000.0,
                ..Clients::default()
            },
            backends: Backends {
                count: 8,
                capacity: 10_000.0,
                ..Backends::default()
            },
            cache: Some(CacheNodes {
                items: 100,
                ..CacheNodes::default()
            }),
            ..Scenario::default()
        };
        assert_eq!(file.runs[0].scenario, built);
        let fabric: Fabric =
            toml::from_str("hosts_per_rack = 4\nservers = 8\ntor_items = 100\n").unwrap();
        assert_eq!(
            fabric,
            Fabric {
                hosts_per_rack: 4,
                servers: 8,
                tor_items: 100,
                ..Fabric::default()
            }
        );
    }

    #[test]
    fn the_summary_is_json_and_its_figures_are_found_by_name() {
        let s = Summary {
            throughput: 2.5,
            ..Summary::default()
        };
        assert!(summary_json(&s).contains("\"throughput\": 2.5"));
        assert_eq!(figure(&s, "throughput"), Some(2.5));
        assert_eq!(figure(&s, "no_such_figure"), None);
    }
}
