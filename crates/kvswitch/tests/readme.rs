//! The README followed as a newcomer would: every `kvswitch` command in its shell blocks names
//! commands and options that exist, the files it tells one to make are made and pass their
//! checks, and its `kvswitch ctl` commands run against a switch.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_kvswitch");

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// One command of a shell block: its words (quotes taken off), what follows a `>` (the file
/// its output goes to), and the README's line it starts on.
#[derive(Debug)]
struct Line {
    words: Vec<String>,
    to_file: Option<String>,
    at: usize,
}

impl Line {
    /// The arguments after the word `kvswitch` (after `sudo`, `ip netns exec NS`); `None` for
    /// another program.
    fn kvswitch_args(&self) -> Option<&[String]> {
        let at = self.words.iter().position(|w| w == "kvswitch")?;
        let before = &self.words[..at];
        let wrapper = before
            .iter()
            .all(|w| ["sudo", "ip", "netns", "exec"].contains(&w.as_str()) || w.contains('-'));
        wrapper.then(|| &self.words[at + 1..])
    }
}

/// Splits one command into words as the shell would (quotes, no expansions), stopping at a
/// comment, a pipe or a `&&`; the file after a `>` is kept apart.
fn words(text: &str) -> (Vec<String>, Option<String>) {
    let mut out = Vec::new();
    let mut to_file = None;
    let mut word = String::new();
    let mut quote = None;
    let mut in_word = false;
    let mut redirect = false;
    let mut chars = text.chars().peekable();
    let mut finish = |word: &mut String, in_word: &mut bool, redirect: &mut bool| {
        if *in_word {
            if *redirect {
                to_file = Some(std::mem::take(word));
                *redirect = false;
            } else {
                out.push(std::mem::take(word));
            }
            *in_word = false;
        }
    };
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                in_word = true;
            }
            (None, ' ' | '\t') => finish(&mut word, &mut in_word, &mut redirect),
            (None, '#') if !in_word => break,
            (None, '|' | ';') => break,
            (None, '&') if chars.peek() == Some(&'&') => break,
            (None, '>') => {
                finish(&mut word, &mut in_word, &mut redirect);
                redirect = true;
            }
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    finish(&mut word, &mut in_word, &mut redirect);
    (out, to_file)
}

/// Every command of the README's `sh` blocks, continuation lines joined.
fn readme_lines() -> Vec<Line> {
    let text = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let mut lines = Vec::new();
    let mut in_block = false;
    let mut pending: Option<(String, usize)> = None;
    for (i, raw) in text.lines().enumerate() {
        if raw.starts_with("```") {
            in_block = raw == "```sh";
            continue;
        }
        if !in_block {
            continue;
        }
        let (mut text, at) = match pending.take() {
            Some((before, at)) => (format!("{before} {}", raw.trim()), at),
            None => (raw.trim().to_string(), i + 1),
        };
        if let Some(head) = text.strip_suffix('\\') {
            text = head.to_string();
            pending = Some((text, at));
            continue;
        }
        let (words, to_file) = words(&text);
        if !words.is_empty() {
            lines.push(Line { words, to_file, at });
        }
    }
    lines
}

fn kvswitch(args: &[String], dir: &Path) -> Output {
    Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .output()
        .expect("kvswitch runs")
}

fn said(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn the_readme_is_read_as_a_shell_would() {
    let (w, to) = words(
        r#"kvswitch ctl entry add acl --match "mc_request=text:get user:" --action drop  # why"#,
    );
    assert_eq!(
        w,
        [
            "kvswitch",
            "ctl",
            "entry",
            "add",
            "acl",
            "--match",
            "mc_request=text:get user:",
            "--action",
            "drop"
        ]
    );
    assert_eq!(to, None);
    let (w, to) = words("kvswitch run --example-config > kvswitch.toml   # edit");
    assert_eq!(w, ["kvswitch", "run", "--example-config"]);
    assert_eq!(to.as_deref(), Some("kvswitch.toml"));
    let (w, _) = words("kvswitch cache pin KEY | unpin KEY");
    assert_eq!(w, ["kvswitch", "cache", "pin", "KEY"]);
    let lines = readme_lines();
    assert!(
        lines.iter().filter(|l| l.kvswitch_args().is_some()).count() > 60,
        "{} kvswitch commands",
        lines.len()
    );
}

/// Every `kvswitch` command in the README, with `--help` added at its end, is taken by the
/// command line: its commands exist, and each option it gives exists and takes its value.
#[test]
fn every_kvswitch_command_in_the_readme_parses() {
    let mut wrong = Vec::new();
    let mut seen = 0;
    for line in readme_lines() {
        let Some(args) = line.kvswitch_args() else {
            continue;
        };
        seen += 1;
        let mut args = args.to_vec();
        args.push("--help".into());
        let out = kvswitch(&args, &root());
        if !out.status.success() {
            wrong.push(format!(
                "README.md:{}: kvswitch {}\n{}",
                line.at,
                args.join(" "),
                said(&out)
            ));
        }
    }
    assert!(seen > 60, "{seen} commands");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The files the README has one make (`kvswitch ... --example-config > FILE`) are made, and
/// each of its `--check` commands passes on them, run in one directory as a reader would.
#[test]
fn the_files_the_readme_makes_pass_its_checks() {
    let scratch = testbed::local::TempDir::new("kvswitch-readme").expect("scratch");
    let dir = scratch.path();
    std::fs::create_dir_all(dir.join("examples")).unwrap();
    for entry in std::fs::read_dir(root().join("examples")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.join("examples").join(path.file_name().unwrap())).unwrap();
    }
    let lines = readme_lines();
    let mut made = 0;
    for line in &lines {
        let (Some(args), Some(file)) = (line.kvswitch_args(), &line.to_file) else {
            continue;
        };
        if !args.iter().any(|a| a.starts_with("--example-")) {
            continue;
        }
        let out = kvswitch(args, dir);
        assert!(
            out.status.success(),
            "README.md:{}: {}",
            line.at,
            said(&out)
        );
        std::fs::write(dir.join(file), &out.stdout).unwrap();
        made += 1;
    }
    assert!(made >= 2, "{made} files made");
    let mut checked = 0;
    for line in &lines {
        let Some(args) = line.kvswitch_args() else {
            continue;
        };
        if !args.iter().any(|a| a == "--check") {
            continue;
        }
        let out = kvswitch(args, dir);
        assert!(
            out.status.success(),
            "README.md:{}: kvswitch {}: {}",
            line.at,
            args.join(" "),
            said(&out)
        );
        checked += 1;
    }
    assert!(checked >= 2, "{checked} checks");
}

/// The README's `kvswitch ctl` commands of "Changing it while it runs", in its order, against
/// a switch on a testbed: each one succeeds. Left out, each for a reason: `packet watch` runs
/// until stopped; `batch changes.json` and `counter delete NAME` name a file and a counter the
/// reader makes.
#[test]
fn the_readmes_ctl_commands_run_against_a_switch() {
    let live = common::testbed("krdm", "l3", false);
    let api = live.api().to_string();
    let token = live.state.api_token_file.clone();
    let lines = readme_lines();
    let start = lines
        .iter()
        .position(|l| l.words == ["kvswitch", "ctl", "tables"])
        .expect("the README's ctl block");
    let mut ran = 0;
    for line in &lines[start..] {
        let Some(args) = line.kvswitch_args() else {
            break;
        };
        if args.first().map(String::as_str) != Some("ctl") {
            break;
        }
        let joined = args.join(" ");
        if ["ctl packet watch", "ctl batch ", "ctl counter delete NAME"]
            .iter()
            .any(|skip| joined.starts_with(skip))
        {
            continue;
        }
        let mut args = args.to_vec();
        args.extend(["--api".to_string(), api.clone()]);
        if let Some(token) = &token {
            args.extend(["--token-file".to_string(), token.display().to_string()]);
        }
        let out = kvswitch(&args, &root());
        assert!(
            out.status.success(),
            "README.md:{}: kvswitch {joined}: {}",
            line.at,
            said(&out)
        );
        ran += 1;
    }
    assert!(ran >= 25, "{ran} ctl commands ran");
}
