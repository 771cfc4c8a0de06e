//! The requests of a capture file, ready to be sent again (`--replay`).
//!
//! Only RoCEv2 *request* packets are replayed (SEND, WRITE, READ requests, atomics): ACKs and
//! READ responses answer a particular request and mean nothing on their own. Records a snap
//! length cut cannot be sent again and are skipped. Captures that start at the IP header
//! (`LINKTYPE_RAW`, rxe kprobe captures) get a synthetic Ethernet header with zero MACs, so
//! they can only be replayed renumbered into a live flow, which supplies real MACs.

use roce::pcap::{self, LinkType};
use roce::Packet;

/// The most records replayed from one file: bounds what one run sends.
pub const MAX_REPLAY: usize = 1_000_000;

/// Why a capture cannot be replayed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// The file is not a readable pcap/pcapng file.
    #[error("reading the capture: {0}")]
    Pcap(#[source] pcap::PcapError),
    /// No request packet in the file.
    #[error(
        "the capture holds no complete RoCEv2 request packet ({records} records: {skipped} \
         skipped as not RoCEv2, responses or cut by the snap length): capture the victim's \
         SENDs or WRITEs first"
    )]
    NoRequests {
        /// Records read.
        records: usize,
        /// Records that were not replayable requests.
        skipped: usize,
    },
    /// More requests than one run sends.
    #[error(
        "the capture holds more than {MAX_REPLAY} requests: cut it (editcap -r) and replay a part"
    )]
    TooMany,
}

/// One request of a capture.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapturedRequest {
    /// The whole Ethernet frame.
    pub frame: Vec<u8>,
    /// True if the file held no Ethernet header and zero MACs were put in front.
    pub synthetic_ethernet: bool,
}

impl CapturedRequest {
    /// Decodes the frame again (it decoded when read).
    pub fn packet(&self) -> Result<Packet<'_>, roce::DecodeError> {
        roce::decode_ethernet(&self.frame)
    }
}

/// The requests in a capture file's bytes, in file order.
///
/// ```
/// use roce::pcap::{LinkType, PcapWriter, Resolution, Timestamp};
/// use roce::{Opcode, PacketBuilder};
///
/// let send = PacketBuilder::new(Opcode::RC_SEND_ONLY).dest_qp(17).payload(*b"hi").frame()?;
/// let mut w = PcapWriter::new(Vec::new(), LinkType::Ethernet, 65535, Resolution::Nanos)?;
/// w.write_packet(Timestamp::now(), &send, send.len())?;
/// let file = w.into_inner()?;
/// let requests = rdma_inject::replay::requests_from_pcap(&file)?;
/// assert_eq!(requests[0].frame, send);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn requests_from_pcap(file: &[u8]) -> Result<Vec<CapturedRequest>, ReplayError> {
    let (_, records) = pcap::read(file).map_err(ReplayError::Pcap)?;
    let (mut out, mut records_seen, mut skipped) = (Vec::new(), 0, 0);
    for record in records {
        let record = record.map_err(ReplayError::Pcap)?;
        records_seen += 1;
        let (frame, synthetic_ethernet) = match record.link {
            LinkType::Ethernet => (record.data.to_vec(), false),
            LinkType::Raw => match pcap::ethernet_for_ip(record.data) {
                Some(f) => (f, true),
                None => {
                    skipped += 1;
                    continue;
                }
            },
            LinkType::Other(_) => {
                skipped += 1;
                continue;
            }
        };
        // A record the snap length cut has lost its payload's end and ICRC.
        let cut = usize::try_from(record.orig_len).map_or(true, |n| n > record.data.len());
        let replayable = !cut
            && roce::decode_ethernet(&frame).is_ok_and(|p| p.opcode().operation().is_request());
        if !replayable {
            skipped += 1;
            continue;
        }
        if out.len() == MAX_REPLAY {
            return Err(ReplayError::TooMany);
        }
        out.push(CapturedRequest {
            frame,
            synthetic_ethernet,
        });
    }
    if out.is_empty() {
        return Err(ReplayError::NoRequests {
            records: records_seen,
            skipped,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use roce::pcap::{PcapWriter, Resolution, Timestamp};
    use roce::{Aeth, AethSyndrome, Opcode, PacketBuilder};

    fn file(link: LinkType, records: &[(Vec<u8>, usize)]) -> Vec<u8> {
        let mut w = PcapWriter::new(Vec::new(), link, 65535, Resolution::Nanos).unwrap();
        for (data, orig) in records {
            w.write_packet(Timestamp::new(1, 0), data, *orig).unwrap();
        }
        w.into_inner().unwrap()
    }

    fn send(psn: u32) -> Vec<u8> {
        PacketBuilder::new(Opcode::RC_SEND_ONLY)
            .ipv4([10, 77, 0, 2].into(), [10, 77, 0, 1].into())
            .dest_qp(17)
            .psn(psn)
            .payload(*b"legit message")
            .frame()
            .unwrap()
    }

    #[test]
    fn keeps_requests_and_skips_acks_cut_records_and_other_traffic() {
        let ack = PacketBuilder::new(Opcode::RC_ACKNOWLEDGE)
            .aeth(Aeth {
                syndrome: AethSyndrome::Ack { credits: 1 },
                msn: 1,
            })
            .frame()
            .unwrap();
        let cut = send(3);
        let arp = vec![0xff; 60];
        let f = file(
            LinkType::Ethernet,
            &[
                (send(1), send(1).len()),
                (ack.clone(), ack.len()),
                (cut[..cut.len() - 2].to_vec(), cut.len()),
                (arp, 60),
                (send(2), send(2).len()),
            ],
        );
        let r = requests_from_pcap(&f).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].packet().unwrap().bth.psn, 1);
        assert_eq!(r[1].packet().unwrap().bth.psn, 2);
        assert!(!r[0].synthetic_ethernet);
    }

    #[test]
    fn raw_ip_captures_get_a_synthetic_ethernet_header() {
        let s = send(9);
        let f = file(LinkType::Raw, &[(s[14..].to_vec(), s.len() - 14)]);
        let r = requests_from_pcap(&f).unwrap();
        assert!(r[0].synthetic_ethernet);
        assert!(r[0].packet().unwrap().icrc_ok);
    }

    #[test]
    fn errors_say_what_is_wrong() {
        let ack_only = PacketBuilder::new(Opcode::RC_ACKNOWLEDGE)
            .aeth(Aeth {
                syndrome: AethSyndrome::Ack { credits: 1 },
                msn: 1,
            })
            .frame()
            .unwrap();
        let f = file(LinkType::Ethernet, &[(ack_only.clone(), ack_only.len())]);
        let e = requests_from_pcap(&f).unwrap_err();
        assert_eq!(
            e,
            ReplayError::NoRequests {
                records: 1,
                skipped: 1
            }
        );
        assert!(e.to_string().contains("no complete RoCEv2 request"));
        let e = requests_from_pcap(b"not a capture file at all, no").unwrap_err();
        assert!(matches!(e, ReplayError::Pcap(_)), "{e}");
        assert!(e.to_string().starts_with("reading the capture: "), "{e}");
    }
}
