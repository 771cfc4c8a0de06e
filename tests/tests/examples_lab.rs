//! The secure-rdma crate's examples on real Soft-RoCE: `message_server` (an
//! application receiving through `Server::with_handler`) on 10.77.0.1, and
//! `message_client` from 10.77.0.2. The server application must print
//! exactly what each client sent, attributed to it.
//!
//! Run inside the lab VM: `scripts/softroce-vm.sh` (scripts/test.sh does; it
//! builds the examples with `cargo build --examples`).

use std::time::Duration;

use secure_rdma::server::render;
use secure_rdma_tests::example::{example, MessageServer};
use secure_rdma_tests::secure::Pki;
use secure_rdma_tests::{require_lab, spawn, text, wait_with_deadline, ADDR_A};

const DEADLINE: Duration = Duration::from_secs(90);
const PORT: u16 = 4801;

/// Runs `message_client` as `name` with these arguments; its stdout.
fn client(pki: &Pki, name: &str, args: &[&str]) -> String {
    let out = wait_with_deadline(
        spawn(
            example("message_client")
                .args([
                    ADDR_A,
                    "--port",
                    &PORT.to_string(),
                    "--name",
                    name,
                    "--certs",
                ])
                .arg(pki.dir())
                .args(args),
        ),
        DEADLINE,
        name,
    );
    assert!(
        out.status.success(),
        "message_client {name}: {}",
        text(&out.stderr)
    );
    text(&out.stdout)
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn the_example_server_application_gets_exactly_what_the_example_clients_sent() {
    require_lab();
    let pki = Pki::new();
    pki.clients(&["alice".to_owned(), "bob".to_owned()]);
    let mut server = MessageServer::start(pki.dir(), PORT, &["--capacity", "2"]);
    let out = server.out.clone();

    // More messages than the channel holds: the sessions wait for the application, none is lost.
    let alice = [
        "hello from alice",
        "ünïcode, spaces  and \"quotes\"",
        "3",
        "4",
    ];
    let stdout = client(&pki, "alice", &alice);
    assert!(stdout.contains("connected as alice"), "{stdout}");
    assert!(stdout.contains("acknowledged send #4: 1 bytes"), "{stdout}");
    let bob = ["bob wrote this"];
    let stdout = client(&pki, "bob", &["--write", bob[0]]);
    assert!(
        stdout.contains("acknowledged write #1: 14 bytes"),
        "{stdout}"
    );

    let expected: Vec<String> = alice
        .iter()
        .map(|m| format!("alice: {}", render(m.as_bytes())))
        .chain(bob.iter().map(|m| format!("bob: {}", render(m.as_bytes()))))
        .collect();
    // Acknowledged means the application has it; the line is printed just after.
    out.wait_for("every delivery printed", expected.len(), DEADLINE, |l| {
        l.starts_with("alice: \"") || l.starts_with("bob: \"")
    });

    // SIGTERM: the server stops, the application's loop ends and prints its counts.
    server.signal(libc::SIGTERM);
    let status = server.wait();
    assert!(
        status.success(),
        "message_server: {status}; stderr:\n{}",
        server.err.snapshot().join("\n")
    );
    let lines = out.snapshot();
    let deliveries: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains(": \"") || l.contains(": hex:"))
        .collect();
    assert_eq!(
        deliveries,
        expected.iter().collect::<Vec<_>>(),
        "{lines:#?}"
    );
    let alice_bytes: usize = alice.iter().map(|m| m.len()).sum();
    for summary in [
        "served 2 clients (0 refused)".to_owned(),
        format!("alice: 4 messages, {alice_bytes} bytes"),
        "bob: 1 messages, 14 bytes".to_owned(),
    ] {
        assert!(lines.contains(&summary), "no {summary:?} in {lines:#?}");
    }
}
