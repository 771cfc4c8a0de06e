//! Faults without an attacker in the lab VM: packets dropped by an nftables rule.
//!
//! The server and the client share one kernel, but the lab's policy routing sends what one
//! address sends the other out of its veth (`scripts/softroce-vm.sh`): the server's packets to
//! 10.77.0.2 leave through `veth-a`, so the `output` hook sees them with the server's source
//! port, exactly as on a server host.

use std::process::{Command, Stdio};

use crate::text;

/// A drop rule in a table of its own, removed when dropped (a failing test leaves no rule
/// behind to break the next one).
pub struct NftDrop {
    /// `inet` (the output hook) or `netdev` (an interface's ingress hook).
    family: &'static str,
    table: String,
}

impl NftDrop {
    /// Drops the packets this host sends that match `matches` (nft syntax, e.g.
    /// `ip daddr 10.77.0.2 tcp sport 4700`), counting them. `table` names the rule's table
    /// (`inet TABLE`); one per test, so that tests never remove each other's rules.
    pub fn output(table: &str, matches: &str) -> NftDrop {
        NftDrop::install(
            "inet",
            table,
            "type filter hook output priority 0; policy accept;",
            matches,
        )
    }

    /// Drops RoCEv2 (UDP 4791) from `src` to `dst` as it arrives on `iface`: the ingress hook
    /// (family netdev) sees every frame the peer sent, whichever socket made it (rxe sends
    /// from the kernel, past the output hook's socket view).
    pub fn roce_ingress(table: &str, iface: &str, src: &str, dst: &str) -> NftDrop {
        NftDrop::install(
            "netdev",
            table,
            &format!("type filter hook ingress device \"{iface}\" priority 0; policy accept;"),
            &format!("ip saddr {src} ip daddr {dst} udp dport 4791"),
        )
    }

    fn install(family: &'static str, table: &str, hook: &str, matches: &str) -> NftDrop {
        // A table of that name left by an earlier run would hold an older rule: start clean.
        let _ = nft(&["delete", "table", family, table]);
        let script = format!(
            "table {family} {table} {{\n  chain cut {{\n    {hook}\n    {matches} counter drop\n  }}\n}}\n"
        );
        let out = Command::new("nft")
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                use std::io::Write;
                if let Some(mut stdin) = c.stdin.take() {
                    stdin.write_all(script.as_bytes())?;
                }
                c.wait_with_output()
            })
            .unwrap_or_else(|e| panic!("running nft (is nftables installed?): {e}"));
        assert!(
            out.status.success(),
            "nft -f refused\n{script}\n{}",
            text(&out.stderr)
        );
        NftDrop {
            family,
            table: table.to_owned(),
        }
    }

    /// Packets dropped so far.
    pub fn dropped(&self) -> u64 {
        let listing = nft(&["list", "table", self.family, &self.table])
            .unwrap_or_else(|e| panic!("nft list table {} {}: {e}", self.family, self.table));
        listing
            .lines()
            .find(|l| l.contains(" drop"))
            .and_then(|rule| {
                let words: Vec<&str> = rule.split_whitespace().collect();
                let i = words.iter().position(|w| *w == "packets")?;
                words.get(i + 1)?.parse().ok()
            })
            .unwrap_or_else(|| panic!("no drop rule with a counter in:\n{listing}"))
    }

    /// Removes the rule now; what it dropped.
    pub fn remove(self) -> u64 {
        let n = self.dropped();
        nft(&["delete", "table", self.family, &self.table])
            .unwrap_or_else(|e| panic!("nft delete table {} {}: {e}", self.family, self.table));
        n
    }
}

impl Drop for NftDrop {
    fn drop(&mut self) {
        // Already gone after remove(): nothing to do, so the error is expected.
        let _ = nft(&["delete", "table", self.family, &self.table]);
    }
}

/// Runs `nft ARGS`; its stdout, or its stderr as the error.
fn nft(args: &[&str]) -> Result<String, String> {
    let out = Command::new("nft")
        .args(args)
        .output()
        .map_err(|e| format!("running nft: {e}"))?;
    if out.status.success() {
        Ok(text(&out.stdout))
    } else {
        Err(text(&out.stderr))
    }
}

/// The client ports of the established TCP connections to `server_port` on this host, from
/// the server side's sockets (`ss`): which connection a rule should cut.
pub fn peer_ports(server_port: u16, peer: &str) -> Vec<u16> {
    let out = Command::new("ss")
        .args([
            "-Htn",
            "state",
            "established",
            &format!("sport = :{server_port}"),
        ])
        .output()
        .unwrap_or_else(|e| panic!("running ss: {e}"));
    assert!(out.status.success(), "ss: {}", text(&out.stderr));
    text(&out.stdout)
        .lines()
        .filter_map(|l| {
            // Recv-Q Send-Q Local:Port Peer:Port (the state column is left out with `state`).
            let peer_col = l.split_whitespace().nth(3)?;
            let (ip, port) = peer_col.rsplit_once(':')?;
            (ip == peer).then(|| port.parse().ok()).flatten()
        })
        .collect()
}

/// How long `tcp-reset` may take to start watching, or to send its first reset once due.
const TCP_RESET_STEP: std::time::Duration = std::time::Duration::from_secs(90);

/// A running `tcp-reset` (`tests/src/bin/tcp-reset.rs`): an on-path attacker beside the
/// client's link that resets the client's TLS connection after its Nth RDMA message. Killed
/// when dropped.
pub struct TcpReset {
    child: std::process::Child,
    out: crate::secure::Lines,
    err: crate::secure::Lines,
}

impl TcpReset {
    /// Starts `tcp-reset` for the server on `port` and waits until it watches `veth-b`.
    pub fn start(port: u16, extra: &[&str]) -> TcpReset {
        let mut child = Command::new(crate::secure::bin("tcp-reset"))
            .args([
                "--server",
                &format!("{}:{port}", crate::ADDR_A),
                "--client",
                crate::ADDR_B,
            ])
            .args([
                "--watch",
                "veth-b",
                "--inject",
                "veth-a",
                "--timeout",
                "120",
            ])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn tcp-reset (built by cargo build --workspace --bins)");
        let out = crate::secure::Lines::collect(child.stdout.take().expect("stdout"));
        let err = crate::secure::Lines::collect(child.stderr.take().expect("stderr"));
        err.wait_for("tcp-reset watching", 1, TCP_RESET_STEP, |l| {
            l.contains("watching")
        });
        TcpReset { child, out, err }
    }

    /// Waits until it has sent its first reset.
    pub fn wait_reset(&self) {
        self.out
            .wait_for("tcp-reset's first reset", 1, TCP_RESET_STEP, |l| {
                l.starts_with("{\"reset\"")
            });
    }

    /// Waits for its exit (0 required); its reset and summary lines.
    pub fn finish(mut self) -> (Vec<serde_json::Value>, serde_json::Value) {
        let start = std::time::Instant::now();
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                break s;
            }
            assert!(
                start.elapsed() < std::time::Duration::from_secs(180),
                "tcp-reset still running\n{}",
                self.err.snapshot().join("\n")
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        self.out.wait_closed(std::time::Duration::from_secs(10));
        assert!(
            status.success(),
            "tcp-reset: {status}\n{}\n{}",
            self.out.snapshot().join("\n"),
            self.err.snapshot().join("\n")
        );
        let mut resets = Vec::new();
        let mut summary = serde_json::Value::Null;
        for l in self.out.snapshot() {
            let v: serde_json::Value =
                serde_json::from_str(&l).unwrap_or_else(|e| panic!("{e}: {l}"));
            if v["reset"].is_object() {
                resets.push(v["reset"].clone());
            } else {
                summary = v["summary"].clone();
            }
        }
        (resets, summary)
    }
}

impl Drop for TcpReset {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
