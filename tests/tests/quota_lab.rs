//! secure-server's in-process quotas on real Soft-RoCE: a client over a count,
//! rate or tenant limit is refused with the reason before any of its RDMA
//! resources exists, while everyone else is served and destroys still work.
//!
//! Run inside the lab VM: `scripts/softroce-vm.sh` (scripts/test.sh does).

use std::process::Output;
use std::time::{Duration, Instant};

use secure_rdma_tests::secure::{client, count_kind, wait_resources, Held, Pki, ServerProc};
use secure_rdma_tests::{rdma_resources_of, require_lab, spawn, text, wait_with_deadline};

const DEADLINE: Duration = Duration::from_secs(90);

fn once(pki: &Pki, server: &ServerProc, name: &str) -> Output {
    wait_with_deadline(
        spawn(client(pki, server, Some(name)).args(["-e", "send hi", "-e", "quit"])),
        DEADLINE,
        name,
    )
}

fn assert_refused(out: &Output, reason: &str) {
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        err.contains(&format!("rejected by server: quota exceeded: {reason}")),
        "want {reason:?} in: {err}"
    );
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn qp_count_refuses_client_k_plus_one_and_destroys_still_work() {
    require_lab();
    let pki = Pki::new();
    let names: Vec<String> = (0..4).map(|i| format!("q{i}")).collect();
    pki.clients(&names);
    let server = ServerProc::start(&pki, 4520, &["--limit", "QP_COUNT=2"]);

    let first = Held::start(client(&pki, &server, Some(&names[0])));
    first.wait_connected();
    let second = Held::start(client(&pki, &server, Some(&names[1])));
    second.wait_connected();
    wait_resources(server.pid(), 2, Duration::from_secs(10));

    let out = once(&pki, &server, &names[2]);
    assert_refused(&out, "QP_COUNT limit 2 reached globally (2 live)");
    // Refused before anything was made: still exactly two clients' resources.
    let res = rdma_resources_of(server.pid());
    assert_eq!(
        (count_kind(&res, "qp"), count_kind(&res, "pd")),
        (2, 2),
        "{res:#?}"
    );
    let intercepted = server.events("INTERCEPTED: QP_COUNT limit 2 reached globally (2 live)");
    assert_eq!(intercepted.len(), 1, "{:#?}", server.log.snapshot());
    assert_eq!(intercepted[0]["client"], "q2");

    // Destruction is never refused, and it frees the count.
    assert!(first.quit().success());
    wait_resources(server.pid(), 1, Duration::from_secs(10));
    // Logged once its quota counts are released too.
    server
        .log
        .wait_for("client gone", 1, DEADLINE, |l| l.contains("client gone"));
    let out = once(&pki, &server, &names[3]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(second.quit().success());
    wait_resources(server.pid(), 0, Duration::from_secs(10));
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn qp_create_rate_refuses_creations_beyond_the_rate() {
    require_lab();
    let pki = Pki::new();
    let names: Vec<String> = (0..6).map(|i| format!("r{i}")).collect();
    pki.clients(&names);
    let server = ServerProc::start(&pki, 4521, &["--limit", "QP_CREATE=2"]);

    // Six clients at once: their admissions fall within a second or two, so
    // some of them must be over "2 per second".
    let started = Instant::now();
    let children: Vec<_> = names
        .iter()
        .map(|n| {
            (
                n,
                spawn(client(&pki, &server, Some(n)).args(["-e", "send hi", "-e", "quit"])),
            )
        })
        .collect();
    let outs: Vec<_> = children
        .into_iter()
        .map(|(n, c)| (n, wait_with_deadline(c, DEADLINE, n)))
        .collect();
    let spread = started.elapsed();
    let served = outs.iter().filter(|(_, o)| o.status.success()).count();
    let refused: Vec<_> = outs.iter().filter(|(_, o)| !o.status.success()).collect();
    for (_, out) in &refused {
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{err}");
        assert!(
            err.contains("quota exceeded: QP_CREATE limit 2/s exceeded globally"),
            "{err}"
        );
    }
    // Within any second at most two were admitted, so six clients over this
    // span allow at most 2 * (seconds + 1).
    let bound = 2 * (spread.as_secs() as usize + 1);
    assert!(
        served >= 2 && served <= bound,
        "{served} served in {spread:?}"
    );
    assert!(
        !refused.is_empty() || spread > Duration::from_secs(3),
        "six clients within {spread:?} and none refused"
    );
    println!(
        "QP_CREATE 2/s: {served} served, {} refused, clients spread over {spread:?}",
        refused.len()
    );
    // A second later the rate has room again.
    std::thread::sleep(Duration::from_millis(1100));
    let out = once(&pki, &server, &names[0]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn a_tenant_limit_applies_to_that_tenant_only() {
    require_lab();
    let pki = Pki::new();
    pki.clients(&["alice".to_owned(), "bob".to_owned()]);
    let dir = tempfile::tempdir().expect("tempdir");
    let quota = dir.path().join("quota.conf");
    std::fs::write(
        &quota,
        "# per-tenant limits\nQP_COUNT 10\ntenant alice QP_COUNT 1   # alice: one connection\n",
    )
    .expect("write quota file");
    let server = ServerProc::start(
        &pki,
        4522,
        &["--quota", quota.to_str().expect("utf-8 path")],
    );
    let alice = Held::start(client(&pki, &server, Some("alice")));
    alice.wait_connected();
    let out = once(&pki, &server, "alice");
    assert_refused(&out, "QP_COUNT limit 1 reached for tenant alice (1 live)");
    // bob is not alice: two at once are fine.
    let bob1 = Held::start(client(&pki, &server, Some("bob")));
    bob1.wait_connected();
    let bob2 = Held::start(client(&pki, &server, Some("bob")));
    bob2.wait_connected();
    wait_resources(server.pid(), 3, Duration::from_secs(10));
    for held in [alice, bob1, bob2] {
        assert!(held.quit().success());
    }
    wait_resources(server.pid(), 0, Duration::from_secs(10));
}
