//! The event record that `bpf/monitor.bpf.c` writes to the ring buffer, and its parser.

use rdma_quota::Verb;

use telemetry_ebpf::abi::{self, monitor_event as off};

/// Size of one raw event record (`struct event` in `bpf/monitor.bpf.c`, [`abi::MonitorEvent`]).
pub const EVENT_RECORD_LEN: usize = abi::MONITOR_EVENT_LEN;

const COMM_LEN: usize = abi::COMM_LEN as usize;
const DEVICE_LEN: usize = abi::IB_DEVICE_NAME_MAX as usize;

/// One RDMA control-path call seen by the kernel programs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// When the call returned, `CLOCK_MONOTONIC` nanoseconds (`bpf_ktime_get_ns`).
    pub ktime_ns: u64,
    /// Process id (thread-group id) of the caller.
    pub pid: u32,
    /// Command name of the calling thread (at most 15 bytes).
    pub comm: String,
    /// cgroup v2 id of the caller (the inode number of its cgroup directory).
    pub cgroup_id: u64,
    /// Which verb.
    pub verb: Verb,
    /// RDMA device name (`rxe-a`, `mlx5_0`); empty when the kernel did not expose it
    /// (`CM_SEND_REQ`, or a create that failed before the device was known).
    pub device: String,
    /// 0 on success, else the negative errno the kernel returned (error pointers decoded).
    pub result: i32,
    /// Time spent in the kernel function, entry to return, in nanoseconds (0 for `CM_SEND_REQ`,
    /// which is a tracepoint).
    pub latency_ns: u64,
}

/// Why a raw ring-buffer record could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventParseError {
    /// The record is shorter than [`EVENT_RECORD_LEN`].
    #[error("event record truncated: {len} bytes, need {EVENT_RECORD_LEN}")]
    Truncated {
        /// Bytes received.
        len: usize,
    },
    /// The verb byte is not a known [`Verb`] id.
    #[error("event record has unknown verb id {0}")]
    UnknownVerb(u8),
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[off..off + 4]);
    u32::from_le_bytes(a)
}

/// A NUL-terminated (or full-length) C string field, lossily decoded.
fn c_str(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// Parses one raw event record (little endian, layout documented in `bpf/monitor.bpf.c`).
///
/// Longer records are accepted (the extra bytes are ignored) so that a newer kernel object can
/// append fields.
///
/// # Examples
///
/// ```
/// use rdma_monitor::monitor::{parse_event, EventParseError};
///
/// assert_eq!(parse_event(&[0; 10]), Err(EventParseError::Truncated { len: 10 }));
/// ```
pub fn parse_event(raw: &[u8]) -> Result<Event, EventParseError> {
    if raw.len() < EVENT_RECORD_LEN {
        return Err(EventParseError::Truncated { len: raw.len() });
    }
    let verb_id = raw[off::VERB];
    let verb = Verb::from_id(verb_id).ok_or(EventParseError::UnknownVerb(verb_id))?;
    Ok(Event {
        ktime_ns: u64_at(raw, off::KTIME_NS),
        cgroup_id: u64_at(raw, off::CGROUP_ID),
        latency_ns: u64_at(raw, off::LATENCY_NS),
        pid: u32_at(raw, off::PID),
        // The thread id (off::TID) is not exposed.
        result: u32_at(raw, off::RESULT) as i32,
        verb,
        comm: c_str(&raw[off::COMM..off::COMM + COMM_LEN]),
        device: c_str(&raw[off::DEVICE..off::DEVICE + DEVICE_LEN]),
    })
}

#[cfg(test)]
pub(crate) fn encode_event(e: &Event, tid: u32) -> Vec<u8> {
    let mut b = vec![0u8; EVENT_RECORD_LEN];
    b[off::KTIME_NS..][..8].copy_from_slice(&e.ktime_ns.to_le_bytes());
    b[off::CGROUP_ID..][..8].copy_from_slice(&e.cgroup_id.to_le_bytes());
    b[off::LATENCY_NS..][..8].copy_from_slice(&e.latency_ns.to_le_bytes());
    b[off::PID..][..4].copy_from_slice(&e.pid.to_le_bytes());
    b[off::TID..][..4].copy_from_slice(&tid.to_le_bytes());
    b[off::RESULT..][..4].copy_from_slice(&e.result.to_le_bytes());
    b[off::VERB] = e.verb.id();
    let comm = e.comm.as_bytes();
    b[off::COMM..off::COMM + comm.len()].copy_from_slice(comm);
    let dev = e.device.as_bytes();
    b[off::DEVICE..off::DEVICE + dev.len()].copy_from_slice(dev);
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Event {
        Event {
            ktime_ns: 123_456_789_012,
            pid: 4242,
            comm: "ibv_rc_pingpong".into(),
            cgroup_id: 0x1_0000_0007,
            verb: Verb::MrReg,
            device: "rxe-a".into(),
            result: -12,
            latency_ns: 35_000,
        }
    }

    #[test]
    fn round_trip() {
        let e = sample();
        let raw = encode_event(&e, 4243);
        assert_eq!(parse_event(&raw), Ok(e));
    }

    #[test]
    fn every_verb_parses() {
        for verb in Verb::ALL {
            let e = Event { verb, ..sample() };
            assert_eq!(parse_event(&encode_event(&e, 1)).unwrap().verb, verb);
        }
    }

    #[test]
    fn truncated_records_are_errors_not_panics() {
        let raw = encode_event(&sample(), 1);
        for len in 0..EVENT_RECORD_LEN {
            assert_eq!(
                parse_event(&raw[..len]),
                Err(EventParseError::Truncated { len })
            );
        }
    }

    #[test]
    fn longer_records_are_accepted() {
        let mut raw = encode_event(&sample(), 1);
        raw.extend_from_slice(&[0xff; 16]);
        assert_eq!(parse_event(&raw), Ok(sample()));
    }

    #[test]
    fn unknown_verb_is_an_error() {
        let mut raw = encode_event(&sample(), 1);
        raw[36] = 200;
        assert_eq!(parse_event(&raw), Err(EventParseError::UnknownVerb(200)));
    }

    #[test]
    fn unterminated_and_non_utf8_strings() {
        let mut raw = encode_event(&sample(), 1);
        raw[off::COMM..off::COMM + COMM_LEN].fill(b'x');
        raw[off::DEVICE..off::DEVICE + DEVICE_LEN].fill(0xff);
        let e = parse_event(&raw).unwrap();
        assert_eq!(e.comm, "x".repeat(16));
        assert_eq!(e.device.chars().count(), 64);
        assert!(e.device.chars().all(|c| c == char::REPLACEMENT_CHARACTER));
    }

    #[test]
    fn empty_device_and_zero_latency() {
        let e = Event {
            verb: Verb::CmSendReq,
            device: String::new(),
            latency_ns: 0,
            result: 0,
            ..sample()
        };
        assert_eq!(parse_event(&encode_event(&e, 9)), Ok(e));
    }
}
