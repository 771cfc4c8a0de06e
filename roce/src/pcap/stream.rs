//! Reading a capture file from a stream as its records arrive ([`StreamReader`]).

use std::io;

use pcap_file::Endianness;

use super::reader::{Records, State};
use super::{read, FileHeader, Format, LinkType, PcapError, Record, Resolution};

/// Why a capture could not be read from a stream ([`StreamReader`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StreamError {
    /// Reading the stream failed.
    #[error("cannot read the capture: {source}")]
    Io {
        /// The read error.
        #[source]
        source: io::Error,
    },
    /// What was read is not a pcap or pcapng file, or stops in the middle of a record.
    #[error(transparent)]
    Pcap(#[from] PcapError),
}

/// Reads a classic pcap or pcapng file from a stream, such as a pipe from `tcpdump -U -w -`:
/// each record is handed out as soon as it has arrived, and only the records not yet handed
/// out are kept in memory. Formats and errors are those of [`read`]; a stream that ends in the
/// middle of a record is [`PcapError::TruncatedRecord`] or [`PcapError::TruncatedBlock`], with
/// offsets counted from the start of the stream.
///
/// ```
/// use roce::pcap::{LinkType, PcapWriter, Resolution, StreamReader, Timestamp};
///
/// let mut w = PcapWriter::new(Vec::new(), LinkType::Ethernet, 65535, Resolution::Nanos)?;
/// w.write_packet(Timestamp::new(1, 5), &[0xaa; 60], 60)?;
/// let file = w.into_inner()?;
///
/// let mut stream = StreamReader::new(&file[..])?;
/// assert_eq!(stream.header().link, LinkType::Ethernet);
/// let record = stream.next_record().unwrap()?;
/// assert_eq!((record.ts, record.data.len()), (Timestamp::new(1, 5), 60));
/// assert!(stream.next_record().is_none());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct StreamReader<R: io::Read> {
    reader: R,
    header: FileHeader,
    /// Bytes read and not yet dropped are `buf[..end]`; `pos` indexes into them.
    buf: Vec<u8>,
    end: usize,
    pos: usize,
    /// Bytes dropped from the front of `buf` so far, to report offsets in the stream.
    dropped: usize,
    state: State,
    eof: bool,
    failed: bool,
}

/// How much is read from the stream at a time.
const STREAM_CHUNK: usize = 64 * 1024;

impl<R: io::Read> StreamReader<R> {
    /// Reads the file header (and, for pcapng, up to the first interface description).
    pub fn new(reader: R) -> Result<StreamReader<R>, StreamError> {
        let mut s = StreamReader {
            reader,
            header: FileHeader {
                format: Format::Pcap,
                link: LinkType::Ethernet,
                snaplen: 0,
                resolution: Resolution::Micros,
                big_endian: false,
                version: (0, 0),
            },
            buf: Vec::new(),
            end: 0,
            pos: 0,
            dropped: 0,
            state: State::Pcap {
                endianness: Endianness::Little,
                resolution: Resolution::Micros,
                link: LinkType::Ethernet,
            },
            eof: false,
            failed: false,
        };
        loop {
            match read(&s.buf[..s.end]) {
                Ok((header, records)) => {
                    (s.header, s.pos, s.state) = (header, records.pos, records.state);
                    return Ok(s);
                }
                // Not all of it has arrived yet.
                Err(
                    PcapError::ShortHeader(_)
                    | PcapError::TruncatedBlock { .. }
                    | PcapError::NoInterface,
                ) if !s.eof => s.fill()?,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// What the file says about itself; see [`read`].
    pub fn header(&self) -> FileHeader {
        self.header
    }

    /// The next record, waiting for it to arrive; `None` at the end of the stream. After an
    /// error, the stream ends.
    pub fn next_record(&mut self) -> Option<Result<Record<'_>, StreamError>> {
        if self.failed {
            return None;
        }
        // Read until a whole record is buffered or the stream ends. The probe parses without
        // consuming; the record handed out is parsed again below, to borrow from the buffer.
        loop {
            let mut probe = Records::new(&self.buf[..self.end], self.pos, self.state.clone());
            let incomplete = match probe.next() {
                None => true,
                Some(Err(PcapError::TruncatedRecord { .. } | PcapError::TruncatedBlock { .. })) => {
                    true
                }
                Some(_) => false,
            };
            if !incomplete || self.eof {
                break;
            }
            if let Err(e) = self.fill() {
                self.failed = true;
                return Some(Err(e));
            }
        }
        let mut records = Records::new(&self.buf[..self.end], self.pos, self.state.clone());
        let item = records.next();
        self.pos = records.pos;
        self.state = records.state;
        match item? {
            Ok(record) => Some(Ok(record)),
            Err(e) => {
                self.failed = true;
                Some(Err(e.shifted(self.dropped).into()))
            }
        }
    }

    /// Reads the next chunk of the stream (or notes its end), first dropping the bytes of the
    /// records already handed out once they are most of the buffer.
    fn fill(&mut self) -> Result<(), StreamError> {
        if self.pos >= STREAM_CHUNK && self.pos * 2 >= self.end {
            self.buf.copy_within(self.pos..self.end, 0);
            self.end -= self.pos;
            self.dropped += self.pos;
            self.pos = 0;
        }
        // Grown (and zeroed) only by what the last read used, not by a chunk every call.
        if self.buf.len() < self.end + STREAM_CHUNK {
            self.buf.resize(self.end + STREAM_CHUNK, 0);
        }
        let n = loop {
            match self.reader.read(&mut self.buf[self.end..]) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => return Err(StreamError::Io { source }),
            }
        };
        self.end += n;
        self.eof = n == 0;
        Ok(())
    }
}
