//! Loads `bpf/capture.bpf.c` with aya and attaches it where the user asked.

use std::os::fd::AsRawFd;
use std::time::Duration;

use aya::maps::{MapData, PerCpuArray, RingBuf};
use aya::programs::{tc, KProbe, SchedClassifier, TcAttachType, Xdp, XdpMode};
use aya::{Ebpf, EbpfLoader};
use telemetry_ebpf::objects::CAPTURE as BPF_OBJECT;

use crate::processor::KernelCounters;
use crate::record::{parse_record, Record, MAX_SNAPLEN};

/// Where to capture.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CapturePoint {
    /// XDP (ingress) and/or TC (egress) on a netdev: what crosses the wire.
    Netdev {
        /// The interface.
        iface: String,
        /// Attach XDP for received frames.
        ingress: bool,
        /// Attach TC egress for sent frames.
        egress: bool,
        /// Use generic (SKB) XDP only, never driver mode.
        xdp_skb: bool,
    },
    /// kprobes inside rxe: every packet rxe sends and receives, including traffic between QPs
    /// of one device.
    Rxe {
        /// Keep only packets of the rxe device on this netdev (by ifindex); `None` keeps all.
        ifindex: Option<u32>,
    },
}

/// Why a capture could not start.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// `build.rs` found no clang or BTF, so the binary carries no kernel programs.
    #[error("rdma-capture was built without its BPF object (clang or bpftool was missing at build time); install clang, llvm, libbpf-dev and bpftool and rebuild")]
    NoBpfObject,
    /// The snap length is outside what the kernel programs support.
    #[error("snap length {0} is out of range 1..={MAX_SNAPLEN}")]
    SnapLen(u32),
    /// Loading the object failed (permissions, no BPF, no BTF).
    #[error("cannot load the BPF programs (needs root or CAP_BPF+CAP_NET_ADMIN+CAP_PERFMON, and a kernel with BPF and BTF): {0}")]
    Load(#[source] aya::EbpfError),
    /// A program is missing from the object or the verifier rejected it.
    #[error("BPF program {program}: {source}")]
    Program {
        /// The program's name.
        program: &'static str,
        /// What aya reported.
        #[source]
        source: aya::programs::ProgramError,
    },
    /// Attaching failed.
    #[error("cannot attach {what}: {source}{hint}")]
    Attach {
        /// Which hook.
        what: String,
        /// What aya reported.
        #[source]
        source: aya::programs::ProgramError,
        /// A hint on the likely cause, or empty.
        hint: &'static str,
    },
    /// A map is missing from the object.
    #[error("BPF map {0} missing or of the wrong type")]
    Map(&'static str),
}

/// A running capture: attached programs and the ring buffer they fill.
///
/// Dropping it detaches the programs (the clsact qdisc added for TC stays, as `tc` leaves it).
pub struct Capture {
    _bpf: Ebpf,
    ring: RingBuf<MapData>,
    counters: PerCpuArray<MapData, u64>,
    attached: Vec<String>,
}

impl Capture {
    /// Loads the programs and attaches them at `point`, capturing `snaplen` bytes per packet.
    pub fn start(point: &CapturePoint, snaplen: u32) -> Result<Capture, CaptureError> {
        if BPF_OBJECT.is_empty() {
            return Err(CaptureError::NoBpfObject);
        }
        if snaplen == 0 || snaplen > MAX_SNAPLEN {
            return Err(CaptureError::SnapLen(snaplen));
        }
        let ifindex = match point {
            CapturePoint::Rxe { ifindex } => ifindex.unwrap_or(0),
            CapturePoint::Netdev { .. } => 0,
        };
        let mut bpf = EbpfLoader::new()
            .override_global("SNAPLEN", &snaplen, true)
            .override_global("IFINDEX", &ifindex, true)
            .load(BPF_OBJECT)
            .map_err(CaptureError::Load)?;
        let mut attached = Vec::new();
        match point {
            CapturePoint::Netdev {
                iface,
                ingress,
                egress,
                xdp_skb,
            } => {
                if *ingress {
                    let mode = attach_xdp(&mut bpf, iface, *xdp_skb)?;
                    attached.push(format!("XDP on {iface} ({mode} mode)"));
                }
                if *egress {
                    attach_tc(&mut bpf, iface)?;
                    attached.push(format!("TC egress on {iface}"));
                }
            }
            CapturePoint::Rxe { .. } => {
                for (program, function) in [
                    ("rdma_capture_rxe_rcv", "rxe_rcv"),
                    ("rdma_capture_rxe_tx_entry", "rxe_icrc_generate"),
                    ("rdma_capture_rxe_tx_return", "rxe_icrc_generate"),
                ] {
                    let kind = attach_kprobe(&mut bpf, program, function)?;
                    attached.push(format!("{kind} {function}"));
                }
            }
        }
        let counters = bpf
            .take_map("counters")
            .and_then(|m| PerCpuArray::try_from(m).ok())
            .ok_or(CaptureError::Map("counters"))?;
        let ring = bpf
            .take_map("events")
            .and_then(|m| RingBuf::try_from(m).ok())
            .ok_or(CaptureError::Map("events"))?;
        Ok(Capture {
            _bpf: bpf,
            ring,
            counters,
            attached,
        })
    }

    /// What was attached, for the start-up message.
    pub fn attached(&self) -> &[String] {
        &self.attached
    }

    /// Hands every record now in the ring buffer to `f`, stopping early when it returns false.
    /// Returns how many records were handed over. Records that do not parse are skipped.
    pub fn drain(&mut self, mut f: impl FnMut(&Record<'_>) -> bool) -> u64 {
        let mut n = 0;
        while let Some(item) = self.ring.next() {
            if let Some(record) = parse_record(&item) {
                n += 1;
                if !f(&record) {
                    break;
                }
            }
        }
        n
    }

    /// Waits until the ring buffer has data or `timeout` passes (or a signal arrives).
    pub fn wait(&self, timeout: Duration) {
        telemetry_ebpf::ring::wait_readable(self.ring.as_raw_fd(), timeout);
    }

    /// The kernel-side counters, summed over CPUs.
    pub fn counters(&self) -> KernelCounters {
        let sum = |i: u32| -> u64 {
            self.counters
                .get(&i, 0)
                .map(|v| v.iter().sum())
                .unwrap_or(0)
        };
        KernelCounters {
            dropped: sum(0),
            matched: sum(1),
            inspected: sum(2),
        }
    }
}

fn attach_xdp(bpf: &mut Ebpf, iface: &str, skb_only: bool) -> Result<&'static str, CaptureError> {
    const PROGRAM: &str = "rdma_capture_xdp";
    let xdp: &mut Xdp = program(bpf, PROGRAM)?;
    xdp.load().map_err(|source| CaptureError::Program {
        program: PROGRAM,
        source,
    })?;
    let attach_err = |source| CaptureError::Attach {
        what: format!("XDP to {iface}"),
        source,
        hint: " (does the interface exist? is another XDP program attached?)",
    };
    if skb_only {
        return xdp
            .attach(iface, XdpMode::Skb)
            .map(|_| "skb")
            .map_err(attach_err);
    }
    // Driver mode where the driver supports it (veth does), generic mode everywhere else.
    match xdp.attach(iface, XdpMode::Driver) {
        Ok(_) => Ok("driver"),
        Err(_) => xdp
            .attach(iface, XdpMode::Skb)
            .map(|_| "skb")
            .map_err(attach_err),
    }
}

fn attach_tc(bpf: &mut Ebpf, iface: &str) -> Result<(), CaptureError> {
    const PROGRAM: &str = "rdma_capture_tc";
    // Fails when a clsact qdisc already exists, which is fine: we only need one.
    let _ = tc::qdisc_add_clsact(iface);
    let cls: &mut SchedClassifier = program(bpf, PROGRAM)?;
    cls.load().map_err(|source| CaptureError::Program {
        program: PROGRAM,
        source,
    })?;
    cls.attach(iface, TcAttachType::Egress)
        .map(|_| ())
        .map_err(|source| CaptureError::Attach {
            what: format!("TC egress to {iface}"),
            source,
            hint: " (does the interface exist?)",
        })
}

fn attach_kprobe(
    bpf: &mut Ebpf,
    name: &'static str,
    function: &str,
) -> Result<&'static str, CaptureError> {
    let probe: &mut KProbe = program(bpf, name)?;
    probe.load().map_err(|source| CaptureError::Program {
        program: name,
        source,
    })?;
    let kind = if name.ends_with("_return") {
        "kretprobe"
    } else {
        "kprobe"
    };
    probe
        .attach(function, 0)
        .map(|_| kind)
        .map_err(|source| CaptureError::Attach {
            what: format!("{kind} on {function}"),
            source,
            hint: " (is the rdma_rxe module loaded, and does the kernel have CONFIG_KPROBES?)",
        })
}

fn program<'a, T>(bpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut T, CaptureError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    telemetry_ebpf::loader::program(bpf, name).map_err(|source| CaptureError::Program {
        program: name,
        source,
    })
}
