//! One snapshot with something in every section, for the renderers' tests.

use std::collections::BTreeMap;
use std::time::{Duration, UNIX_EPOCH};

use rdma_quota::{QuotaConfig, Resource, Verb};

use super::snapshot::{AttachReport, CgroupStats, Interception, PortCounter, Snapshot};
use crate::hw_counters::{SkipReason, Skipped};

fn port_counter(
    device: &str,
    port: u32,
    counter: &str,
    total: u64,
    delta: Option<u64>,
) -> PortCounter {
    PortCounter {
        device: device.to_owned(),
        port,
        counter: counter.to_owned(),
        total,
        delta,
    }
}

pub(crate) fn example() -> Snapshot {
    let config = QuotaConfig::parse(
        "QP_COUNT 4\nMR_BYTES 1048576\nQP_CREATE 10\ntenant alice QP_COUNT 2\n",
        "example",
    )
    .expect("example configuration parses");
    let mut s = Snapshot::new(
        UNIX_EPOCH + Duration::from_secs(1_714_564_800),
        Duration::from_secs(2),
    );
    s.config = Some(config);
    s.source = Some(super::snapshot::CountSource::Ebpf);
    s.live = BTreeMap::from([
        (Resource::Qp, 3),
        (Resource::Pd, 1),
        (Resource::Cq, 2),
        (Resource::Mr, 1),
    ]);
    s.mr_bytes = 4096;
    s.totals = BTreeMap::from([
        (Verb::QpCreate, 5),
        (Verb::QpDestroy, 2),
        (Verb::PdAlloc, 1),
        (Verb::CqCreate, 2),
        (Verb::MrReg, 1),
    ]);
    s.rates = BTreeMap::from([(Verb::QpCreate, 1.5), (Verb::QpDestroy, 0.5)]);
    s.cgroups = vec![
        CgroupStats {
            id: 4242,
            path: "/system.slice/\"odd\\name\"\n.service".to_owned(),
            ops: BTreeMap::from([(Verb::QpCreate, 3), (Verb::MrReg, 1)]),
            live: BTreeMap::from([(Resource::Qp, 3), (Resource::Mr, 1)]),
        },
        CgroupStats {
            id: 7,
            path: String::new(),
            ops: BTreeMap::new(),
            live: BTreeMap::new(),
        },
    ];
    s.intercepted = vec![
        Interception {
            verb: Verb::QpCreate,
            scope: "alice".to_owned(),
            key: "QP_COUNT".to_owned(),
            limit: 2,
            count: 5,
            in_interval: 1,
        },
        Interception {
            verb: Verb::QpCreate,
            scope: "global".to_owned(),
            key: "QP_CREATE".to_owned(),
            limit: 10,
            count: 1,
            in_interval: 1,
        },
        Interception {
            verb: Verb::MrReg,
            scope: "bob".to_owned(),
            key: "MR_REG".to_owned(),
            limit: 1,
            count: 4,
            in_interval: 0,
        },
    ];
    s.lost_events = 3;
    s.attach = vec![
        AttachReport {
            hook: "ib_create_qp".to_owned(),
            kind: "kprobe".to_owned(),
            attached: true,
            reason: None,
        },
        AttachReport {
            hook: "ib_uverbs_reg_mr".to_owned(),
            kind: "kprobe".to_owned(),
            attached: false,
            reason: Some("symbol not found".to_owned()),
        },
    ];
    s.hw_counters = vec![
        port_counter("mlx5_0", 1, "out_of_sequence", 0, Some(0)),
        port_counter("mlx5_0", 1, "packet_seq_err", 9, None),
        port_counter("rxe-a", 1, "duplicate_request", 5, Some(2)),
        port_counter("rxe-a", 1, "out_of_seq_request", 1, Some(1)),
        port_counter("rxe-a", 1, "rcvd_pkts", 4711, Some(12)),
        port_counter("rxe-a", 1, "sent_pkts", 4700, Some(0)),
        port_counter("we\"ird\n", 2, "rcvd_pkts", 1, Some(1)),
    ];
    s.hw_counters_skipped = vec![Skipped {
        path: "rxe-a/ports/1/hw_counters/rcvd_seq_err".to_owned(),
        reason: SkipReason::NotANumber("garbage".to_owned()),
    }];
    s.auth_failures = Some(BTreeMap::from([
        ("alice".to_owned(), 2),
        ("b\"o\\b\n".to_owned(), 1),
    ]));
    s
}
