//! The connection-setup wire format: length-prefixed JSON frames.
//!
//! A frame is a 4-byte big-endian length followed by that many bytes of
//! UTF-8 JSON. Frames above [`MAX_FRAME`] are refused before any allocation,
//! so a peer cannot make us buffer gigabytes by announcing a huge length.

use std::net::IpAddr;

use bytes::{Buf, BufMut, BytesMut};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::psn::{Psn, Qpn};
use crate::verbs::{Gid, PathMtu, RemoteBuffer};

/// Largest frame accepted, in bytes.
pub const MAX_FRAME: usize = 64 * 1024;

/// Errors of framing and message validation.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// The transport failed.
    #[error("connection error during handshake: {0}")]
    Io(#[from] std::io::Error),
    /// The peer closed the connection.
    #[error("peer closed the connection during the handshake")]
    Closed,
    /// A frame announced more than [`MAX_FRAME`] bytes.
    #[error("frame of {0} bytes exceeds the {MAX_FRAME}-byte limit")]
    TooLarge(usize),
    /// The frame was not the expected JSON message.
    #[error("malformed handshake message: {0}")]
    Malformed(String),
    /// A field had an invalid value.
    #[error("invalid {field} in handshake message: {reason}")]
    Invalid {
        /// Field name.
        field: &'static str,
        /// Why it was refused.
        reason: String,
    },
}

/// Everything a peer needs to connect its RC queue pair to ours and write
/// into our buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Endpoint {
    /// Our GID (RoCEv2: the IP address our RDMA traffic comes from).
    pub gid: Gid,
    /// Our queue pair number.
    pub qpn: Qpn,
    /// The first PSN we will send.
    pub psn: Psn,
    /// Our port's active MTU; the connection uses the smaller of both.
    pub mtu: PathMtu,
    /// The buffer the peer may RDMA WRITE into.
    pub buffer: RemoteBuffer,
}

impl Endpoint {
    /// Checks the fields serde cannot: a usable GID and a non-empty buffer.
    pub fn validate(&self) -> Result<(), HandshakeError> {
        if self.gid.is_zero() {
            return Err(HandshakeError::Invalid {
                field: "gid",
                reason: "all zeros".to_owned(),
            });
        }
        if let IpAddr::V4(v4) = self.gid.ip() {
            if v4.is_unspecified() || v4.is_broadcast() || v4.is_multicast() {
                return Err(HandshakeError::Invalid {
                    field: "gid",
                    reason: format!("{v4} is not a unicast address"),
                });
            }
        }
        if self.qpn.get() < 2 {
            return Err(HandshakeError::Invalid {
                field: "qpn",
                reason: format!("{} is a reserved QP", self.qpn),
            });
        }
        if self.buffer.len == 0 || self.buffer.addr.checked_add(self.buffer.len).is_none() {
            return Err(HandshakeError::Invalid {
                field: "buffer",
                reason: format!(
                    "{} bytes at {:#x} is not a valid region",
                    self.buffer.len, self.buffer.addr
                ),
            });
        }
        Ok(())
    }
}

/// Encodes `msg` as one frame.
pub fn encode<T: Serialize>(msg: &T) -> Result<BytesMut, HandshakeError> {
    let body = serde_json::to_vec(msg).map_err(|e| HandshakeError::Malformed(e.to_string()))?;
    if body.len() > MAX_FRAME {
        return Err(HandshakeError::TooLarge(body.len()));
    }
    let mut out = BytesMut::with_capacity(4 + body.len());
    out.put_u32(body.len() as u32);
    out.put_slice(&body);
    Ok(out)
}

/// Decodes one frame from the front of `buf`, if a whole one is there.
pub fn decode<T: DeserializeOwned>(buf: &mut BytesMut) -> Result<Option<T>, HandshakeError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if len > MAX_FRAME {
        return Err(HandshakeError::TooLarge(len));
    }
    if buf.len() < 4 + len {
        return Ok(None);
    }
    buf.advance(4);
    let body = buf.split_to(len);
    serde_json::from_slice(&body)
        .map(Some)
        .map_err(|e| HandshakeError::Malformed(e.to_string()))
}

/// Writes one frame.
pub async fn write_frame<W, T>(w: &mut W, msg: &T) -> Result<(), HandshakeError>
where
    W: AsyncWrite + Unpin,
    T: Serialize,
{
    w.write_all(&encode(msg)?).await?;
    w.flush().await?;
    Ok(())
}

/// Reads one frame, refusing oversized ones before reading their body.
pub async fn read_frame<R, T>(r: &mut R) -> Result<T, HandshakeError>
where
    R: AsyncRead + Unpin,
    T: DeserializeOwned,
{
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            return Err(HandshakeError::Closed)
        }
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(HandshakeError::TooLarge(len));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await.map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            HandshakeError::Closed
        } else {
            e.into()
        }
    })?;
    serde_json::from_slice(&body).map_err(|e| HandshakeError::Malformed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint() -> Endpoint {
        Endpoint {
            gid: "::ffff:10.77.0.1".parse().unwrap(),
            qpn: Qpn::new(0x11).unwrap(),
            psn: Psn::new(0xabcdef).unwrap(),
            mtu: PathMtu::Mtu1024,
            buffer: RemoteBuffer {
                addr: 0x7f00_0000_0000,
                rkey: 0x1234,
                len: 4096,
            },
        }
    }

    #[test]
    fn frame_round_trip_and_partial_input() {
        let ep = endpoint();
        let frame = encode(&ep).unwrap();
        let mut partial = BytesMut::from(&frame[..frame.len() - 1]);
        assert!(decode::<Endpoint>(&mut partial).unwrap().is_none());
        let mut whole = frame.clone();
        whole.extend_from_slice(&frame);
        assert_eq!(decode::<Endpoint>(&mut whole).unwrap(), Some(ep));
        assert_eq!(decode::<Endpoint>(&mut whole).unwrap(), Some(ep));
        assert!(whole.is_empty());
    }

    #[test]
    fn oversized_frame_is_refused_from_its_header() {
        let mut buf = BytesMut::new();
        buf.put_u32(MAX_FRAME as u32 + 1);
        assert!(matches!(
            decode::<Endpoint>(&mut buf),
            Err(HandshakeError::TooLarge(n)) if n == MAX_FRAME + 1
        ));
    }

    #[test]
    fn out_of_range_fields_are_refused() {
        let json = serde_json::to_string(&endpoint()).unwrap();
        for (from, to) in [
            ("11259375", "16777216"),            // psn 2^24
            ("\"qpn\":17", "\"qpn\":16777216"),   // qpn 2^24
            ("\"mtu\":1024", "\"mtu\":1500"),     // not an IB MTU
            ("::ffff:10.77.0.1", "not-a-gid"),   // GID syntax
        ] {
            let bad = json.replace(from, to);
            assert_ne!(bad, json, "{from} not found in {json}");
            let mut buf = encode(&serde_json::from_str::<serde_json::Value>(&bad).unwrap()).unwrap();
            let err = decode::<Endpoint>(&mut buf).unwrap_err();
            assert!(matches!(err, HandshakeError::Malformed(_)), "{err}");
        }
    }

    #[test]
    fn unknown_fields_are_refused() {
        let mut v = serde_json::to_value(endpoint()).unwrap();
        v["extra"] = serde_json::json!(1);
        let mut buf = encode(&v).unwrap();
        assert!(decode::<Endpoint>(&mut buf).is_err());
    }

    #[test]
    fn validate_catches_semantic_errors() {
        assert!(endpoint().validate().is_ok());
        let mut e = endpoint();
        e.gid = Gid::default();
        assert!(e.validate().unwrap_err().to_string().contains("gid"));
        let mut e = endpoint();
        e.qpn = Qpn::new(1).unwrap();
        assert!(e.validate().unwrap_err().to_string().contains("reserved"));
        let mut e = endpoint();
        e.buffer.len = 0;
        assert!(e.validate().is_err());
        let mut e = endpoint();
        e.buffer.addr = u64::MAX;
        assert!(e.validate().is_err());
        let mut e = endpoint();
        e.gid = "::ffff:255.255.255.255".parse().unwrap();
        assert!(e.validate().is_err());
    }
}
