//! A shared receive queue and a shared completion queue on real Soft-RoCE (issue 22's scalable
//! server, at the verbs layer): queue pairs on `rxe-a` take their receives from one SRQ and
//! report to one CQ, their peers on `rxe-b` send across the veth pair, and every message is
//! accounted for once, on the queue pair it was sent to. Then what the shared queues save: rxe's
//! rings per queue pair, session-shaped against shared.
//!
//! Run inside the lab VM: `scripts/softroce-vm.sh` (scripts/test.sh does).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use secure_rdma::verbs::{
    CompletionQueue, Device, GidEntry, MemoryRegion, MemoryWindow, MrAccess, PathMtu,
    ProtectionDomain, QpCaps, QueuePair, RemoteBuffer, RtrParams, Rts, RtsParams,
    SharedReceiveQueue, VerbsError, WcOpcode,
};
use secure_rdma_tests::{require_lab, ADDR_A, ADDR_B};

/// Messages each client QP sends: several times the SRQ's receives, so the receiver has to
/// repost slots while both peers send.
const PER_QP: usize = 200;
const SLOTS: usize = 32;
const SLOT: usize = 256;
const WAIT: Duration = Duration::from_secs(20);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

struct End {
    pd: Arc<ProtectionDomain>,
    gid: GidEntry,
}

fn end(addr: &str) -> End {
    let (dev, gid) =
        Device::open_for_address(addr.parse().expect("lab address")).expect("rxe device");
    End {
        pd: dev.alloc_pd().expect("PD"),
        gid,
    }
}

/// Brings `a` and `b` to RTS, each pointed at the other.
fn connect(
    a: QueuePair<secure_rdma::verbs::Init>,
    b: QueuePair<secure_rdma::verbs::Init>,
    psns: (u32, u32),
) -> (QueuePair<Rts>, QueuePair<Rts>) {
    let rtr = |qp: &QueuePair<secure_rdma::verbs::Init>, psn| {
        RtrParams::new(qp.qpn().get(), psn, qp.sgid().gid, PathMtu::Mtu1024).expect("RTR params")
    };
    let (to_b, to_a) = (rtr(&b, psns.1), rtr(&a, psns.0));
    let a = a
        .into_rtr(to_b)
        .and_then(|q| q.into_rts(RtsParams::new(psns.0)?))
        .expect("a to RTS");
    let b = b
        .into_rtr(to_a)
        .and_then(|q| q.into_rts(RtsParams::new(psns.1)?))
        .expect("b to RTS");
    (a, b)
}

const CAPS: QpCaps = QpCaps {
    max_send_wr: 16,
    max_recv_wr: 16,
};

/// `n` server QPs on `rxe-a`, all on one CQ and one SRQ (so one PD), each connected to a
/// client QP on `rxe-b` with its own CQ and receive queue.
fn shared_pairs(
    srv: &End,
    cli: &End,
    cq: &Arc<CompletionQueue>,
    srq: &Arc<SharedReceiveQueue>,
    n: u32,
    remote_write: bool,
) -> Vec<(QueuePair<Rts>, QueuePair<Rts>, Arc<CompletionQueue>)> {
    (0..n)
        .map(|i| {
            let s = QueuePair::create_on_srq(&srv.pd, cq, cq, srq, srv.gid.clone(), CAPS)
                .and_then(|q| q.into_init(remote_write))
                .expect("server QP on the SRQ");
            let ccq = CompletionQueue::new(cli.pd.device(), 64).expect("client CQ");
            let c = QueuePair::create(&cli.pd, &ccq, &ccq, cli.gid.clone(), CAPS)
                .and_then(|q| q.into_init(false))
                .expect("client QP");
            let (s, c) = connect(s, c, (0x10_0000 + i, 0x20_0000 + i));
            (s, c, ccq)
        })
        .collect()
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn queue_pairs_on_one_shared_receive_queue_each_get_exactly_their_messages() {
    require_lab();
    runtime().block_on(async {
        let (srv, cli) = (end(ADDR_A), end(ADDR_B));
        // The server: one CQ for everything, one SRQ for every QP's receives.
        let cq = CompletionQueue::new(srv.pd.device(), 1024).expect("shared CQ");
        let srq = SharedReceiveQueue::new(&srv.pd, SLOTS as u32).expect("ibv_create_srq");
        let slots = MemoryRegion::new(&srv.pd, SLOTS * SLOT, MrAccess::Local).expect("slots");
        for i in 0..SLOTS {
            srq.post_recv(i as u64, &slots, i * SLOT..(i + 1) * SLOT)
                .expect("post to the SRQ");
        }
        // A QP on an SRQ has no receive queue of its own: a receive posted to it is an error
        // that says where receives go, not a silent loss.
        let mut probe = QueuePair::create_on_srq(&srv.pd, &cq, &cq, &srq, srv.gid.clone(), CAPS)
            .and_then(|q| q.into_init(false))
            .expect("a QP on the SRQ");
        let err = probe
            .post_recv(99, &slots, 0..SLOT)
            .expect_err("a receive on an SRQ's QP");
        assert!(matches!(err, VerbsError::ReceiveOnSharedQueue(_)), "{err}");
        assert!(
            err.to_string().contains("SharedReceiveQueue::post_recv"),
            "{err}"
        );
        drop(probe);
        let mut pairs = shared_pairs(&srv, &cli, &cq, &srq, 2, false);
        let server_qpns: Vec<u32> = pairs.iter().map(|(s, _, _)| s.qpn().get()).collect();

        // The receiver: every arrival read out of its slot, the slot reposted to the SRQ.
        let receiver = {
            let (cq, srq, slots) = (Arc::clone(&cq), Arc::clone(&srq), Arc::clone(&slots));
            tokio::spawn(async move {
                let mut got: BTreeMap<u32, Vec<String>> = BTreeMap::new();
                for _ in 0..2 * PER_QP {
                    let wc = cq.next_ok("a SEND on the SRQ", WAIT).await?;
                    assert_eq!(wc.opcode, WcOpcode::Recv, "{wc:?}");
                    let slot = wc.wr_id as usize;
                    let bytes = slots.read(slot * SLOT, wc.byte_len as usize)?;
                    got.entry(wc.qp_num)
                        .or_default()
                        .push(String::from_utf8_lossy(&bytes).into_owned());
                    srq.post_recv(wc.wr_id, &slots, slot * SLOT..(slot + 1) * SLOT)?;
                }
                Ok::<_, VerbsError>(got)
            })
        };

        // Both clients send, interleaved, each at most 8 unacknowledged.
        let bufs: Vec<Arc<MemoryRegion>> = (0..2)
            .map(|_| MemoryRegion::new(&cli.pd, PER_QP * SLOT, MrAccess::Local).expect("send MR"))
            .collect();
        let mut in_flight = [0usize; 2];
        for k in 0..PER_QP {
            for (i, (_, c, ccq)) in pairs.iter_mut().enumerate() {
                let msg = format!("qp{i} message {k}");
                bufs[i].write(k * SLOT, msg.as_bytes()).expect("fill");
                if in_flight[i] == 8 {
                    ccq.next_ok("a SEND's completion", WAIT)
                        .await
                        .expect("send completion");
                    in_flight[i] -= 1;
                }
                c.post_send(k as u64, &bufs[i], k * SLOT..k * SLOT + msg.len())
                    .expect("post SEND");
                in_flight[i] += 1;
            }
        }
        for (i, (_, _, ccq)) in pairs.iter().enumerate() {
            for _ in 0..in_flight[i] {
                ccq.next_ok("a SEND's completion", WAIT)
                    .await
                    .expect("send completion");
            }
        }
        let got = receiver
            .await
            .expect("receiver task")
            .expect("every SEND arrived");

        // Each server QP got exactly its client's messages, each once, in order (RC keeps a
        // QP's order; the SRQ only shares the buffers).
        assert_eq!(
            got.keys().copied().collect::<Vec<_>>(),
            {
                let mut q = server_qpns.clone();
                q.sort_unstable();
                q
            },
            "completions name the server's two QPs"
        );
        for (i, qpn) in server_qpns.iter().enumerate() {
            let expected: Vec<String> = (0..PER_QP).map(|k| format!("qp{i} message {k}")).collect();
            assert_eq!(got[qpn], expected, "QP {qpn:#x}'s messages");
        }
        // Nothing more arrived than was sent.
        assert!(cq.try_next().expect("poll").is_none());
        eprintln!(
            "{} messages on 2 QPs through one SRQ of {SLOTS} receives and one CQ",
            2 * PER_QP
        );
    });
}

/// Resident KiB of rxe's rings in this process (its mappings of `/dev/infiniband/uverbs*`).
fn ring_kib() -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").expect("/proc/self/smaps");
    let mut in_rings = false;
    let mut kib = 0;
    for line in smaps.lines() {
        if let Some(rss) = line.strip_prefix("Rss:") {
            if in_rings {
                kib += rss
                    .split_whitespace()
                    .next()
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        } else if line.split_whitespace().next().is_some_and(|f| {
            f.contains('-') && f.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
        }) {
            in_rings = line
                .split_whitespace()
                .nth(5)
                .is_some_and(|p| p.starts_with("/dev/infiniband/"));
        }
    }
    kib
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn shared_queues_cut_rxes_rings_per_queue_pair() {
    require_lab();
    const N: usize = 200;
    runtime().block_on(async {
        let srv = end(ADDR_A);
        // Session-shaped: two CQs of 32 and 32 receives of its own per QP (session.rs).
        let before = ring_kib();
        let mut own = Vec::new();
        for _ in 0..N {
            let send = CompletionQueue::new(srv.pd.device(), 32).expect("CQ");
            let recv = CompletionQueue::new(srv.pd.device(), 32).expect("CQ");
            let caps = QpCaps {
                max_send_wr: 16,
                max_recv_wr: 32,
            };
            own.push(QueuePair::create(&srv.pd, &send, &recv, srv.gid.clone(), caps).expect("QP"));
        }
        let own_kib = (ring_kib() - before) as f64 / N as f64;
        drop(own);

        // Shared: one CQ and one SRQ for all, each QP only its send queue.
        let before = ring_kib();
        let cq = CompletionQueue::new(srv.pd.device(), (2 * N * 16) as u32).expect("shared CQ");
        let srq = SharedReceiveQueue::new(&srv.pd, 1024).expect("SRQ");
        let fixed = ring_kib() - before;
        let caps = QpCaps {
            max_send_wr: 16,
            max_recv_wr: 0,
        };
        let shared: Vec<_> = (0..N)
            .map(|_| {
                QueuePair::create_on_srq(&srv.pd, &cq, &cq, &srq, srv.gid.clone(), caps)
                    .expect("QP on the SRQ")
            })
            .collect();
        let shared_kib = (ring_kib() - before - fixed) as f64 / N as f64;
        eprintln!(
            "rxe rings per QP: {own_kib:.1} KiB with its own two CQs and receive queue, \
             {shared_kib:.1} KiB on a shared CQ and SRQ (plus {fixed} KiB once for those)"
        );
        assert!(own_kib > 0.0, "the rings are visible in smaps");
        assert!(
            shared_kib < own_kib / 2.0,
            "shared queues should at least halve the rings per QP: {shared_kib:.1} against \
             {own_kib:.1} KiB"
        );
        drop(shared);
        drop((cq, srq));

        // A session on secure-server's shared queue: a send queue of 4 (its send slot, the
        // window's bind and invalidation), with a send CQ of its own as before, and on the
        // queue's shared send CQs (`attach_sending`) now.
        use secure_rdma::shared_queue::SharedQueue;
        let session_caps = QpCaps {
            max_send_wr: 4,
            max_recv_wr: 0,
        };
        let queue = SharedQueue::new(srv.pd.device(), 64, 4096).expect("shared queue");
        let before = ring_kib();
        let with_cq: Vec<_> = (0..N)
            .map(|_| {
                let cq = CompletionQueue::new(srv.pd.device(), 4).expect("send CQ");
                let attached = queue
                    .attach(&cq, srv.gid.clone(), session_caps, 16)
                    .expect("QP with its own send CQ");
                (attached, cq)
            })
            .collect();
        let with_cq_kib = (ring_kib() - before) as f64 / N as f64;
        drop(with_cq);
        let before = ring_kib();
        let on_shared: Vec<_> = (0..N)
            .map(|_| {
                queue
                    .attach_sending(srv.gid.clone(), session_caps, 16, true)
                    .expect("QP on the shared send CQ")
            })
            .collect();
        let on_shared_kib = (ring_kib() - before) as f64 / N as f64;
        let stats = queue.stats();
        eprintln!(
            "a shared-queue session's rings: {with_cq_kib:.1} KiB per QP with a send CQ of its \
             own, {on_shared_kib:.1} KiB on shared send CQs ({} CQ of {} entries for {N})",
            stats.send_cqs,
            secure_rdma::shared_queue::SEND_CQ_DEPTH
        );
        // What it saves is CQs, not ring memory: one CQ for all of them instead of 200, where
        // rxe allows about 32,000 per device, at no more than a KiB of ring per QP more.
        assert_eq!(stats.send_cqs, 1, "{N} QPs of 4 fit one CQ: {stats:?}");
        assert!(
            on_shared_kib < with_cq_kib + 1.0,
            "the shared send CQ's ring per QP: {on_shared_kib:.1} against {with_cq_kib:.1} KiB"
        );
        drop(on_shared);
    });
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn on_a_shared_pd_another_sessions_window_rkey_lands_nothing_where_a_region_rkey_would() {
    require_lab();
    runtime().block_on(async {
        let (srv, cli) = (end(ADDR_A), end(ADDR_B));
        let cq = CompletionQueue::new(srv.pd.device(), 256).expect("shared CQ");
        let srq = SharedReceiveQueue::new(&srv.pd, 16).expect("SRQ");
        // Session 0 (the victim) and session 1 (the attacker) share the SRQ, hence the PD.
        let mut pairs = shared_pairs(&srv, &cli, &cq, &srq, 2, true);
        let victim = MemoryRegion::new(&srv.pd, 4096, MrAccess::WindowBind).expect("victim MR");
        let window = Arc::new(MemoryWindow::alloc(&srv.pd).expect("type 2 window"));
        pairs[0]
            .0
            .post_bind_window(1, &window, &victim)
            .expect("bind on the victim's QP");
        cq.next_ok("the window's bind", WAIT).await.expect("bound");
        let granted = window.remote(&victim);
        // Without the defence: a region registered for remote write, as a session without
        // windows would grant. On a shared PD its rkey is good on every QP of the PD.
        let open = MemoryRegion::new(&srv.pd, 4096, MrAccess::RemoteWrite).expect("open MR");

        let src = MemoryRegion::new(&cli.pd, 4096, MrAccess::Local).expect("client MR");
        let mut write = |pair: usize, remote: RemoteBuffer, text: &'static str| {
            src.write(0, text.as_bytes()).expect("fill");
            let (_, c, ccq) = &mut pairs[pair];
            c.post_write(7, &src, 0..text.len(), &remote, 0)
                .expect("post WRITE");
            let ccq = Arc::clone(ccq);
            async move { ccq.next(WAIT).await.expect("the WRITE's completion") }
        };

        // The victim's own session writes through its window: it lands.
        let wc = write(0, granted, "the victim's own bytes").await;
        assert!(wc.status.is_success(), "the window's own QP: {}", wc.status);
        assert_eq!(victim.read(0, 22).expect("read"), b"the victim's own bytes");

        // The attack without the defence: session 1 writes with a region's rkey of the
        // shared PD, and it lands.
        let wc = write(1, open.remote(), "stolen through the PD").await;
        assert!(
            wc.status.is_success(),
            "a region rkey on a shared PD is good on another session's QP: {}",
            wc.status
        );
        assert_eq!(open.read(0, 21).expect("read"), b"stolen through the PD");

        // With the defence: the same attacker, the victim's window rkey. rxe refuses it (the
        // window is bound to session 0's QP), and not one byte lands.
        let wc = write(1, granted, "stolen through the window").await;
        assert!(
            !wc.status.is_success(),
            "another session's window rkey must be refused on a shared PD"
        );
        eprintln!(
            "another session's window rkey on a shared PD: {} (the region rkey landed)",
            wc.status
        );
        let mut expected = b"the victim's own bytes".to_vec();
        expected.resize(4096, 0);
        assert_eq!(
            victim.read(0, 4096).expect("read"),
            expected,
            "the victim's region after the attack"
        );
    });
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn a_window_over_part_of_a_region_lets_its_peer_write_the_rest_but_a_region_of_its_own_bounds_it() {
    require_lab();
    runtime().block_on(async {
        let (srv, cli) = (end(ADDR_A), end(ADDR_B));
        let cq = CompletionQueue::new(srv.pd.device(), 256).expect("shared CQ");
        let srq = SharedReceiveQueue::new(&srv.pd, 16).expect("SRQ");
        let (mut server_qp, mut peer_qp, peer_cq) = shared_pairs(&srv, &cli, &cq, &srq, 1, true)
            .pop()
            .expect("one pair");
        let src = MemoryRegion::new(&cli.pd, 4096, MrAccess::Local).expect("client MR");
        // Posts a WRITE of `text` from the peer's QP to `remote` at offset 0; its status.
        let mut write = |remote: RemoteBuffer, text: &'static str| {
            src.write(0, text.as_bytes()).expect("fill");
            peer_qp
                .post_write(7, &src, 0..text.len(), &remote, 0)
                .expect("post WRITE");
            let ccq = Arc::clone(&peer_cq);
            async move { ccq.next(WAIT).await.expect("the WRITE's completion").status }
        };
        let bind = |mr: &Arc<MemoryRegion>, range: std::ops::Range<usize>| {
            let window = Arc::new(MemoryWindow::alloc(&srv.pd).expect("type 2 window"));
            (window, mr.clone(), range)
        };

        // Two sessions' write slots carved from one region: the neighbour's first half, the
        // peer's second, the peer's window bound over its half only.
        let carved = MemoryRegion::new(&srv.pd, 8192, MrAccess::WindowBind).expect("region");
        let (window, mr, range) = bind(&carved, 4096..8192);
        server_qp
            .post_bind_window_over(1, &window, &mr, range.clone())
            .expect("bind over the second half");
        cq.next_ok("the window's bind", WAIT).await.expect("bound");
        let granted = window.remote_over(&mr, range);
        assert_eq!((granted.addr, granted.len), (4096, 4096));
        let status = write(granted, "inside the window").await;
        assert!(status.is_success(), "through the window: {status}");
        assert_eq!(carved.read(4096, 17).expect("read"), b"inside the window");
        // The attack: the peer's own rkey, an address before its window (the neighbour's
        // half). rxe's responder checks the address against the region, not the window.
        let wide = RemoteBuffer {
            addr: 0,
            rkey: granted.rkey,
            len: 8192,
        };
        let status = write(wide, "outside the window").await;
        eprintln!(
            "a WRITE outside the window, inside its region: {status}; the neighbour's slot now \
             starts {:?}",
            String::from_utf8_lossy(&carved.read(0, 18).expect("read"))
        );
        assert!(
            status.is_success() && carved.read(0, 18).expect("read") == b"outside the window",
            "this device now bounds a WRITE by the window ({status}): write slots could then be \
             carved from one region (README, shared slots)"
        );

        // The defence: each session's write slots a region of their own, the window bound
        // over all of it. The same attack reaches beyond the region, and is refused there.
        let neighbour = MemoryRegion::new(&srv.pd, 4096, MrAccess::WindowBind).expect("region");
        let own = MemoryRegion::new(&srv.pd, 4096, MrAccess::WindowBind).expect("region");
        let (window, mr, range) = bind(&own, 0..4096);
        server_qp
            .post_bind_window_over(2, &window, &mr, range.clone())
            .expect("bind over its own region");
        cq.next_ok("the window's bind", WAIT).await.expect("bound");
        let granted = window.remote_over(&mr, range);
        let status = write(granted, "inside the window").await;
        assert!(status.is_success(), "through the window: {status}");
        assert_eq!(own.read(0, 17).expect("read"), b"inside the window");
        let wide = RemoteBuffer {
            addr: granted.addr,
            rkey: granted.rkey,
            len: 8192,
        };
        let mut beyond = wide;
        beyond.addr += 4096;
        let status = write(beyond, "outside the window").await;
        eprintln!("a WRITE beyond a window over a region of its own: {status}");
        assert!(
            !status.is_success(),
            "a WRITE beyond the window's own region must be refused"
        );
        assert_eq!(own.read(0, 4096).expect("read")[17..], [0u8; 4079][..]);
        assert_eq!(neighbour.read(0, 4096).expect("read"), vec![0u8; 4096]);
    });
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn a_queue_pair_on_another_pds_shared_queue_is_refused_naming_the_queue() {
    require_lab();
    let rt = runtime();
    let _guard = rt.enter();
    let srv = end(ADDR_A);
    let other_pd = srv.pd.device().alloc_pd().expect("a second PD");
    let cq = CompletionQueue::new(srv.pd.device(), 16).expect("CQ");
    let srq = SharedReceiveQueue::new(&srv.pd, 16).expect("SRQ");
    let err = QueuePair::create_on_srq(&other_pd, &cq, &cq, &srq, srv.gid.clone(), CAPS)
        .expect_err("a QP of another PD on this SRQ");
    assert!(
        matches!(err, VerbsError::ForeignSharedQueue),
        "{err:?}: {err}"
    );
    // What the caller reads names the queue and the fix, not a memory region.
    let message = err.to_string();
    assert!(message.contains("shared receive queue"), "{message}");
    assert!(message.contains("SharedReceiveQueue::pd"), "{message}");
    assert!(!message.contains("memory region"), "{message}");
    // The same PD is accepted.
    QueuePair::create_on_srq(&srv.pd, &cq, &cq, &srq, srv.gid.clone(), CAPS)
        .expect("a QP of the SRQ's own PD");
}

/// The shared queue's credit (`secure_rdma::shared_queue`), attacked on rxe: a peer that SENDs
/// without waiting for acknowledgements, into a server that takes none of them. Without a
/// credit (the attack succeeding) every message piles up in the server's memory, routed to the
/// flooded session's inbox; with a credit of 4, the fifth cuts that QP off, what it sends after
/// is dropped and counted, and a calm session on the same queue goes on receiving.
#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn a_peer_sending_beyond_its_credit_on_a_shared_queue_is_cut_off_and_the_others_go_on() {
    use secure_rdma::shared_queue::{InboxError, SharedQueue};
    require_lab();
    const FLOOD: usize = 40;
    runtime().block_on(async {
        let (srv, cli) = (end(ADDR_A), end(ADDR_B));
        for credit in [usize::MAX, 4] {
            let shared = SharedQueue::new(srv.pd.device(), 64, SLOT).expect("shared queue");
            let send_cq = CompletionQueue::new(srv.pd.device(), 64).expect("send CQ");
            let (flood_qp, mut flood) = shared
                .attach(&send_cq, srv.gid.clone(), CAPS, credit)
                .expect("flooded QP");
            let (calm_qp, mut calm) = shared
                .attach(&send_cq, srv.gid.clone(), CAPS, 4)
                .expect("calm QP");
            let peer = || {
                let cq = CompletionQueue::new(cli.pd.device(), 64).expect("client CQ");
                let qp = QueuePair::create(&cli.pd, &cq, &cq, cli.gid.clone(), CAPS)
                    .and_then(|q| q.into_init(false))
                    .expect("client QP");
                (qp, cq)
            };
            let ((fc, fcq), (cc, ccq)) = (peer(), peer());
            let (_flood_qp, mut fc) = connect(flood_qp, fc, (0x30_0000, 0x40_0000));
            let (_calm_qp, mut cc) = connect(calm_qp, cc, (0x31_0000, 0x41_0000));
            let buf = MemoryRegion::new(&cli.pd, FLOOD * SLOT, MrAccess::Local).expect("MR");
            // The flood: every SEND acknowledged by rxe (so it reached the server's queue),
            // none by the application, which never reads.
            let mut in_flight = 0;
            for k in 0..FLOOD {
                let msg = format!("flood {k}");
                buf.write(k * SLOT, msg.as_bytes()).expect("fill");
                if in_flight == 8 {
                    fcq.next_ok("a flood SEND", WAIT).await.expect("completion");
                    in_flight -= 1;
                }
                fc.post_send(k as u64, &buf, k * SLOT..k * SLOT + msg.len())
                    .expect("post");
                in_flight += 1;
            }
            for _ in 0..in_flight {
                fcq.next_ok("a flood SEND", WAIT).await.expect("completion");
            }
            // The calm peer, one message at a time: its arrival also proves the pump routed
            // every flood message before it (one CQ, one pump, in completion order).
            for k in 0..10 {
                let msg = format!("calm {k}");
                buf.write(0, msg.as_bytes()).expect("fill");
                cc.post_send(k, &buf, 0..msg.len()).expect("post");
                ccq.next_ok("a calm SEND", WAIT).await.expect("completion");
                let got = calm.next_within(WAIT).await.expect("the calm peer's message");
                assert_eq!(got.data, msg.as_bytes());
            }
            let stats = shared.stats();
            if credit == usize::MAX {
                // Without the defence: the whole flood sits in the server's memory.
                assert_eq!(flood.waiting(), FLOOD, "{stats:?}");
                assert_eq!((stats.over_credit, stats.unrouted), (0, 0), "{stats:?}");
                eprintln!("no credit: {FLOOD} flood messages waiting in the server");
            } else {
                // With it: four waiting, the fifth cut the QP off, the rest dropped.
                assert_eq!(flood.waiting(), 4, "{stats:?}");
                assert_eq!(
                    (stats.over_credit, stats.unrouted),
                    (1, (FLOOD - 5) as u64),
                    "{stats:?}"
                );
                for k in 0..4 {
                    let got = flood.next_within(WAIT).await.expect("within the credit");
                    assert_eq!(got.data, format!("flood {k}").as_bytes());
                }
                assert_eq!(
                    flood.next_within(WAIT).await,
                    Err(InboxError::OverCredit { credit: 4 })
                );
                eprintln!(
                    "credit 4: 4 flood messages kept, the QP cut off, {} dropped; the calm peer got its 10",
                    stats.unrouted
                );
            }
            drop((fcq, ccq));
        }
    });
}

/// Sends through shared send CQs (`SharedQueue::attach_sending`): three server QPs whose sends
/// complete on CQs of 16 entries, 8 reserved by each, so the first two share a CQ and the third
/// opens a second. Each QP SENDs `PER_QP` messages to its own peer, the three interleaved, up to
/// 8 in flight each; every completion is routed to the QP that posted it, in posting order, and
/// every message arrives at its peer once, in order. A QP that leaves gives its room back: the
/// next one fits without a third CQ.
#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn queue_pairs_sending_through_shared_send_cqs_each_get_their_own_completions() {
    use secure_rdma::shared_queue::SharedQueue;
    require_lab();
    const IN_FLIGHT: usize = 8;
    const QPS: usize = 3;
    let caps = QpCaps {
        max_send_wr: IN_FLIGHT as u32,
        max_recv_wr: 0,
    };
    let peer_caps = QpCaps {
        max_send_wr: 4,
        max_recv_wr: 16,
    };
    runtime().block_on(async {
        let (srv, cli) = (end(ADDR_A), end(ADDR_B));
        let shared =
            SharedQueue::with_send_cq_depth(srv.pd.device(), 16, SLOT, 16).expect("shared queue");
        let mut qps = Vec::new();
        for i in 0..QPS {
            let (qp, inbox) = shared
                .attach_sending(srv.gid.clone(), caps, 4, false)
                .expect("a QP sending through a shared send CQ");
            let cq = CompletionQueue::new(cli.pd.device(), 32).expect("peer CQ");
            let peer = QueuePair::create(&cli.pd, &cq, &cq, cli.gid.clone(), peer_caps)
                .and_then(|q| q.into_init(false))
                .expect("peer QP");
            let (qp, peer) = connect(qp, peer, (0x50_0000 + i as u32, 0x60_0000 + i as u32));
            qps.push((qp, inbox, peer, cq));
        }
        let stats = shared.stats();
        assert_eq!(
            (stats.send_cqs, stats.send_reserved),
            (2, QPS * IN_FLIGHT),
            "two QPs of 8 fill a CQ of 16, the third opens another: {stats:?}"
        );
        let send_buf =
            MemoryRegion::new(shared.pd(), QPS * IN_FLIGHT * SLOT, MrAccess::Local).expect("MR");
        let recv_buf = MemoryRegion::new(&cli.pd, QPS * 16 * SLOT, MrAccess::Local).expect("MR");
        for (i, (_, _, peer, _)) in qps.iter_mut().enumerate() {
            for r in 0..16 {
                let at = (i * 16 + r) * SLOT;
                peer.post_recv(r as u64, &recv_buf, at..at + SLOT)
                    .expect("peer receive");
            }
        }
        let wr_id = |i: usize, k: usize| ((i as u64) << 32) | k as u64;
        let mut next = [0usize; QPS];
        let mut received: Vec<Vec<String>> = vec![Vec::new(); QPS];
        while next.iter().any(|&n| n < PER_QP) {
            // A batch on every QP before any completion is taken, so that the completions of
            // the QPs sharing a CQ interleave there.
            let mut batch = [0usize; QPS];
            for (i, (qp, ..)) in qps.iter_mut().enumerate() {
                batch[i] = (PER_QP - next[i]).min(IN_FLIGHT);
                for j in 0..batch[i] {
                    let msg = format!("qp {i} message {}", next[i] + j);
                    let at = (i * IN_FLIGHT + j) * SLOT;
                    send_buf.write(at, msg.as_bytes()).expect("fill");
                    qp.post_send(wr_id(i, next[i] + j), &send_buf, at..at + msg.len())
                        .expect("post");
                }
            }
            for (i, (qp, inbox, ..)) in qps.iter_mut().enumerate() {
                for j in 0..batch[i] {
                    let wc = inbox.next_sent(WAIT).await.expect("a routed send completion");
                    assert!(wc.status.is_success(), "qp {i}: {wc:?}");
                    assert_eq!(wc.qp_num, qp.qpn().get(), "qp {i} got another QP's completion");
                    assert_eq!(
                        wc.wr_id,
                        wr_id(i, next[i] + j),
                        "qp {i}: its completions, in posting order"
                    );
                }
            }
            for (i, (_, _, peer, pcq)) in qps.iter_mut().enumerate() {
                for _ in 0..batch[i] {
                    let rc = pcq.next_ok("the peer's receive", WAIT).await.expect("receive");
                    let at = (i * 16 + rc.wr_id as usize) * SLOT;
                    let data = recv_buf.read(at, rc.byte_len as usize).expect("read");
                    received[i].push(String::from_utf8(data).expect("text"));
                    peer.post_recv(rc.wr_id, &recv_buf, at..at + SLOT)
                        .expect("repost");
                }
                next[i] += batch[i];
            }
        }
        for (i, got) in received.iter().enumerate() {
            let want: Vec<String> = (0..PER_QP).map(|k| format!("qp {i} message {k}")).collect();
            assert_eq!(got, &want, "qp {i}: every message once, in order");
        }
        let stats = shared.stats();
        assert_eq!(stats.sends_unrouted, 0, "{stats:?}");
        // One leaves: its 8 entries come back, and the next QP fits without a third CQ.
        let (qp, inbox, peer, pcq) = qps.remove(0);
        drop((qp, inbox, peer, pcq));
        assert_eq!(shared.stats().send_reserved, (QPS - 1) * IN_FLIGHT);
        let (_again, _inbox) = shared
            .attach_sending(srv.gid.clone(), caps, 4, false)
            .expect("a QP in the room given back");
        let stats = shared.stats();
        assert_eq!((stats.send_cqs, stats.send_reserved), (2, QPS * IN_FLIGHT), "{stats:?}");
        eprintln!(
            "{QPS} QPs, {} SENDs each through 2 shared send CQs of 16: every completion routed to its QP in order, every message delivered once",
            PER_QP
        );
    });
}

/// Memory regions the kernel holds on `dev` now (`rdma resource show`).
fn regions_on(dev: &str) -> u64 {
    let out = std::process::Command::new("rdma")
        .args(["resource", "show"])
        .output()
        .expect("rdma resource show");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.contains(&format!(" {dev}:")))
        .unwrap_or_else(|| panic!("{dev} in `rdma resource show`: {text}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "mr").expect("an mr count");
    words[at + 1].parse().expect("a number of regions")
}

/// Sessions on a shared queue take their send slots from its arena: 65 sessions' slots are two
/// registrations, not 65. An extent goes back only when its queue pair is destroyed, and
/// whoever takes it next finds it zeroed; a chunk left empty is deregistered.
#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn sessions_send_slots_come_from_a_registration_per_64_and_return_zeroed_after_their_queue_pair() {
    use secure_rdma::shared_queue::SharedQueue;
    use secure_rdma::slots::EXTENTS_PER_CHUNK;
    require_lab();
    runtime().block_on(async {
        let srv = end(ADDR_A);
        let queue = SharedQueue::new(srv.pd.device(), 16, 4096).expect("shared queue");
        let arena = queue.send_slots();
        let before = regions_on("rxe-a");
        // A session's slot: 4 KiB of payload, the header and the tag.
        const SLOT: usize = 4128;
        let n = EXTENTS_PER_CHUNK + 1;
        let mut slots: Vec<_> = (0..n)
            .map(|_| arena.take(SLOT).expect("send slots"))
            .collect();
        let stats = arena.stats();
        assert_eq!((stats.chunks, stats.taken), (2, n), "{stats:?}");
        assert_eq!(
            regions_on("rxe-a") - before,
            2,
            "kernel registrations for {n} sessions"
        );
        // No two sessions' slots overlap.
        let mut spans: Vec<_> = slots
            .iter()
            .map(|s| {
                (
                    Arc::as_ptr(s.region()) as usize,
                    s.absolute(0..SLOT).expect("span"),
                )
            })
            .collect();
        spans.sort_by_key(|(r, a)| (*r, a.start));
        for w in spans.windows(2) {
            assert!(
                w[0].0 != w[1].0 || w[0].1.end <= w[1].1.start,
                "overlapping slots: {w:?}"
            );
        }

        // Session A's slot, holding its bytes, given to its queue pair.
        let a = slots.remove(0);
        a.write(0, b"session A's sealed message").expect("write");
        let caps = QpCaps {
            max_send_wr: 4,
            max_recv_wr: 0,
        };
        let (mut qp, inbox) = queue
            .attach_sending(srv.gid.clone(), caps, 16, false)
            .expect("a session's QP");
        qp.retain(a.lease());
        let (region, span) = (Arc::as_ptr(a.region()), a.absolute(0..SLOT).expect("span"));
        drop(a);
        assert_eq!(
            arena.stats().taken,
            n,
            "the QP still holds session A's slot"
        );
        drop((qp, inbox));
        assert_eq!(arena.stats().taken, n - 1, "back once the QP is destroyed");
        // The next session gets that very extent, and nothing of session A in it.
        let b = arena.take(SLOT).expect("send slots");
        assert_eq!(
            (Arc::as_ptr(b.region()), b.absolute(0..SLOT).expect("span")),
            (region, span),
            "the extent session A gave back"
        );
        assert_eq!(b.read(0, SLOT).expect("read"), vec![0u8; SLOT]);
        eprintln!(
            "{n} sessions' send slots: {} registrations; a returned extent came back zeroed",
            stats.chunks
        );
        slots.push(b);

        // Every session gone: the second chunk is deregistered, the last one kept.
        drop(slots);
        let stats = arena.stats();
        assert_eq!((stats.chunks, stats.taken), (1, 0), "{stats:?}");
        assert_eq!(regions_on("rxe-a") - before, 1, "kernel registrations left");
    });
}
