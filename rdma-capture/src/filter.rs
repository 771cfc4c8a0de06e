//! Which decoded packets `rdma-capture` shows: by QP and by opcode class.

use std::fmt;
use std::str::FromStr;

use roce::Packet;
use roce::{Operation, Transport};

/// A class of opcodes, as named on the command line (`--class send,ack`).
///
/// Operation classes (`send`, `write`, `read`, `atomic`, `ack`, `cnp`) match whatever the
/// transport; transport classes (`rc`, `uc`, `rd`, `ud`, `xrc`) match every opcode of that
/// service.
///
/// ```
/// use rdma_capture::filter::OpClass;
///
/// let class: OpClass = "write".parse()?;
/// assert_eq!(class, OpClass::Write);
/// assert!("fetch".parse::<OpClass>().is_err());
/// # Ok::<(), rdma_capture::filter::UnknownClass>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpClass {
    /// SEND First/Middle/Last/Only, with immediate or invalidate.
    Send,
    /// RDMA WRITE First/Middle/Last/Only, with immediate.
    Write,
    /// RDMA READ requests and responses.
    Read,
    /// Compare-and-swap, fetch-and-add, ATOMIC WRITE and their acknowledgements.
    Atomic,
    /// Acknowledge (ACK, NAK, RNR NAK).
    Ack,
    /// Congestion notification packets.
    Cnp,
    /// Every opcode of one transport service.
    Transport(Transport),
}

impl OpClass {
    /// Every class name accepted by [`FromStr`].
    pub const NAMES: [&'static str; 11] = [
        "send", "write", "read", "atomic", "ack", "cnp", "rc", "uc", "rd", "ud", "xrc",
    ];

    /// True when the packet's opcode belongs to this class.
    pub fn matches(self, p: &Packet<'_>) -> bool {
        let opcode = p.opcode();
        let op = opcode.operation();
        match self {
            OpClass::Transport(t) => opcode.transport() == t,
            OpClass::Send => matches!(
                op,
                Operation::SendFirst
                    | Operation::SendMiddle
                    | Operation::SendLast
                    | Operation::SendLastImm
                    | Operation::SendOnly
                    | Operation::SendOnlyImm
                    | Operation::SendLastInvalidate
                    | Operation::SendOnlyInvalidate
            ),
            OpClass::Write => matches!(
                op,
                Operation::WriteFirst
                    | Operation::WriteMiddle
                    | Operation::WriteLast
                    | Operation::WriteLastImm
                    | Operation::WriteOnly
                    | Operation::WriteOnlyImm
            ),
            OpClass::Read => matches!(
                op,
                Operation::ReadRequest
                    | Operation::ReadResponseFirst
                    | Operation::ReadResponseMiddle
                    | Operation::ReadResponseLast
                    | Operation::ReadResponseOnly
            ),
            OpClass::Atomic => matches!(
                op,
                Operation::CompareSwap
                    | Operation::FetchAdd
                    | Operation::AtomicWrite
                    | Operation::AtomicAcknowledge
            ),
            OpClass::Ack => op == Operation::Acknowledge,
            OpClass::Cnp => op == Operation::Cnp,
        }
    }
}

/// A class name that [`OpClass`] does not know.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown opcode class {0:?} (expected one of: {names})", names = OpClass::NAMES.join(", "))]
pub struct UnknownClass(pub String);

impl FromStr for OpClass {
    type Err = UnknownClass;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "send" => OpClass::Send,
            "write" => OpClass::Write,
            "read" => OpClass::Read,
            "atomic" => OpClass::Atomic,
            "ack" => OpClass::Ack,
            "cnp" => OpClass::Cnp,
            "rc" => OpClass::Transport(Transport::Rc),
            "uc" => OpClass::Transport(Transport::Uc),
            "rd" => OpClass::Transport(Transport::Rd),
            "ud" => OpClass::Transport(Transport::Ud),
            "xrc" => OpClass::Transport(Transport::Xrc),
            _ => return Err(UnknownClass(s.to_owned())),
        })
    }
}

impl fmt::Display for OpClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpClass::Send => f.write_str("send"),
            OpClass::Write => f.write_str("write"),
            OpClass::Read => f.write_str("read"),
            OpClass::Atomic => f.write_str("atomic"),
            OpClass::Ack => f.write_str("ack"),
            OpClass::Cnp => f.write_str("cnp"),
            OpClass::Transport(t) => f.write_str(&t.as_str().to_ascii_lowercase()),
        }
    }
}

/// The opcode classes to show; empty shows everything.
///
/// The QP filter is not here: which packets belong to a QP (its own requests *and* its peer's
/// responses, whose destination is the peer) is decided by the PSN follower, which pairs the two
/// directions of a connection.
///
/// ```
/// use rdma_capture::filter::ClassFilter;
/// # let frame = roce::doc_example_frame();
/// let ack = roce::decode_ethernet(&frame)?;
///
/// assert!(ClassFilter::parse("ack,cnp").unwrap().matches(&ack));
/// assert!(!ClassFilter::parse("send").unwrap().matches(&ack));
/// assert!(ClassFilter::default().matches(&ack));
/// # Ok::<(), roce::DecodeError>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClassFilter {
    classes: Vec<OpClass>,
}

impl ClassFilter {
    /// A filter showing packets of any of `classes`.
    pub fn new(classes: Vec<OpClass>) -> ClassFilter {
        ClassFilter { classes }
    }

    /// Parses a comma-separated list of class names.
    pub fn parse(list: &str) -> Result<ClassFilter, UnknownClass> {
        let classes = list
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::parse)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ClassFilter { classes })
    }

    /// True when the filter is empty or the packet matches one of its classes.
    pub fn matches(&self, p: &Packet<'_>) -> bool {
        self.classes.is_empty() || self.classes.iter().any(|c| c.matches(p))
    }

    /// The classes, in the order given.
    pub fn classes(&self) -> &[OpClass] {
        &self.classes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use roce::Opcode;

    #[test]
    fn every_name_round_trips() {
        for name in OpClass::NAMES {
            let class: OpClass = name.parse().unwrap();
            assert_eq!(class.to_string(), name);
        }
        assert_eq!("WRITE".parse::<OpClass>(), Ok(OpClass::Write));
        let err = "fetch".parse::<OpClass>().unwrap_err().to_string();
        assert!(
            err.contains("\"fetch\"") && err.contains("send, write"),
            "{err}"
        );
    }

    #[test]
    fn operation_classes_partition_the_rc_opcodes_that_carry_data_or_acks() {
        // Every RC opcode falls in exactly one operation class, except RESYNC and FLUSH,
        // which no class names.
        for opcode in Opcode::all().filter(|o| o.transport() == Transport::Rc) {
            let op = opcode.operation();
            let n = [
                OpClass::Send,
                OpClass::Write,
                OpClass::Read,
                OpClass::Atomic,
                OpClass::Ack,
            ]
            .into_iter()
            .filter(|c| class_matches_operation(*c, op))
            .count();
            let expected = usize::from(!matches!(op, Operation::Resync | Operation::Flush));
            assert_eq!(n, expected, "{}", opcode.name());
        }
    }

    fn class_matches_operation(class: OpClass, op: Operation) -> bool {
        let frame = roce::doc_example_frame();
        let mut p = roce::decode_ethernet(&frame).unwrap();
        let code = Opcode::all()
            .find(|o| o.transport() == Transport::Rc && o.operation() == op)
            .unwrap();
        p.bth.opcode = code;
        class.matches(&p)
    }

    #[test]
    fn empty_list_matches_all_and_bad_name_fails() {
        assert!(ClassFilter::parse("").unwrap().classes().is_empty());
        assert_eq!(
            ClassFilter::parse("send, ud").unwrap().classes(),
            &[OpClass::Send, OpClass::Transport(Transport::Ud)]
        );
        assert!(ClassFilter::parse("send,bogus").is_err());
    }
}
