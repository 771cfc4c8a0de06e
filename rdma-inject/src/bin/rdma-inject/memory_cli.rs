//! The memory-access flags (`--read`, `--write`, `--rkey`, `--addr`, `--watch-ms`): an RDMA
//! READ or WRITE with a chosen rkey and address ([`rdma_inject::memory`]), kept apart from the
//! other modes' flags.

use std::time::Duration;

use clap::Args;
use rdma_inject::memory::{MemoryAccess, MemoryOp};

/// The memory-access flags, flattened into the command line.
#[derive(Debug, Clone, Args)]
pub struct MemoryArgs {
    /// Inject an RC RDMA READ Request of --read-len bytes at --addr (default 0) with --rkey
    /// (default: the observed WRITE's rkey), then report what the responder answers: READ
    /// responses (memory read out), an ACK, or a NAK (--observe)
    #[arg(long, requires = "observe",
          conflicts_with_all = ["send", "send_hex", "write_imm", "write", "blind", "replay",
                                "sealed_forge", "sealed_renumber", "reflect"])]
    pub read: bool,
    /// Bytes the --read asks for
    #[arg(long, value_name = "N", default_value_t = 64, requires = "read",
          value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub read_len: u32,
    /// Inject a plain RC RDMA WRITE Only (no immediate, so the responder raises no completion)
    /// of TEXT at the observed (or --rkey/--addr) target, then report the answer (--observe)
    #[arg(long, value_name = "TEXT", requires = "observe",
          conflicts_with_all = ["send", "send_hex", "write_imm", "blind", "replay",
                                "sealed_forge", "sealed_renumber", "reflect"])]
    pub write: Option<String>,
    /// The rkey of --read, --write or --write-imm instead of the observed one (e.g. a previous
    /// session's), decimal or 0x-hex
    #[arg(long, value_name = "N", value_parser = crate::cli::u32_arg)]
    pub rkey: Option<u32>,
    /// The address of --read, --write or --write-imm instead of the observed one (--read: 0),
    /// decimal or 0x-hex
    #[arg(long, value_name = "N", value_parser = u64_arg)]
    pub addr: Option<u64>,
    /// How long to watch for the responder's answers after a --read, --write, or a
    /// --write-imm with --rkey/--addr
    #[arg(long, value_name = "MS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub watch_ms: u64,
}

fn u64_arg(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => t.parse(),
    };
    parsed.map_err(|_| format!("{s:?} is not a 64-bit number (decimal or 0x-hex)"))
}

impl MemoryArgs {
    /// The memory access these flags ask for, if any: `--read`, `--write`, or `--write-imm`
    /// (given as `write_imm`, with its `imm`) when `--rkey` or `--addr` aims it elsewhere.
    pub fn access(&self, write_imm: Option<&str>, imm: Option<u32>) -> Option<MemoryAccess> {
        let op = if self.read {
            MemoryOp::Read { len: self.read_len }
        } else if let Some(t) = &self.write {
            MemoryOp::Write {
                data: t.clone().into_bytes(),
            }
        } else if let (Some(t), true) = (write_imm, self.rkey.is_some() || self.addr.is_some()) {
            MemoryOp::WriteImm {
                data: t.as_bytes().to_vec(),
                imm,
            }
        } else {
            return None;
        };
        Some(MemoryAccess {
            op,
            rkey: self.rkey,
            addr: self.addr,
        })
    }

    /// How long to watch the answers.
    pub fn watch(&self) -> Duration {
        Duration::from_millis(self.watch_ms)
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use rdma_inject::memory::MemoryOp;
    use rdma_inject::plan::Plan;

    use crate::cli::{Cli, CliError};

    fn plan(args: &[&str]) -> Result<Plan, CliError> {
        Cli::try_parse_from(std::iter::once("rdma-inject").chain(args.iter().copied()))
            .expect("parses")
            .plan()
    }

    #[test]
    fn memory_plans() {
        let Plan::Memory { access, watch, .. } = plan(&["--observe", "veth-b", "--read"]).unwrap()
        else {
            panic!("not a memory plan")
        };
        assert_eq!(access.op, MemoryOp::Read { len: 64 });
        assert_eq!((access.rkey, access.addr), (None, None));
        assert_eq!(watch.as_millis(), 1000);
        let Plan::Memory { access, .. } = plan(&[
            "--observe",
            "veth-b",
            "--write-imm",
            "X",
            "--rkey",
            "0x1234",
        ])
        .unwrap() else {
            panic!("not a memory plan")
        };
        assert_eq!(
            access.op,
            MemoryOp::WriteImm {
                data: b"X".to_vec(),
                imm: None
            }
        );
        assert_eq!(access.rkey, Some(0x1234));
        // Without --rkey/--addr, --write-imm stays the observe mode's injection.
        assert!(matches!(
            plan(&["--observe", "veth-b", "--write-imm", "X"]).unwrap(),
            Plan::Observe { .. }
        ));
        assert_eq!(
            plan(&["--observe", "veth-b", "--send", "X", "--rkey", "1"]).unwrap_err(),
            CliError::StrayTarget
        );
        let e = Cli::try_parse_from(["rdma-inject", "--observe", "x", "--read", "--send", "y"])
            .unwrap_err();
        assert!(e.to_string().contains("cannot be used with"), "{e}");
    }
}
