//! Port hardware counters of every RDMA device, read from sysfs.
//!
//! Each RDMA port keeps counters of what its transport saw in
//! `/sys/class/infiniband/<device>/ports/<port>/hw_counters/<counter>`, one decimal number per
//! file. The names are the driver's: rxe has `rcvd_pkts`, `sent_pkts`, `duplicate_request`,
//! `out_of_seq_request`, `rcvd_seq_err`, `retry_exceeded_err`, ...; mlx5 has
//! `out_of_sequence`, `duplicate_request`, `packet_seq_err`, `implied_nak_seq_err`, .... A few
//! of them are the footprint of packet injection and PSN guessing (see [`SECURITY_COUNTERS`]):
//! a forged request whose PSN is ahead of the responder's is counted as out of sequence, one
//! behind it as a duplicate, and the real sender whose PSN the forgery consumed then sees its
//! own requests counted as duplicates.
//!
//! [`PortCounterReader::read`] lists the devices, their ports and every counter file present, so
//! it needs no list of names per driver. A file that cannot be read or does not hold a number
//! is skipped and reported with its reason ([`Skipped`]); nothing here panics or fails as a
//! whole. These are plain file reads: they need neither eBPF nor root.
//!
//! ```
//! use rdma_monitor::hw_counters::{CounterId, PortCounterReader};
//!
//! let root = tempfile::tempdir()?;
//! let dir = root.path().join("rxe-a/ports/1/hw_counters");
//! std::fs::create_dir_all(&dir)?;
//! std::fs::write(dir.join("out_of_seq_request"), "3\n")?;
//! std::fs::write(dir.join("rcvd_pkts"), "garbage\n")?;
//!
//! let reading = PortCounterReader::at(root.path()).read();
//! assert_eq!(reading.values[&CounterId::new("rxe-a", 1, "out_of_seq_request")], 3);
//! assert_eq!(reading.skipped[0].path, "rxe-a/ports/1/hw_counters/rcvd_pkts");
//! # Ok::<(), std::io::Error>(())
//! ```

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

/// Where the kernel lists RDMA devices.
pub const SYSFS_ROOT: &str = "/sys/class/infiniband";

/// Counters that move when someone injects packets into a connection or guesses PSNs (and,
/// less often, on packet loss), per driver:
///
/// | counter | driver | counts |
/// |---|---|---|
/// | `out_of_seq_request` | rxe | requests with a PSN ahead of the expected one (responder) |
/// | `duplicate_request` | rxe, mlx5 | requests with a PSN behind the expected one (responder) |
/// | `rcvd_seq_err` | rxe | sequence-error NAKs received (requester) |
/// | `out_of_sequence` | mlx5 | out-of-sequence packets received (responder) |
/// | `packet_seq_err` | mlx5 | sequence-error NAKs received (requester) |
/// | `implied_nak_seq_err` | mlx5 | responses implying lost requests (requester) |
///
/// Text reports mark them `SECURITY` and list them first.
pub const SECURITY_COUNTERS: &[&str] = &[
    "out_of_seq_request",
    "duplicate_request",
    "rcvd_seq_err",
    "out_of_sequence",
    "packet_seq_err",
    "implied_nak_seq_err",
];

/// Whether `counter` is one of the [`SECURITY_COUNTERS`].
///
/// ```
/// use rdma_monitor::hw_counters::is_security_counter;
/// assert!(is_security_counter("duplicate_request"));
/// assert!(!is_security_counter("rcvd_pkts"));
/// ```
pub fn is_security_counter(counter: &str) -> bool {
    SECURITY_COUNTERS.contains(&counter)
}

/// Not a counter: ib_core puts this setting (how long, in ms, it caches what the driver
/// reported) next to the counters of every port.
const NOT_COUNTERS: &[&str] = &["lifespan"];

/// One counter of one port, ordered by device, port and counter name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CounterId {
    /// The RDMA device (`rxe-a`, `mlx5_0`).
    pub device: String,
    /// The port number (rxe has port 1 only).
    pub port: u32,
    /// The counter's file name.
    pub counter: String,
}

impl CounterId {
    /// The counter `counter` of `device`'s port `port`.
    ///
    /// ```
    /// use rdma_monitor::hw_counters::CounterId;
    /// assert_eq!(CounterId::new("rxe-a", 1, "rcvd_pkts").to_string(), "rxe-a/1/rcvd_pkts");
    /// ```
    pub fn new(device: impl Into<String>, port: u32, counter: impl Into<String>) -> CounterId {
        CounterId {
            device: device.into(),
            port,
            counter: counter.into(),
        }
    }
}

impl std::fmt::Display for CounterId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.device, self.port, self.counter)
    }
}

/// Why a counter file, or a directory that should list some, was skipped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SkipReason {
    /// Opening or reading it failed (permissions, the device went away, a driver error).
    #[error("unreadable ({0})")]
    Unreadable(ErrorKind),
    /// It does not hold one unsigned decimal number; the start of what it holds.
    #[error("not a number: {0:?}")]
    NotANumber(String),
}

impl SkipReason {
    /// A stable name for the reason, for metrics labels: `unreadable` or `not_a_number`.
    ///
    /// ```
    /// use rdma_monitor::hw_counters::SkipReason;
    /// assert_eq!(SkipReason::NotANumber("x".into()).label(), "not_a_number");
    /// ```
    pub fn label(&self) -> &'static str {
        match self {
            SkipReason::Unreadable(_) => "unreadable",
            SkipReason::NotANumber(_) => "not_a_number",
        }
    }

    /// Every [`label`](Self::label), so metrics can show a zero for each.
    pub const LABELS: [&'static str; 2] = ["unreadable", "not_a_number"];
}

/// Something [`PortCounterReader::read`] skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// Its path below the sysfs root, e.g. `rxe-a/ports/1/hw_counters/rcvd_pkts`.
    pub path: String,
    /// Why.
    pub reason: SkipReason,
}

/// One reading of every port counter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortCounterReading {
    /// The value of every counter that could be read.
    pub values: BTreeMap<CounterId, u64>,
    /// What could not be read, in path order.
    pub skipped: Vec<Skipped>,
}

/// Reads the port counters below a sysfs root: [`SYSFS_ROOT`] by default, any directory laid
/// out the same way in tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortCounterReader {
    root: PathBuf,
}

impl Default for PortCounterReader {
    fn default() -> Self {
        PortCounterReader::at(SYSFS_ROOT)
    }
}

/// Longest piece of a bad file quoted in a [`SkipReason::NotANumber`].
const QUOTE_MAX: usize = 32;

impl PortCounterReader {
    /// A reader of the running system's counters ([`SYSFS_ROOT`]).
    ///
    /// ```no_run
    /// use rdma_monitor::hw_counters::PortCounterReader;
    ///
    /// for (id, value) in PortCounterReader::system().read().values {
    ///     println!("{id} {value}"); // rxe-a/1/rcvd_pkts 4711
    /// }
    /// ```
    pub fn system() -> PortCounterReader {
        PortCounterReader::default()
    }

    /// A reader of the tree below `root` (`<root>/<device>/ports/<port>/hw_counters/<counter>`).
    pub fn at(root: impl Into<PathBuf>) -> PortCounterReader {
        PortCounterReader { root: root.into() }
    }

    /// The directory it reads.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Reads every counter of every port of every device.
    ///
    /// A missing root means no RDMA device (an empty reading, nothing skipped); so does a
    /// device without ports or a port without `hw_counters` (some drivers have none). Anything
    /// else that fails is in [`PortCounterReading::skipped`].
    ///
    /// ```
    /// use rdma_monitor::hw_counters::PortCounterReader;
    ///
    /// let empty = tempfile::tempdir()?;
    /// let reading = PortCounterReader::at(empty.path().join("no-rdma-here")).read();
    /// assert!(reading.values.is_empty() && reading.skipped.is_empty());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn read(&self) -> PortCounterReading {
        let mut reading = PortCounterReading::default();
        let Some(devices) = self.list("", &mut reading) else {
            return reading;
        };
        for device in devices {
            let ports_rel = format!("{device}/ports");
            let Some(ports) = self.list(&ports_rel, &mut reading) else {
                continue;
            };
            for port_name in ports {
                // sysfs names ports by number; anything else is not a port.
                let Ok(port) = port_name.parse::<u32>() else {
                    continue;
                };
                let dir_rel = format!("{ports_rel}/{port_name}/hw_counters");
                let Some(counters) = self.list(&dir_rel, &mut reading) else {
                    continue;
                };
                for counter in counters {
                    if NOT_COUNTERS.contains(&counter.as_str()) {
                        continue;
                    }
                    let rel = format!("{dir_rel}/{counter}");
                    match read_u64(&self.root.join(&rel)) {
                        Ok(value) => {
                            reading
                                .values
                                .insert(CounterId::new(device.as_str(), port, counter), value);
                        }
                        Err(reason) => reading.skipped.push(Skipped { path: rel, reason }),
                    }
                }
            }
        }
        reading
    }

    /// The sorted entry names of `root/rel`; `None` when it does not exist (nothing to read
    /// there) or cannot be listed (then recorded in `reading.skipped`).
    fn list(&self, rel: &str, reading: &mut PortCounterReading) -> Option<Vec<String>> {
        let dir = if rel.is_empty() {
            self.root.clone()
        } else {
            self.root.join(rel)
        };
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == ErrorKind::NotFound => return None,
            Err(e) => {
                reading.skipped.push(Skipped {
                    path: if rel.is_empty() {
                        ".".to_owned()
                    } else {
                        rel.to_owned()
                    },
                    reason: SkipReason::Unreadable(e.kind()),
                });
                return None;
            }
        };
        // An entry that vanishes while listing (a device being removed) is simply not there.
        let mut names: Vec<String> = entries
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        names.sort();
        Some(names)
    }
}

fn read_u64(path: &Path) -> Result<u64, SkipReason> {
    let text = std::fs::read_to_string(path).map_err(|e| match e.kind() {
        // Not UTF-8: certainly not a number.
        ErrorKind::InvalidData => SkipReason::NotANumber(String::new()),
        kind => SkipReason::Unreadable(kind),
    })?;
    let trimmed = text.trim();
    trimmed.parse::<u64>().map_err(|_| {
        let quoted: String = trimmed.chars().take(QUOTE_MAX).collect();
        SkipReason::NotANumber(quoted)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn counters(root: &Path, device: &str, port: u32, values: &[(&str, &str)]) {
        let dir = root.join(format!("{device}/ports/{port}/hw_counters"));
        fs::create_dir_all(&dir).expect("mkdir");
        for (name, value) in values {
            fs::write(dir.join(name), value).expect("write counter");
        }
    }

    #[test]
    fn reads_every_counter_of_every_port_and_skips_lifespan() {
        let root = tempfile::tempdir().expect("tempdir");
        counters(
            root.path(),
            "rxe-a",
            1,
            &[
                ("rcvd_pkts", "10\n"),
                ("duplicate_request", "0\n"),
                ("lifespan", "10\n"),
            ],
        );
        counters(root.path(), "mlx5_0", 1, &[("out_of_sequence", "7\n")]);
        counters(
            root.path(),
            "mlx5_0",
            2,
            &[("out_of_sequence", "18446744073709551615")],
        );
        // A port without hw_counters and a device without ports: nothing to read, no error.
        fs::create_dir_all(root.path().join("mlx5_0/ports/3")).expect("mkdir");
        fs::create_dir_all(root.path().join("siw0")).expect("mkdir");
        let r = PortCounterReader::at(root.path()).read();
        let got: Vec<(String, u64)> = r.values.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        assert_eq!(
            got,
            [
                ("mlx5_0/1/out_of_sequence".to_owned(), 7),
                ("mlx5_0/2/out_of_sequence".to_owned(), u64::MAX),
                ("rxe-a/1/duplicate_request".to_owned(), 0),
                ("rxe-a/1/rcvd_pkts".to_owned(), 10),
            ]
        );
        assert!(r.skipped.is_empty(), "{:?}", r.skipped);
    }

    #[test]
    fn garbage_and_unreadable_files_are_skipped_with_their_reason() {
        let root = tempfile::tempdir().expect("tempdir");
        let long = "x".repeat(100);
        counters(
            root.path(),
            "rxe-a",
            1,
            &[
                ("garbage", "12abc\n"),
                ("negative", "-1\n"),
                ("empty", ""),
                ("long", &long),
                ("ok", " 5 \n"),
            ],
        );
        // Reading a directory fails the way an unreadable file does, even for root.
        fs::create_dir(root.path().join("rxe-a/ports/1/hw_counters/subdir")).expect("mkdir");
        fs::write(
            root.path().join("rxe-a/ports/1/hw_counters/binary"),
            [0xff, 0xfe],
        )
        .expect("write");
        let r = PortCounterReader::at(root.path()).read();
        assert_eq!(r.values.len(), 1);
        assert_eq!(r.values[&CounterId::new("rxe-a", 1, "ok")], 5);
        let dir = "rxe-a/ports/1/hw_counters";
        let skipped: Vec<(String, SkipReason)> = r
            .skipped
            .iter()
            .map(|s| (s.path.clone(), s.reason.clone()))
            .collect();
        assert_eq!(
            skipped,
            [
                (
                    format!("{dir}/binary"),
                    SkipReason::NotANumber(String::new())
                ),
                (
                    format!("{dir}/empty"),
                    SkipReason::NotANumber(String::new())
                ),
                (
                    format!("{dir}/garbage"),
                    SkipReason::NotANumber("12abc".into())
                ),
                (
                    format!("{dir}/long"),
                    SkipReason::NotANumber("x".repeat(32))
                ),
                (
                    format!("{dir}/negative"),
                    SkipReason::NotANumber("-1".into())
                ),
                (
                    format!("{dir}/subdir"),
                    SkipReason::Unreadable(ErrorKind::IsADirectory)
                ),
            ]
        );
        assert_eq!(r.skipped[2].reason.to_string(), "not a number: \"12abc\"");
        assert_eq!(
            r.skipped[5].reason.to_string(),
            "unreadable (is a directory)"
        );
    }

    #[test]
    fn a_missing_root_is_no_device_and_a_file_as_root_is_reported() {
        let root = tempfile::tempdir().expect("tempdir");
        let r = PortCounterReader::at(root.path().join("absent")).read();
        assert_eq!(r, PortCounterReading::default());

        let file = root.path().join("file");
        fs::write(&file, "").expect("write");
        let r = PortCounterReader::at(&file).read();
        assert!(r.values.is_empty());
        assert_eq!(r.skipped.len(), 1);
        assert_eq!(r.skipped[0].path, ".");
        assert_eq!(r.skipped[0].reason.label(), "unreadable");
    }

    #[test]
    fn non_numeric_port_names_are_not_ports() {
        let root = tempfile::tempdir().expect("tempdir");
        counters(root.path(), "rxe-a", 1, &[("rcvd_pkts", "1")]);
        fs::create_dir_all(root.path().join("rxe-a/ports/power/hw_counters")).expect("mkdir");
        fs::write(root.path().join("rxe-a/ports/power/hw_counters/x"), "nope").expect("write");
        let r = PortCounterReader::at(root.path()).read();
        assert_eq!(r.values.len(), 1);
        assert!(r.skipped.is_empty());
    }
}
