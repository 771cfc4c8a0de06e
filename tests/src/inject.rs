//! Packets into a live queue pair, for the detection and local-user lab tests.
//!
//! [`LivePair`] is an RC queue pair on `rxe-a` connected to one on `rxe-b`, held by the
//! test itself, so the victim's QPN and next expected PSN are known exactly (no capture
//! needed) and the QP stays alive for as long as the test wants. [`send_only`] builds a
//! RoCEv2 SEND Only "from" rxe-b's QP to it with the `roce` encoder (valid ICRC); it can go
//! out as an on-path attacker sends it, a raw frame on `veth-b` ([`send_frame`]), or as a
//! local user sends it, an ordinary UDP datagram (the `udp-send` helper binary).
//!
//! What rxe-a's responder does with a request for the right QP, by PSN (`rxe_resp.c`,
//! `check_psn`): the expected PSN is delivered; one behind it counts `duplicate_request`
//! (and is ACKed again, nothing delivered); one ahead counts `out_of_seq_request` once and
//! NAKs it, further ones are dropped uncounted until an in-order packet arrives. Every packet
//! that passes the header and ICRC checks counts `rcvd_pkts`.

use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use roce::{MacAddr, Opcode, PacketBuilder};
use secure_rdma::psn::Psn;
use secure_rdma::verbs::{
    CompletionQueue, Device, GidSelector, MemoryRegion, MrAccess, QpCaps, QueuePair, RtrParams,
    Rts, RtsParams,
};

/// How long a completion or a counter may take to show up.
const DEADLINE: Duration = Duration::from_secs(30);

/// Message size of [`LivePair::exchange`].
const MESSAGE: usize = 64;

/// An RC queue pair on rxe-a connected to one on rxe-b, both held by the test.
pub struct LivePair {
    // Field order is drop order: the QPs and regions before the CQs' runtime.
    a: QueuePair<Rts>,
    b: QueuePair<Rts>,
    mr_a: Arc<MemoryRegion>,
    mr_b: Arc<MemoryRegion>,
    next_wr: u64,
    _runtime: tokio::runtime::Runtime,
}

impl LivePair {
    /// Connects a QP on rxe-a (10.77.0.1) to one on rxe-b (10.77.0.2), with CSPRNG PSNs.
    pub fn connect() -> LivePair {
        // Completion queues register their channel with tokio; nothing here awaits.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        let _entered = runtime.enter();
        let end = |name: &str| {
            let device = Device::open(Some(name)).expect("open device");
            // The lab's RoCEv2 GID of the veth address is at index 1.
            let sgid = device
                .select_gid(&GidSelector::Index(1))
                .expect("GID index 1");
            let pd = device.alloc_pd().expect("PD");
            let send = CompletionQueue::new(&device, 64).expect("send CQ");
            let recv = CompletionQueue::new(&device, 64).expect("recv CQ");
            let qp = QueuePair::create(&pd, &send, &recv, sgid, QpCaps::default())
                .expect("create QP")
                .into_init(false)
                .expect("INIT");
            let mr = MemoryRegion::new(&pd, MESSAGE, MrAccess::Local).expect("MR");
            (device, qp, mr)
        };
        let (dev_a, qa, mr_a) = end("rxe-a");
        let (dev_b, qb, mr_b) = end("rxe-b");
        let mtu = dev_a
            .active_mtu()
            .expect("MTU")
            .min(dev_b.active_mtu().expect("MTU"));
        let (pa, pb) = (Psn::random(), Psn::random());
        let (qpn_a, qpn_b) = (qa.qpn(), qb.qpn());
        let (gid_a, gid_b) = (qa.sgid().gid, qb.sgid().gid);
        let a = qa
            .into_rtr(RtrParams {
                remote_qpn: qpn_b,
                remote_psn: pb,
                remote_gid: gid_b,
                path_mtu: mtu,
            })
            .expect("RTR")
            .into_rts(RtsParams { local_psn: pa })
            .expect("RTS");
        let b = qb
            .into_rtr(RtrParams {
                remote_qpn: qpn_a,
                remote_psn: pa,
                remote_gid: gid_a,
                path_mtu: mtu,
            })
            .expect("RTR")
            .into_rts(RtsParams { local_psn: pb })
            .expect("RTS");
        LivePair {
            a,
            b,
            mr_a,
            mr_b,
            next_wr: 1,
            _runtime: runtime,
        }
    }

    /// rxe-a's QPN: where forged packets go.
    pub fn a_qpn(&self) -> u32 {
        self.a.qpn().get()
    }

    /// The PSN rxe-a's QP expects next from rxe-b.
    pub fn a_expected_psn(&self) -> u32 {
        self.a.query().expect("query rxe-a's QP").rq_psn
    }

    /// `n` SENDs from rxe-b to rxe-a, each received: real rxe traffic works.
    pub fn exchange(&mut self, n: u32) -> Result<(), String> {
        for _ in 0..n {
            let wr = self.next_wr;
            self.next_wr += 1;
            self.mr_b
                .write(0, &wr.to_le_bytes())
                .map_err(|e| e.to_string())?;
            self.a
                .post_recv(wr, &self.mr_a, 0..MESSAGE)
                .map_err(|e| format!("post_recv: {e}"))?;
            self.b
                .post_send(wr, &self.mr_b, 0..MESSAGE)
                .map_err(|e| format!("post_send: {e}"))?;
            poll(self.a.recv_cq(), "rxe-a's receive")?;
            poll(self.b.send_cq(), "rxe-b's send")?;
            let got = self.mr_a.read(0, 8).map_err(|e| e.to_string())?;
            if got != wr.to_le_bytes() {
                return Err(format!("rxe-a received {got:?}, not message {wr}"));
            }
        }
        Ok(())
    }
}

fn poll(cq: &CompletionQueue, what: &str) -> Result<(), String> {
    let start = Instant::now();
    loop {
        match cq.try_next() {
            Ok(Some(wc)) if wc.status.is_success() => return Ok(()),
            Ok(Some(wc)) => return Err(format!("{what}: completion {}", wc.status.name())),
            Ok(None) if start.elapsed() < DEADLINE => std::thread::sleep(Duration::from_millis(2)),
            Ok(None) => return Err(format!("{what}: no completion within {DEADLINE:?}")),
            Err(e) => return Err(format!("{what}: {e}")),
        }
    }
}

/// UDP source port of forged packets (rxe does not check it).
pub const FORGED_SRC_PORT: u16 = 49_999;

/// A RoCEv2 RC SEND Only from rxe-b's address to rxe-a's QP `qpn` with `psn`; its ICRC
/// covers IPv4 identification 0 and Don't Fragment, which is what an unconnected UDP socket
/// sends with path-MTU discovery on.
pub fn send_only(qpn: u32, psn: u32, src_port: u16) -> PacketBuilder {
    PacketBuilder::new(Opcode::RC_SEND_ONLY)
        .ipv4(Ipv4Addr::new(10, 77, 0, 2), Ipv4Addr::new(10, 77, 0, 1))
        .src_port(src_port)
        .dest_qp(qpn)
        .psn(psn & 0x00ff_ffff)
        .payload(*b"FORGED-BY-A-LAB-TEST")
}

/// The MAC address of a network interface.
pub fn mac_of(iface: &str) -> MacAddr {
    let p = format!("/sys/class/net/{iface}/address");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("reading {p}: {e}"));
    let bytes: Vec<u8> = text
        .trim()
        .split(':')
        .map(|h| u8::from_str_radix(h, 16).unwrap_or_else(|e| panic!("{p}: {e}")))
        .collect();
    MacAddr(bytes.try_into().unwrap_or_else(|b| panic!("{p}: {b:?}")))
}

/// Sends one Ethernet frame out of `iface` with an AF_PACKET socket, as an on-path attacker
/// does (needs CAP_NET_RAW).
pub fn send_frame(iface: &str, frame: &[u8]) -> std::io::Result<()> {
    // Protocol 0: this socket sends only and receives nothing.
    // SAFETY: plain socket(2).
    let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `raw` is a new descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let name = std::ffi::CString::new(iface).map_err(std::io::Error::other)?;
    // SAFETY: a NUL-terminated name.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if index == 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: all-zero is a valid sockaddr_ll.
    let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    addr.sll_family = libc::AF_PACKET as u16;
    addr.sll_protocol = (libc::ETH_P_IP as u16).to_be();
    addr.sll_ifindex = index as i32;
    addr.sll_halen = 6;
    addr.sll_addr[..6].copy_from_slice(&frame[..6]);
    // SAFETY: the buffer and address are valid for the lengths given.
    let sent = unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            frame.as_ptr().cast(),
            frame.len(),
            0,
            (&addr as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if sent < 0 {
        return Err(std::io::Error::last_os_error());
    }
    assert_eq!(sent as usize, frame.len(), "short AF_PACKET send");
    Ok(())
}

/// A port hardware counter of an RDMA device's port 1, straight from sysfs.
pub fn hw_counter(device: &str, counter: &str) -> u64 {
    let p = format!("/sys/class/infiniband/{device}/ports/1/hw_counters/{counter}");
    let s = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("reading {p}: {e}"));
    s.trim()
        .parse()
        .unwrap_or_else(|e| panic!("parsing {p}: {e}"))
}

/// Waits until `device`'s `counter` reaches at least `want`; its value then.
pub fn wait_hw_counter(device: &str, counter: &str, want: u64) -> u64 {
    let start = Instant::now();
    loop {
        let now = hw_counter(device, counter);
        if now >= want {
            return now;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "{device} {counter} is {now}, still below {want} after {DEADLINE:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `device`'s `counter` as the driver counts it now: read after ib_core's cache period (the
/// port's `hw_counters/lifespan`, in ms; ib_core answers from its cache within it), so a value
/// that already moved cannot hide behind a cached one. For exact assertions after
/// [`wait_hw_counter`] has seen the packets arrive.
pub fn hw_counter_settled(device: &str, counter: &str) -> u64 {
    let lifespan_ms = hw_counter(device, "lifespan");
    std::thread::sleep(Duration::from_millis(lifespan_ms + 10));
    hw_counter(device, counter)
}
