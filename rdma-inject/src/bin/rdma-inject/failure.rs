//! A failed run as `rdma-inject` reports it: the library's [`RunError`] says what went wrong,
//! and this module adds what to change on this command line (its flags, its other modes) and
//! picks the exit code that `--help` promises.

use rdma_inject::net::NetError;
use rdma_inject::run::{NotLearned, RunError, Shortfall};

/// The exit code of a failed run: 1 error, 3 no `CAP_NET_RAW`, 4 nothing learned before
/// `--timeout`. (2, a usage error, is decided before anything runs.)
pub fn exit_code(e: &RunError) -> u8 {
    match e {
        RunError::Net(NetError::NotPermitted) => 3,
        RunError::NothingLearned(_) => 4,
        _ => 1,
    }
}

/// The message for stderr (after `rdma-inject: `): the library's text, with the flags that
/// fix it where there are such.
pub fn message(e: &RunError) -> String {
    match e {
        RunError::Net(NetError::NotPermitted) => {
            format!("{e}: run rdma-inject as root (or give the binary CAP_NET_RAW)")
        }
        RunError::NothingLearned(n) => not_learned(n),
        RunError::RawNeedsObserve(_) => {
            format!("{e}: replay it with --observe IFACE, which takes the MACs from the live flow")
        }
        RunError::NoRequestsToFlow { dst, .. } => format!(
            "{e}: capture that flow (e.g. rdma-inject --observe IFACE --dst {dst} --save FILE)"
        ),
        _ => e.to_string(),
    }
}

/// Learning gave up: the library's account, naming the flag behind the bound that was not
/// met, and which flags to change.
fn not_learned(n: &NotLearned) -> String {
    let (what, hint) = match n.missing {
        Shortfall::TooFewRequests { seen, wanted } => (
            format!("only {seen} of the {wanted} requests asked for (--min-packets) were seen"),
            "Lower --min-packets or raise --timeout.",
        ),
        Shortfall::NeverQuiet { .. } => (
            n.missing.to_string(),
            "Lower --quiet-ms or raise --timeout.",
        ),
        Shortfall::NoSealed => (
            n.missing.to_string(),
            "Is the peer's payload protection on? Against an unprotected peer give --sealed-seq N.",
        ),
        Shortfall::NoReflection { .. } => (
            n.missing.to_string(),
            "Observe while --dst sends its next message, or give --sealed-seq N.",
        ),
        // NoRequest, and whatever a later library finds missing.
        _ => (
            n.missing.to_string(),
            "Check --dst and the interface (the requester's link, e.g. veth-b).",
        ),
    };
    let to = match n.dst {
        Some(d) => format!(", looking for requests to {d}"),
        None => String::new(),
    };
    format!(
        "{what} on {iface} within {secs} s (saw {frames} frames, {roce} of them RoCEv2{to}): is \
         the session running and passing through {iface}? {hint}",
        iface = n.iface,
        secs = n.secs,
        frames = n.frames,
        roce = n.roce,
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn nothing_learned(missing: Shortfall, dst: Option<std::net::IpAddr>) -> RunError {
        RunError::NothingLearned(Box::new(NotLearned {
            missing,
            iface: "veth-b".into(),
            secs: 5,
            frames: 12,
            roce: 0,
            dst,
        }))
    }

    #[test]
    fn exit_codes_tell_permission_and_timeout_apart() {
        assert_eq!(exit_code(&RunError::Net(NetError::NotPermitted)), 3);
        let e = nothing_learned(Shortfall::NoRequest, Some([10, 77, 0, 1].into()));
        assert_eq!(exit_code(&e), 4);
        let msg = message(&e);
        assert!(
            msg.starts_with(
                "no RC SEND or RDMA WRITE request was seen on veth-b within 5 s (saw 12 frames, \
                 0 of them RoCEv2, looking for requests to 10.77.0.1)"
            ),
            "{msg}"
        );
        assert_eq!(
            exit_code(&RunError::Net(NetError::NoSuchInterface("x".into()))),
            1
        );
    }

    #[test]
    fn giving_up_names_the_flags_to_change() {
        assert_eq!(
            message(&nothing_learned(
                Shortfall::NoRequest,
                Some([10, 77, 0, 1].into())
            )),
            "no RC SEND or RDMA WRITE request was seen on veth-b within 5 s (saw 12 frames, 0 of \
             them RoCEv2, looking for requests to 10.77.0.1): is the session running and passing \
             through veth-b? Check --dst and the interface (the requester's link, e.g. veth-b)."
        );
        assert_eq!(
            message(&nothing_learned(
                Shortfall::TooFewRequests { seen: 1, wanted: 2 },
                None
            )),
            "only 1 of the 2 requests asked for (--min-packets) were seen on veth-b within 5 s \
             (saw 12 frames, 0 of them RoCEv2): is the session running and passing through \
             veth-b? Lower --min-packets or raise --timeout."
        );
        assert_eq!(
            message(&nothing_learned(
                Shortfall::NeverQuiet {
                    quiet: Duration::from_millis(300)
                },
                None
            )),
            "the flow was never quiet for 300 ms after a complete message on veth-b within 5 s \
             (saw 12 frames, 0 of them RoCEv2): is the session running and passing through \
             veth-b? Lower --quiet-ms or raise --timeout."
        );
    }

    #[test]
    fn replay_and_permission_errors_name_the_way_out() {
        assert_eq!(
            message(&RunError::RawNeedsObserve("raw.pcap".into())),
            "raw.pcap: the capture starts at the IP header (no MACs to send with): replay it \
             with --observe IFACE, which takes the MACs from the live flow"
        );
        assert_eq!(
            message(&RunError::NoRequestsToFlow {
                path: "other.pcap".into(),
                requests: 3,
                dst: [10, 77, 0, 1].into(),
            }),
            "other.pcap: none of its 3 requests goes to 10.77.0.1, the live flow's responder: \
             capture that flow (e.g. rdma-inject --observe IFACE --dst 10.77.0.1 --save FILE)"
        );
        assert_eq!(
            message(&RunError::Net(NetError::NotPermitted)),
            "opening an AF_PACKET socket needs CAP_NET_RAW: run rdma-inject as root (or give \
             the binary CAP_NET_RAW)"
        );
        // Errors without a flag to name read as the library says them.
        let e = RunError::Net(NetError::NoSuchInterface("x".into()));
        assert_eq!(message(&e), e.to_string());
    }
}
