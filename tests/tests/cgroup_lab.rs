//! The kernel's rdma cgroup on real Soft-RoCE: a limit that no process can get
//! around, shown by a program that succeeds without it and fails with it.
//!
//! Run inside the lab VM: `scripts/softroce-vm.sh` (scripts/test.sh does).

use std::process::{Command, Output};
use std::time::Duration;

use rdma_quota::rdma_cgroup::{self, DeviceLimit};
use secure_rdma_tests::{
    require_lab, spawn, text, wait_listening, wait_with_deadline, TestCgroup, ADDR_A,
};

const DEADLINE: Duration = Duration::from_secs(60);

/// An `ibv_rc_pingpong` pair on `port`: the server inside `cgroup` on rxe-a,
/// the client outside on rxe-b. Returns (server, client) outputs.
fn pingpong(cgroup: &TestCgroup, port: u16) -> (Output, Option<Output>) {
    let args = format!("-g 1 -n 5 -p {port}");
    let server = spawn(&mut cgroup.command(&format!("ibv_rc_pingpong -d rxe-a {args}")));
    // The server either listens or exits (refused by the kernel).
    if wait_listening(port) {
        let client = spawn(
            Command::new("ibv_rc_pingpong")
                .args(["-d", "rxe-b", "-g", "1", "-n", "5", "-p", &port.to_string()])
                .arg(ADDR_A),
        );
        let client = wait_with_deadline(client, DEADLINE, "pingpong client");
        let server = wait_with_deadline(server, DEADLINE, "pingpong server");
        return (server, Some(client));
    }
    (
        wait_with_deadline(server, DEADLINE, "pingpong server"),
        None,
    )
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn rdma_cgroup_object_limit_stops_a_program_that_runs_without_it() {
    require_lab();
    // Without a limit, the program makes its PD, MR, CQ and QP and runs.
    let free = TestCgroup::new("rdma-free");
    let (server, client) = pingpong(&free, 18620);
    assert!(server.status.success(), "{}", text(&server.stderr));
    assert!(client.is_some_and(|c| c.status.success()));

    // hca_object=3: the PD, MR and CQ fit, the QP does not, and the kernel refuses it,
    // whatever the program does (no LD_PRELOAD or cooperation involved).
    let limited = TestCgroup::new("rdma-limited");
    let limit = DeviceLimit {
        device: "rxe-a".into(),
        handles: None,
        objects: Some(3),
    };
    rdma_cgroup::set_max(&limited.0, &limit).expect("set rdma.max");
    assert!(rdma_cgroup::max(&limited.0)
        .expect("read rdma.max")
        .contains(&limit));
    let (server, client) = pingpong(&limited, 18621);
    assert!(
        client.is_none(),
        "the limited server must not get to listen"
    );
    assert!(!server.status.success());
    assert!(
        text(&server.stderr).contains("Couldn't create QP"),
        "{}",
        text(&server.stderr)
    );
    // Everything it did make was freed with it.
    let used = rdma_cgroup::current(&limited.0).expect("read rdma.current");
    let rxe_a = used.iter().find(|d| d.device == "rxe-a");
    assert!(
        rxe_a.is_none_or(|d| d.objects == Some(0) && d.handles == Some(0)),
        "{used:?}"
    );
    println!("rdma cgroup: hca_object=3 on rxe-a refused the 4th object (the QP); unlimited, the same pingpong ran");
}
