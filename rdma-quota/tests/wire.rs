//! The collector protocol's two directions, each written by one side and
//! read by the other: every line the interceptor writes ([`Request::to_line`])
//! parses in the collector ([`Request::parse`]) as what was sent, and every
//! reply the collector writes ([`Reply::to_line`]) parses in the interceptor
//! ([`Reply::parse`]), for all verbs and for hostile payloads.
//!
//! Both sides use the one `rdma_quota::wire`, so these check that its halves
//! agree with each other rather than two copies with each other.

use rdma_quota::wire::{BadRequest, Reply, Request, MAX_LINE};
use rdma_quota::Verb;

/// What the collector reads from a line the interceptor wrote.
fn sent(request: &Request) -> Result<Request, BadRequest> {
    let line = request.to_line();
    assert!(line.ends_with('\n'), "{line:?}");
    assert_eq!(line.matches('\n').count(), 1, "{line:?}");
    assert!(line.len() <= MAX_LINE, "{} bytes", line.len());
    Request::parse(line.trim_end_matches('\n').as_bytes())
}

/// What the interceptor reads from a line the collector wrote.
fn replied(reply: &Reply) -> Reply {
    let line = reply.to_line();
    assert!(line.ends_with('\n'), "{line:?}");
    assert_eq!(line.matches('\n').count(), 1, "{line:?}");
    assert!(line.len() <= MAX_LINE, "{} bytes", line.len());
    Reply::parse(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"))
}

#[test]
fn every_admit_round_trips_for_every_verb() {
    for verb in Verb::ALL {
        let lengths: &[u64] = if verb == Verb::MrReg {
            &[0, 1, 4096, u64::MAX]
        } else {
            &[0]
        };
        for &bytes in lengths {
            let request = Request::Admit { verb, bytes };
            let read = sent(&request);
            if verb.destroys().is_some() {
                // Destruction is released, never admitted.
                assert_eq!(read, Err(BadRequest::Destroying(verb)), "{verb}");
            } else {
                assert_eq!(read, Ok(request), "{verb}");
            }
        }
    }
}

#[test]
fn the_interceptors_lines_are_the_documented_ones() {
    // The creations the interceptor hooks, byte for byte as before the
    // halves were unified.
    let cases = [
        (Verb::QpCreate, 0, "ADMIT QP_CREATE\n"),
        (Verb::PdAlloc, 0, "ADMIT PD_ALLOC\n"),
        (Verb::CqCreate, 0, "ADMIT CQ_CREATE\n"),
        (Verb::MrReg, 4096, "ADMIT MR_REG 4096\n"),
    ];
    for (verb, bytes, line) in cases {
        assert_eq!(Request::Admit { verb, bytes }.to_line(), line);
    }
}

#[test]
fn a_length_where_none_belongs_is_refused_not_dropped() {
    let read = sent(&Request::Admit {
        verb: Verb::QpCreate,
        bytes: 4096,
    });
    assert_eq!(
        read.map_err(|e| e.to_string()),
        Err("unexpected \"4096\" after ADMIT".to_owned())
    );
}

#[test]
fn release_stats_and_hello_round_trip() {
    for ticket in [0, 7, u64::MAX] {
        let request = Request::Release { ticket };
        assert_eq!(sent(&request), Ok(request));
    }
    assert_eq!(sent(&Request::Stats), Ok(Request::Stats));
    for protocol in [None, Some(rdma_quota::wire::VERSION)] {
        let hello = Request::Hello {
            comm: "ibv_rc_pingpong".into(),
            protocol,
        };
        assert_eq!(sent(&hello), Ok(hello));
    }
}

#[test]
fn a_hostile_program_name_cannot_break_the_framing() {
    let request = Request::Hello {
        comm: format!("evil\nRELEASE 1\n{}", "x".repeat(2000)),
        protocol: Some(3),
    };
    match sent(&request) {
        Ok(Request::Hello { comm, protocol }) => {
            assert!(comm.starts_with("evil?RELEASE 1?x"), "{comm}");
            assert_eq!(protocol, Some(3), "the version survives the cut name");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn every_reply_round_trips() {
    let cases = [
        Reply::Ticket(0),
        Reply::Ticket(42),
        Reply::Ticket(u64::MAX),
        Reply::Ok,
        Reply::OkWith("global QP=1 PD=1 CQ=1 MR=0 MR_BYTES=0".into()),
        Reply::OkWith(
            "global QP=1 PD=0 CQ=0 MR=0 MR_BYTES=0 tenant alice QP=1 PD=0 CQ=0 MR=0 MR_BYTES=0"
                .into(),
        ),
        Reply::Deny("QP_COUNT limit 1 reached globally (1 live)".into()),
        Reply::Deny(
            "MR_BYTES limit 8192 would be exceeded globally (8192 registered + 1 requested)".into(),
        ),
        Reply::Err("unknown ticket 9".into()),
        Reply::Err("too many connections for uid 1000 (limit 256)".into()),
    ];
    for reply in cases {
        assert_eq!(replied(&reply), reply);
    }
}

#[test]
fn a_hostile_reason_still_arrives_as_one_reply() {
    let reply = Reply::Deny(format!("a\nb\r{}", "y".repeat(1000)));
    match replied(&reply) {
        Reply::Deny(reason) => {
            assert!(reason.starts_with("a b y"), "{reason}");
            assert_eq!(reason.len(), MAX_LINE - 1 - "DENY ".len());
        }
        other => panic!("{other:?}"),
    }
}
