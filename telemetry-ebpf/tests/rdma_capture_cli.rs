//! `rdma-capture` as a user runs it, on the host: decoding a pcap file (`-r`), its filters,
//! and the errors for bad input. Live capture needs rxe and runs in the lab VM
//! (tests/tests/capture_lab.rs).

use std::path::Path;
use std::process::{Command, Output};

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
    let packets = text
        .lines()
        .filter(|l| l.starts_with("file ") && l.ends_with(" RC Acknowledge"))
        .count();
    assert_eq!(packets, 2, "{text}");
    assert!(text.contains("AETH"), "{text}");
    assert!(text.contains("decode error (30 bytes)"), "{text}");
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
        "-r",
    ] {
        assert!(help.contains(want), "{want} missing from --help");
    }
    assert!(help.contains("same device"), "{help}");
}
