//! One letter, one meaning: reads the `--help` of every tool and of every subcommand and fails
//! when a short option letter stands for two different things across the project (issue 14:
//! "-c is a packet count in rdma-capture and the threshold file in rdma-monitor"), or when the
//! rdma-core letters (-d device, -g GID index, -p port) are missing where they belong.
//!
//! A host test: it needs the workspace's binaries built (`cargo test --workspace` builds them).

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use secure_rdma_tests::bin_dir;

/// The tools a user runs.
const TOOLS: &[&str] = &[
    "secure-server",
    "secure-client",
    "rdma-monitor",
    "rdma-capture",
    "rdma-collector",
];

/// Long names that are one meaning under several spellings, each the convention of the tool
/// family it imitates: tcpdump's `-s` snap length and perftest's `-s` message size are both
/// "bytes per packet or operation"; perftest's `-n` is "how many", of whatever the bench counts.
const SAME_MEANING: &[(&str, &[&str])] = &[
    ("bytes per packet or operation", &["snaplen", "size"]),
    ("how many", &["iters", "connections", "sessions"]),
];

/// `--help` of `tool` followed by `path` (subcommands).
fn help(tool: &str, path: &[String]) -> String {
    let exe = bin_dir().join(tool);
    assert!(
        exe.exists(),
        "{} is not built: run `cargo build --workspace --bins` (cargo test --workspace does)",
        exe.display()
    );
    let out = Command::new(&exe)
        .args(path)
        .arg("--help")
        .output()
        .unwrap_or_else(|e| panic!("running {} --help: {e}", exe.display()));
    assert!(
        out.status.success(),
        "{tool} {} --help exited {:?}: {}",
        path.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("--help is UTF-8")
}

/// `(letter, long name)` of every option line such as `  -d, --device <NAME>`.
fn shorts(help: &str) -> Vec<(char, String)> {
    help.lines()
        .filter_map(|line| {
            let rest = line.trim_start().strip_prefix('-')?;
            let mut chars = rest.chars();
            let letter = chars.next()?;
            let long = chars.as_str().strip_prefix(", --")?;
            let long: String = long
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            letter.is_ascii_alphabetic().then_some((letter, long))
        })
        .collect()
}

/// Subcommand names listed under `Commands:` (clap's own `help` left out).
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| l.trim() != "Commands:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

/// Every `(tool + subcommand path, letter, long name)` of one tool, subcommands included.
fn all_shorts(tool: &str) -> Vec<(String, char, String)> {
    let mut found = Vec::new();
    let mut todo = vec![Vec::<String>::new()];
    while let Some(path) = todo.pop() {
        let text = help(tool, &path);
        let place = std::iter::once(tool.to_owned())
            .chain(path.iter().cloned())
            .collect::<Vec<_>>()
            .join(" ");
        for (letter, long) in shorts(&text) {
            found.push((place.clone(), letter, long));
        }
        for sub in subcommands(&text) {
            let mut deeper = path.clone();
            deeper.push(sub);
            todo.push(deeper);
        }
    }
    found
}

fn canonical(long: &str) -> &str {
    SAME_MEANING
        .iter()
        .find(|(_, spellings)| spellings.contains(&long))
        .map_or(long, |(meaning, _)| meaning)
}

#[test]
fn no_short_letter_means_two_things_across_the_tools() {
    let mut meanings: BTreeMap<char, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for tool in TOOLS {
        for (place, letter, long) in all_shorts(tool) {
            meanings
                .entry(letter)
                .or_default()
                .entry(canonical(&long).to_owned())
                .or_default()
                .insert(format!("{place} (--{long})"));
        }
    }
    let clashes: Vec<String> = meanings
        .iter()
        .filter(|(_, longs)| longs.len() > 1)
        .map(|(letter, longs)| format!("-{letter}: {longs:?}"))
        .collect();
    assert!(
        clashes.is_empty(),
        "letters with two meanings:\n{}",
        clashes.join("\n")
    );
    // The test can fail: the tools do use short letters, and -h is every tool's help.
    assert!(
        meanings
            .get(&'h')
            .is_some_and(|m| m.contains_key("help") && m["help"].len() >= TOOLS.len()),
        "every tool should list -h, --help: {:?}",
        meanings.get(&'h')
    );
}

#[test]
fn server_and_client_take_the_rdma_core_letters() {
    for tool in ["secure-server", "secure-client"] {
        let found = shorts(&help(tool, &[]));
        for (letter, long) in [('d', "device"), ('g', "gid-index"), ('p', "port")] {
            assert!(
                found.contains(&(letter, long.to_owned())),
                "{tool} should take -{letter}, --{long} (as rdma-core's tools do); it lists {found:?}"
            );
        }
    }
}

#[test]
fn the_parser_reads_clap_option_lines() {
    let text = "Options:\n  -d, --device <NAME>  RDMA device\n      --listen <ADDR:PORT>\n  -V, --version  Print version\n\nCommands:\n  bench  Benchmarks\n  help   Print this\n";
    assert_eq!(
        shorts(text),
        vec![('d', "device".to_owned()), ('V', "version".to_owned())]
    );
    assert_eq!(subcommands(text), vec!["bench".to_owned()]);
}
