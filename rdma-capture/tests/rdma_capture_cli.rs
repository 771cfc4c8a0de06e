//! `rdma-capture` as a user runs it, on the host: decoding capture files (`-r`: pcap, pcapng,
//! Linux cooked SLL/SLL2, standard input), writing one (`-w`, `-w -`), the output forms
//! (one line, `-v`, `-x`, `--json`), its filters, and the errors for bad input. Live capture
//! needs rxe and runs in the lab VM (tests/tests/capture_lab.rs).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use roce::doc_example_frame;
use roce::pcap::{LinkType, PcapWriter, Resolution, Timestamp};

fn rdma_capture(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rdma-capture"))
        .args(args)
        .output()
        .expect("run rdma-capture")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A pcap with the example ACK twice (a duplicate) and one frame of garbage.
fn sample(dir: &Path) -> String {
    let frame = doc_example_frame();
    let mut w = PcapWriter::new(Vec::new(), LinkType::Ethernet, 2048, Resolution::Nanos).unwrap();
    for i in 0..2 {
        w.write_packet(Timestamp::new(1_700_000_000, i), &frame, frame.len())
            .unwrap();
    }
    w.write_packet(Timestamp::new(1_700_000_001, 0), &[0xee; 30], 30)
        .unwrap();
    let path = dir.join("sample.pcap");
    std::fs::write(&path, w.into_inner().unwrap()).unwrap();
    path.to_string_lossy().into_owned()
}

#[test]
fn reads_a_pcap_file_prints_text_and_a_summary() {
    let dir = tempfile::tempdir().unwrap();
    let file = sample(dir.path());
    let out = rdma_capture(&["-r", &file]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    // One line per packet, as tcpdump prints them.
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    for line in &lines[..2] {
        assert!(
            line.starts_with("file 1700000000.00000000")
                && line
                    .contains(" 10.77.0.1:49153 -> 10.77.0.2:4791 RC Acknowledge dqpn=0x000011 ")
                && line.contains(" AETH syndrome=ACK credits=31 msn=5 ")
                && line.ends_with(" icrc=ok"),
            "{line}"
        );
    }
    assert!(
        lines[2].starts_with("file decode error (30 bytes): "),
        "{text}"
    );
    let err = stderr(&out);
    assert!(err.contains("--- rdma-capture summary"), "{err}");
    assert!(err.contains("3 frames"), "{err}");
    assert!(err.contains("bad ICRC 0"), "{err}");
    assert!(err.contains("decode errors 1"), "{err}");
}

#[test]
fn json_qpn_and_class_filters_and_rewriting_the_pcap() {
    let dir = tempfile::tempdir().unwrap();
    let file = sample(dir.path());
    let qpn = roce::decode_ethernet(&doc_example_frame())
        .unwrap()
        .bth
        .dest_qp;
    let copy = dir.path().join("copy.pcap");
    let out = rdma_capture(&[
        "-r",
        &file,
        "--json",
        "--qpn",
        &format!("{qpn:#x}"),
        "-w",
        &copy.to_string_lossy(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let lines: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3, "two packets and the summary");
    assert_eq!(lines[0]["psn_event"]["event"], "first");
    assert_eq!(lines[1]["psn_event"]["event"], "duplicate");
    let summary = &lines[2]["summary"];
    assert_eq!(summary["shown"], 2);
    assert_eq!(summary["flows"][0]["summary"]["duplicates"], 1);
    // The written file holds the two packets shown, not the garbage frame.
    let written = std::fs::read(&copy).unwrap();
    let (_, records) = roce::pcap::read(&written).unwrap();
    assert_eq!(records.count(), 2);

    let out = rdma_capture(&["-r", &file, "--class", "send,write", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).lines().count(), 1, "only the summary");

    let out = rdma_capture(&["-r", &file, "-q", "-c", "1"]);
    assert!(out.status.success());
    assert!(stdout(&out).is_empty());
}

#[test]
fn bad_input_gets_a_clear_error_and_no_panic() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.pcap");
    std::fs::write(&garbage, b"this is not a capture file at all").unwrap();
    let garbage = garbage.to_string_lossy().into_owned();
    let cases: &[(&[&str], &str)] = &[
        (
            &["-i", "no-such-if0"],
            "network interface \"no-such-if0\" not found",
        ),
        (
            &["-d", "no-such-rxe"],
            "RDMA device \"no-such-rxe\" not found",
        ),
        (&["-i", "lo", "--qpn", "0x1000000"], "QPNs are 24 bits"),
        (&["-i", "lo", "--qpn", "seven"], "\"seven\" is not a number"),
        (
            &["-i", "lo", "--class", "send,bogus"],
            "unknown opcode class \"bogus\"",
        ),
        (&["-i", "lo", "--snaplen", "0"], "--snaplen"),
        (&["-i", "lo", "--snaplen", "4096"], "--snaplen"),
        (&["-i", "lo", "-s", "4096"], "--snaplen"),
        (&["-r", &garbage, "-v", "--json"], "cannot be used with"),
        (&["-r", &garbage, "-x", "-q"], "cannot be used with"),
        (
            &["-i", "lo", "--duration", "soon"],
            "\"soon\" is not a number",
        ),
        (
            &["-r", "/nonexistent/x.pcap"],
            "cannot read /nonexistent/x.pcap",
        ),
        (&["-r", &garbage], "garbage.pcap"),
        (&[], "required"),
    ];
    for (args, want) in cases {
        let out = rdma_capture(args);
        let err = stderr(&out);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(err.contains(want), "{args:?}: want {want:?} in {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

#[test]
fn help_explains_the_capture_points() {
    let out = rdma_capture(&["--help"]);
    assert!(out.status.success());
    let help = stdout(&out);
    for want in [
        "--rxe",
        "--qpn",
        "--class",
        "-w",
        "--json",
        "--snaplen",
        "-s, --snaplen",
        "-v, --verbose",
        "-x, --hex",
        "-r",
        "pcapng",
        "SLL2",
    ] {
        assert!(help.contains(want), "{want} missing from --help");
    }
    assert!(help.contains("same device"), "{help}");
}

/// The sample captures shipped in roce/samples/ (generated by roce/tests/samples.rs).
fn shipped(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../roce/samples")
        .join(name)
}

/// The opcodes of the shipped RC session, in order.
const SESSION: [&str; 12] = [
    "RC SEND Only",
    "RC Acknowledge",
    "RC SEND Only",
    "RC Acknowledge",
    "RC RDMA WRITE First",
    "RC RDMA WRITE Middle",
    "RC RDMA WRITE Last with Immediate",
    "RC Acknowledge",
    "RC RDMA WRITE Only with Immediate",
    "RC Acknowledge",
    "RC RDMA READ Request",
    "RC RDMA READ response Only",
];

/// Checks `text` holds the session, one line a packet, every ICRC good.
fn assert_session(text: &str) {
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), SESSION.len(), "{text}");
    for (line, opcode) in lines.iter().zip(SESSION) {
        assert!(line.starts_with("file 1700000000.00"), "{line}");
        assert!(
            line.contains(&format!(":4791 {opcode} dqpn=")),
            "{opcode}: {line}"
        );
        assert!(line.ends_with(" icrc=ok"), "{line}");
    }
}

fn assert_clean_summary(err: &str) {
    for want in [
        "--- rdma-capture summary",
        "12 frames",
        "bad ICRC 0",
        "decode errors 0",
    ] {
        assert!(err.contains(want), "{want} missing: {err}");
    }
}

/// The first five minutes: decoding the shipped samples needs no root and no RDMA, and the
/// pcap, the pcapng (tshark's default) and the SLL2 (`tcpdump -i any`) forms decode alike.
#[test]
fn decodes_the_shipped_samples_in_every_format() {
    let mut outputs = Vec::new();
    for name in [
        "rc-session.pcap",
        "rc-session.pcapng",
        "rc-session-sll2.pcap",
    ] {
        let path = shipped(name);
        let out = rdma_capture(&["-r", &path.to_string_lossy()]);
        assert!(out.status.success(), "{name}: {}", stderr(&out));
        assert_session(&stdout(&out));
        assert_clean_summary(&stderr(&out));
        outputs.push(stdout(&out));
    }
    assert_eq!(outputs[0], outputs[1], "pcap and pcapng decode the same");
    // SLL2 keeps the same packets, timestamps in microseconds.
    assert_eq!(outputs[0], outputs[2]);
}

/// Runs rdma-capture with `input` on standard input.
fn rdma_capture_stdin(args: &[&str], input: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rdma-capture"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run rdma-capture");
    let mut stdin = child.stdin.take().expect("stdin");
    let input = input.to_vec();
    // Written from a thread: the child may exit (or fill its stdout) before reading it all.
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let out = child.wait_with_output().expect("wait");
    writer.join().expect("writer");
    out
}

/// `-r -` reads standard input: the same decoding as the file, and the summary names it.
#[test]
fn reads_standard_input() {
    for name in ["rc-session.pcapng", "rc-session-sll2.pcap"] {
        let bytes = std::fs::read(shipped(name)).unwrap();
        let out = rdma_capture_stdin(&["-r", "-"], &bytes);
        assert!(out.status.success(), "{name}: {}", stderr(&out));
        assert_session(&stdout(&out));
        assert_clean_summary(&stderr(&out));
        assert!(
            stderr(&out).contains("summary (standard input)"),
            "{}",
            stderr(&out)
        );

        let out = rdma_capture_stdin(&["-r", "-", "-c", "2"], &bytes);
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(stdout(&out).lines().count(), 2);
    }
}

/// A pipe from a running `tcpdump -U -w -` is decoded as packets arrive, not when it ends.
#[test]
fn reads_a_pipe_as_the_packets_arrive() {
    let bytes = std::fs::read(shipped("rc-session.pcap")).unwrap();
    // The global header and the first record (24 + 16 + 106 bytes: the first SEND).
    let (first, rest) = bytes.split_at(24 + 16 + 106);
    let mut child = Command::new(env!("CARGO_BIN_EXE_rdma-capture"))
        .args(["-r", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run rdma-capture");
    let mut stdin = child.stdin.take().expect("stdin");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if tx.send(line.expect("read stdout")).is_err() {
                break;
            }
        }
    });
    stdin.write_all(first).unwrap();
    stdin.flush().unwrap();
    let line = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the first packet is printed while the pipe is still open");
    assert!(line.contains(" RC SEND Only dqpn=0x000012 "), "{line}");
    stdin.write_all(rest).unwrap();
    drop(stdin);
    let status = child.wait().expect("wait");
    reader.join().expect("reader");
    assert!(status.success());
    assert_eq!(rx.iter().count(), SESSION.len() - 1);
}

/// `-w -` writes the pcap to standard output, and the packet lines to standard error (none
/// with -q); what it writes reads back with `-r -`.
#[test]
fn writes_the_pcap_to_standard_output() {
    let sample = shipped("rc-session-sll2.pcap")
        .to_string_lossy()
        .into_owned();
    let out = rdma_capture(&["-r", &sample, "-w", "-"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let (header, records) = roce::pcap::read(&out.stdout).expect("a pcap on stdout");
    // Always Ethernet: the SLL2 header became one, with the sender's MAC.
    assert_eq!(header.link, LinkType::Ethernet);
    let records: Vec<_> = records.collect::<Result<_, _>>().unwrap();
    assert_eq!(records.len(), SESSION.len());
    let first = roce::decode_ethernet(records[0].data).unwrap();
    assert_eq!(
        first.ethernet.map(|e| e.src.to_string()),
        Some("02:00:00:00:00:01".to_owned())
    );
    assert!(records
        .iter()
        .all(|r| roce::decode_ethernet(r.data).unwrap().icrc_ok));
    let err = stderr(&out);
    let (packets, summary) = err.split_once("--- rdma-capture summary").unwrap();
    assert_session(packets);
    assert!(summary.contains("12 frames"), "{summary}");

    let quiet = rdma_capture(&["-r", &sample, "-w", "-", "-q"]);
    assert!(quiet.status.success());
    assert_eq!(quiet.stdout, out.stdout);
    assert!(
        stderr(&quiet).starts_with("--- rdma-capture summary"),
        "{}",
        stderr(&quiet)
    );

    let back = rdma_capture_stdin(&["-r", "-"], &out.stdout);
    assert!(back.status.success(), "{}", stderr(&back));
    assert_session(&stdout(&back));
}

/// `-v` shows every header, link layer to ICRC; `-x` adds the bytes.
#[test]
fn verbose_and_hex_output() {
    let sample = shipped("rc-session.pcap").to_string_lossy().into_owned();
    let out = rdma_capture(&["-r", &sample, "-v", "-c", "7"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let last = text.split("\nfile ").last().unwrap();
    for want in [
        "RC RDMA WRITE Last with Immediate\n",
        "\n  ETH  02:00:00:00:00:01 -> 02:00:00:00:00:02 type=0x0800\n",
        "\n  IPv4 10.77.0.1 -> 10.77.0.2 ",
        "\n  UDP  49169 -> 4791 len=",
        "\n  BTH  opcode=0x09 (RC RDMA WRITE Last with Immediate) ",
        "\n  ImmDt 0x00c0ffee\n",
        "\n  DATA len=200\n",
        "\n  ICRC 0x",
    ] {
        assert!(last.contains(want), "{want:?} missing from\n{last}");
    }
    assert!(last.trim_end().ends_with(" ok"), "{last}");
    assert_eq!(
        text.matches("\n  BTH  ").count(),
        7,
        "one BTH line a packet"
    );

    let out = rdma_capture(&["-r", &sample, "-x", "-c", "1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].contains(" RC SEND Only "), "{text}");
    // The frame from its first byte: destination MAC, source MAC, ethertype, IPv4.
    assert_eq!(
        lines[1],
        "  0000  02 00 00 00 00 02 02 00 00 00 00 01 08 00 45 00  |..............E.|"
    );
    // 106 bytes: seven lines, the last one of 10 bytes ending in the ICRC.
    assert_eq!(lines.len(), 1 + 7, "{text}");
    assert!(lines[7].starts_with("  0060  "), "{text}");

    // Cooked headers show under -v as what they are.
    let sll2 = shipped("rc-session-sll2.pcap")
        .to_string_lossy()
        .into_owned();
    let out = rdma_capture(&["-r", &sll2, "-v", "-c", "2"]);
    let text = stdout(&out);
    assert!(
        text.contains("\n  SLL2 Out if=3 hatype=1 addr=02:00:00:00:00:01 proto=0x0800\n"),
        "{text}"
    );
    assert!(
        text.contains("\n  SLL2 In if=3 hatype=1 addr=02:00:00:00:00:02 proto=0x0800\n"),
        "{text}"
    );
}

/// Older libpcap writes the 16-byte SLL header; it decodes too, and `-w` turns it into
/// Ethernet.
#[test]
fn reads_linux_cooked_v1_captures() {
    use roce::sll::{LinuxSll, PacketType, SllVersion};

    let frame = doc_example_frame();
    let mut record = LinuxSll::ethernet(
        SllVersion::V1,
        PacketType::Host,
        0,
        [2, 0, 0, 0, 0, 1],
        0x0800,
    )
    .to_bytes();
    record.extend_from_slice(&frame[14..]);
    let mut w =
        PcapWriter::new(Vec::new(), LinkType::LINUX_SLL, 262_144, Resolution::Micros).unwrap();
    w.write_packet(Timestamp::new(1_700_000_000, 0), &record, record.len())
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("any.pcap");
    std::fs::write(&path, w.into_inner().unwrap()).unwrap();
    let written = dir.path().join("eth.pcap");

    let out = rdma_capture(&[
        "-r",
        &path.to_string_lossy(),
        "-v",
        "-w",
        &written.to_string_lossy(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("\n  SLL  In hatype=1 addr=02:00:00:00:00:01 proto=0x0800\n"),
        "{text}"
    );
    assert!(
        text.contains("\n  AETH syndrome=ACK credits=31 msn=5\n"),
        "{text}"
    );
    let written = std::fs::read(&written).unwrap();
    let (_, mut records) = roce::pcap::read(&written).unwrap();
    let r = records.next().unwrap().unwrap();
    // The synthetic Ethernet header: zero destination, the sender's MAC, then the IP packet.
    assert_eq!(&r.data[..14], &[0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 1, 8, 0]);
    assert_eq!(&r.data[14..], &frame[14..]);
    assert_eq!(r.orig_len as usize, frame.len());
}

/// A link type the decoder does not know is named in a clear error, before any output;
/// broken files are errors, not panics, from a file or a pipe.
#[test]
fn unsupported_link_types_and_broken_files() {
    let frame = doc_example_frame();
    let mut w = PcapWriter::new(
        Vec::new(),
        LinkType::from_code(127),
        2048,
        Resolution::Micros,
    )
    .unwrap();
    w.write_packet(Timestamp::new(1, 0), &frame, frame.len())
        .unwrap();
    let radiotap = w.into_inner().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wifi.pcap");
    std::fs::write(&path, &radiotap).unwrap();
    let from_file = rdma_capture(&["-r", &path.to_string_lossy()]);
    let from_pipe = rdma_capture_stdin(&["-r", "-"], &radiotap);
    for out in [&from_file, &from_pipe] {
        assert!(!out.status.success());
        assert!(stdout(out).is_empty(), "nothing printed before the error");
        let err = stderr(out);
        assert!(
            err.contains("link type 127 (IEEE802_11_RADIOTAP) is not supported"),
            "{err}"
        );
        assert!(err.contains("LINUX_SLL2 276"), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }

    let sample = std::fs::read(shipped("rc-session.pcapng")).unwrap();
    let cut = &sample[..sample.len() - 7];
    let cut_path = dir.path().join("cut.pcapng");
    std::fs::write(&cut_path, cut).unwrap();
    let cases: [(Output, &str); 5] = [
        (
            rdma_capture(&["-r", &cut_path.to_string_lossy()]),
            "truncated",
        ),
        (rdma_capture_stdin(&["-r", "-"], cut), "truncated"),
        (
            rdma_capture_stdin(&["-r", "-"], b"garbage, not a capture file"),
            "not a pcap or pcapng file",
        ),
        (
            rdma_capture_stdin(&["-r", "-"], b""),
            "file too short for a pcap header",
        ),
        (rdma_capture_stdin(&["-r", "-"], &sample[..30]), "truncated"),
    ];
    for (i, (out, want)) in cases.iter().enumerate() {
        let err = stderr(out);
        assert!(!out.status.success(), "case {i}");
        assert!(err.contains(want), "case {i}: want {want:?} in {err}");
        assert!(!err.contains("panicked"), "case {i}: {err}");
    }
    // The packets before the cut were decoded and printed.
    assert_eq!(stdout(&cases[0].0).lines().count(), SESSION.len() - 1);
    assert_eq!(stdout(&cases[1].0), stdout(&cases[0].0));
}

#[test]
fn version_help_and_errors_follow_the_family_conventions() {
    let out = rdma_capture(&["--version"]);
    assert!(out.status.success());
    assert_eq!(
        stdout(&out).trim(),
        format!("rdma-capture {}", env!("CARGO_PKG_VERSION"))
    );
    let help = stdout(&rdma_capture(&["--help"]));
    for documented in ["Exit codes:", "--log-format", "  2  usage", "130"] {
        assert!(
            help.contains(documented),
            "{documented} missing from:\n{help}"
        );
    }
    // No capture point: clap's usage error.
    assert_eq!(rdma_capture(&[]).status.code(), Some(2));
    let out = rdma_capture(&["-r", "-", "--log-format", "xml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("[possible values: text, json]"),
        "{}",
        stderr(&out)
    );
    // A failure: one line in the family's format (not anyhow's `Error:` and a backtrace), exit 1.
    let out = rdma_capture(&["-r", "/nonexistent/capture.pcap"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.starts_with("rdma-capture: error: cannot read /nonexistent/capture.pcap"),
        "{err}"
    );
    assert!(!err.contains("Stack backtrace"), "{err}");
}
