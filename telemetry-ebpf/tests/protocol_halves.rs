//! The collector protocol has two independent halves: the interceptor's
//! (`rdma_intercept::protocol`: formats requests, parses replies; libc only, so
//! it can live in a preloaded object) and the collector's
//! (`telemetry_ebpf::collector::protocol`: parses requests, formats replies).
//! Here each line one half writes is read by the other, so they cannot drift.
//!
//! The interceptor's half is compiled in from its source file: linking the
//! `rdma-intercept` crate itself would bring its exported `ibv_*` hooks into a
//! binary that also has libibverbs' stubs.

#[path = "../../rdma-intercept/src/protocol.rs"]
#[allow(dead_code)]
mod client;
use secure_rdma::quota::Verb;
use telemetry_ebpf::collector::protocol as server;

fn server_verb(v: client::Verb) -> Verb {
    match v {
        client::Verb::QpCreate => Verb::QpCreate,
        client::Verb::PdAlloc => Verb::PdAlloc,
        client::Verb::CqCreate => Verb::CqCreate,
        client::Verb::MrReg => Verb::MrReg,
    }
}

#[test]
fn every_request_the_interceptor_sends_parses_in_the_collector() {
    assert_eq!(client::MAX_LINE, server::MAX_LINE);
    let verbs = [
        client::Verb::QpCreate,
        client::Verb::PdAlloc,
        client::Verb::CqCreate,
    ];
    for verb in verbs {
        let line = client::Request::Admit { verb, bytes: None }.to_line();
        let parsed = server::Request::parse(line.trim_end_matches('\n').as_bytes());
        assert_eq!(
            parsed,
            Ok(server::Request::Admit {
                verb: server_verb(verb),
                bytes: 0
            }),
            "{line:?}"
        );
    }
    for bytes in [0, 1, 4096, u64::MAX] {
        let line = client::Request::Admit {
            verb: client::Verb::MrReg,
            bytes: Some(bytes),
        }
        .to_line();
        let parsed = server::Request::parse(line.trim_end_matches('\n').as_bytes());
        assert_eq!(
            parsed,
            Ok(server::Request::Admit {
                verb: Verb::MrReg,
                bytes
            }),
            "{line:?}"
        );
    }
    for ticket in [0, 7, u64::MAX] {
        let line = client::Request::Release { ticket }.to_line();
        assert_eq!(
            server::Request::parse(line.trim_end_matches('\n').as_bytes()),
            Ok(server::Request::Release { ticket })
        );
    }
    let line = client::Request::Stats.to_line();
    assert_eq!(
        server::Request::parse(line.trim_end_matches('\n').as_bytes()),
        Ok(server::Request::Stats)
    );
    // A hostile program name cannot break the framing.
    let line = client::Request::Hello {
        comm: format!("evil\nRELEASE 1\n{}", "x".repeat(2000)),
    }
    .to_line();
    assert!(line.len() <= client::MAX_LINE && line.matches('\n').count() == 1);
    assert!(matches!(
        server::Request::parse(line.trim_end_matches('\n').as_bytes()),
        Ok(server::Request::Hello { .. })
    ));
}

#[test]
fn every_reply_the_collector_sends_parses_in_the_interceptor() {
    let cases = [
        (server::Reply::Ticket(42), client::Reply::Ticket(42)),
        (server::Reply::Ok, client::Reply::Ok(String::new())),
        (
            server::Reply::OkWith("global QP=1 PD=1 CQ=1 MR=0 MR_BYTES=0".into()),
            client::Reply::Ok("global QP=1 PD=1 CQ=1 MR=0 MR_BYTES=0".into()),
        ),
        (
            server::Reply::Deny("QP_COUNT limit 1 reached globally (1 live)".into()),
            client::Reply::Deny("QP_COUNT limit 1 reached globally (1 live)".into()),
        ),
        (
            server::Reply::Err("unknown ticket 9".into()),
            client::Reply::Err("unknown ticket 9".into()),
        ),
    ];
    for (sent, want) in cases {
        let line = sent.to_line();
        assert!(line.ends_with('\n') && line.len() <= server::MAX_LINE);
        assert_eq!(
            client::Reply::parse(line.trim_end_matches('\n')),
            Ok(want),
            "{line:?}"
        );
    }
    // A reason with newlines and any length still arrives as one line.
    let line = server::Reply::Deny(format!("a\nb{}", "y".repeat(1000))).to_line();
    assert!(line.len() <= server::MAX_LINE && line.matches('\n').count() == 1);
    assert!(matches!(
        client::Reply::parse(line.trim_end_matches('\n')),
        Ok(client::Reply::Deny(_))
    ));
}
