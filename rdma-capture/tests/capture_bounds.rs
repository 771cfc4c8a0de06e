//! `rdma-capture` against hostile input, on the host: a flood of spoofed flows must not grow
//! the PSN follower without bound (issue 12: 400,000 flows reached 458 MB), and `-w` must
//! neither follow a symlink, nor write a world-readable file, nor leave a partial file behind.

use std::net::Ipv4Addr;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use roce::pcap::{LinkType, PcapWriter, Resolution, Timestamp};
use roce::{Aeth, AethSyndrome, Opcode, PacketBuilder};

const A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const QP_A: u32 = 0x000100;
const QP_B: u32 = 0x000200;
/// Spoofed flows: every one a distinct (address, port, QPN).
const SPOOFED: u32 = 400_000;
/// The peak RSS `rdma-capture -r` may reach on them with the default `--max-flows`. The file
/// itself is read into memory (about 31 MB of it); the follower's share is bounded by
/// `--max-flows`.
const RSS_BOUND_KB: i64 = 64 * 1024;

fn ack(msn: u32) -> Aeth {
    Aeth {
        syndrome: AethSyndrome::Ack { credits: 31 },
        msn,
    }
}

/// The followed conversation: A's QP sends to B's QP and B acknowledges, and the other way.
fn conversation(round: u32) -> Vec<PacketBuilder> {
    let send = Opcode::RC_SEND_ONLY;
    let from_a = |op, psn| {
        PacketBuilder::new(op)
            .ipv4(A, B)
            .src_port(0xc100)
            .dest_qp(QP_B)
            .psn(psn)
    };
    let from_b = |op, psn| {
        PacketBuilder::new(op)
            .ipv4(B, A)
            .src_port(0xc200)
            .dest_qp(QP_A)
            .psn(psn)
    };
    vec![
        from_a(send, 0x900 + round).payload(*b"data"),
        from_b(Opcode::RC_ACKNOWLEDGE, 0x900 + round).aeth(ack(round)),
        from_b(send, 0x500 + round).payload(*b"back"),
        from_a(Opcode::RC_ACKNOWLEDGE, 0x500 + round).aeth(ack(round)),
    ]
}

/// One spoofed packet: a distinct flow for every `i`. Half of them share the followed
/// conversation's address pair (distinct ports and QPNs), so pairing has many candidates.
fn spoofed(i: u32) -> Vec<u8> {
    let (src, dst) = if i.is_multiple_of(2) {
        (B, A)
    } else {
        (Ipv4Addr::from(0x0a80_0000 | i), A)
    };
    let op = if i.is_multiple_of(3) {
        Opcode::RC_ACKNOWLEDGE
    } else {
        Opcode::RC_SEND_ONLY
    };
    let mut b = PacketBuilder::new(op)
        .ipv4(src, dst)
        .src_port(0xc000 | (i & 0x3fff) as u16)
        .dest_qp(0x10_0000 + i)
        .psn(0x10_0000 + i);
    b = if op == Opcode::RC_ACKNOWLEDGE {
        b.aeth(ack(i))
    } else {
        b.payload(*b"x")
    };
    b.frame().expect("spoofed frame")
}

/// Runs `rdma-capture` with `args`, stdout to `out`; returns its exit status, stderr and peak
/// RSS in KB (from `wait4`, for this child alone).
// wait4 reaps the child (std's `wait` would not give its own rusage).
#[allow(clippy::zombie_processes)]
fn run_measured(args: &[&str], out: &Path) -> (bool, String, i64) {
    let stdout = std::fs::File::create(out).expect("stdout file");
    let err_path = out.with_extension("err");
    let stderr = std::fs::File::create(&err_path).expect("stderr file");
    let child = Command::new(env!("CARGO_BIN_EXE_rdma-capture"))
        .args(args)
        .stdout(Stdio::from(stdout))
        .stderr(Stdio::from(stderr))
        .spawn()
        .expect("run rdma-capture");
    let pid = i32::try_from(child.id()).expect("pid");
    let mut status = 0;
    // SAFETY: all-zero is a valid rusage; wait4 fills it for this child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child; `status` and `usage` are valid for writes.
    let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(rc, pid, "wait4: {}", std::io::Error::last_os_error());
    let ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    let err = std::fs::read_to_string(&err_path).unwrap_or_default();
    (ok, err, usage.ru_maxrss)
}

#[test]
fn four_hundred_thousand_spoofed_flows_stay_under_the_memory_bound() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut w = PcapWriter::new(Vec::new(), LinkType::Ethernet, 2048, Resolution::Nanos)
        .expect("pcap writer");
    let mut n = 0u32;
    let mut put = |frame: &[u8]| {
        n += 1;
        w.write_packet(Timestamp::new(1_700_000_000, n), frame, frame.len())
            .expect("write");
    };
    // Four exchanges of the followed QP: before, between and after the flood.
    let rounds = 4u32;
    let mut expected = 0;
    for round in 0..rounds {
        for p in conversation(round) {
            put(&p.frame().expect("frame"));
            expected += 1;
        }
        if round + 1 < rounds {
            for i in (round * SPOOFED / 3)..((round + 1) * SPOOFED / 3).min(SPOOFED) {
                put(&spoofed(i));
            }
        }
    }
    let file = dir.path().join("flood.pcap");
    std::fs::write(&file, w.into_inner().expect("pcap")).expect("write pcap");
    if let Some(keep) = std::env::var_os("CAPTURE_BOUNDS_KEEP") {
        std::fs::copy(&file, keep).expect("keep a copy");
    }
    let file = file.to_string_lossy().into_owned();
    let qpn = format!("{QP_B:#x}");

    // Following a QP: every packet of its conversation is shown, nothing else.
    let out = dir.path().join("followed.json");
    let (ok, err, rss_kb) = run_measured(&["-r", &file, "--json", "--qpn", &qpn], &out);
    assert!(ok, "{err}");
    let text = std::fs::read_to_string(&out).expect("output");
    let packets: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .filter(|v: &serde_json::Value| v.get("summary").is_none())
        .collect();
    let qps: Vec<u64> = packets
        .iter()
        .map(|v| v["bth"]["dest_qp"].as_u64().expect("qpn"))
        .collect();
    assert_eq!(
        packets.len(),
        expected,
        "the followed QP's packets: {qps:?}"
    );
    assert!(qps
        .iter()
        .all(|&q| q == u64::from(QP_A) || q == u64::from(QP_B)));
    eprintln!("--qpn: peak RSS {} MB", rss_kb / 1024);
    assert!(
        rss_kb < RSS_BOUND_KB,
        "--qpn: peak RSS {rss_kb} KB over {RSS_BOUND_KB} KB"
    );

    // Every flow followed (no --qpn): the table is bounded and says how much it dropped.
    let out = dir.path().join("all.txt");
    let (ok, err, rss_kb) = run_measured(&["-r", &file, "-q"], &out);
    assert!(ok, "{err}");
    eprintln!("all flows: peak RSS {} MB", rss_kb / 1024);
    assert!(
        rss_kb < RSS_BOUND_KB,
        "all flows: peak RSS {rss_kb} KB over {RSS_BOUND_KB} KB"
    );
    let line = err
        .lines()
        .find(|l| l.starts_with("flows: "))
        .unwrap_or_else(|| panic!("no flows line in {err}"));
    let numbers: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    // The followed conversation's 4 flows may be forgotten during a flood and come back.
    let [kept, evicted, max] = numbers[..] else {
        panic!("{line}");
    };
    assert_eq!((kept, max), (65_536, 65_536), "{line}");
    assert!(kept + evicted >= u64::from(SPOOFED) + 4, "{line}");
}

/// A small valid capture.
fn sample(dir: &Path, packets: u32) -> String {
    let frame = roce::doc_example_frame();
    let mut w = PcapWriter::new(Vec::new(), LinkType::Ethernet, 2048, Resolution::Nanos)
        .expect("pcap writer");
    for i in 0..packets {
        w.write_packet(Timestamp::new(1_700_000_000, i), &frame, frame.len())
            .expect("write");
    }
    let path = dir.join("sample.pcap");
    std::fs::write(&path, w.into_inner().expect("pcap")).expect("write");
    path.to_string_lossy().into_owned()
}

fn rdma_capture(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_rdma-capture"))
        .args(args)
        .output()
        .expect("run rdma-capture")
}

#[test]
fn write_refuses_a_symlink_and_leaves_its_target_alone() {
    let dir = tempfile::tempdir().expect("temp dir");
    let input = sample(dir.path(), 2);
    let target = dir.path().join("victim");
    std::fs::write(&target, b"precious").expect("victim");
    let link = dir.path().join("out.pcap");
    std::os::unix::fs::symlink(&target, &link).expect("symlink");
    let out = rdma_capture(&["-r", &input, "-q", "-w", &link.to_string_lossy()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "followed the symlink: {err}");
    assert!(err.contains("symbolic link"), "{err}");
    assert_eq!(std::fs::read(&target).expect("victim"), b"precious");
    assert!(std::fs::symlink_metadata(&link)
        .expect("link")
        .file_type()
        .is_symlink());
}

#[test]
fn written_files_are_private() {
    let dir = tempfile::tempdir().expect("temp dir");
    let input = sample(dir.path(), 2);
    let out_path = dir.path().join("out.pcap");
    // An existing world-readable file is replaced, not reused with its mode.
    std::fs::write(&out_path, b"old").expect("old file");
    std::fs::set_permissions(&out_path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let out = rdma_capture(&["-r", &input, "-q", "-w", &out_path.to_string_lossy()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta = std::fs::metadata(&out_path).expect("written");
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let written = std::fs::read(&out_path).expect("read");
    let (_, records) = roce::pcap::read(&written).expect("pcap");
    assert_eq!(records.count(), 2);
}

#[test]
fn a_failed_capture_leaves_no_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    // A write error: the file may grow to 100 bytes only (SIGXFSZ ignored, so write fails
    // with EFBIG instead of killing the process).
    let input = sample(dir.path(), 100);
    let out_path = dir.path().join("cut.pcap");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rdma-capture"));
    cmd.args(["-r", &input, "-q", "-w", &out_path.to_string_lossy()]);
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 100,
                rlim_max: 100,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            Ok(())
        });
    }
    let out = cmd.output().expect("run rdma-capture");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the write cannot succeed: {err}");
    assert!(!out_path.exists(), "partial file left behind: {err}");

    // An error after the file was opened: the input is not a capture.
    let garbage = dir.path().join("garbage.pcap");
    std::fs::write(&garbage, b"not a capture file").expect("garbage");
    let out_path = dir.path().join("never.pcap");
    let out = rdma_capture(&[
        "-r",
        &garbage.to_string_lossy(),
        "-w",
        &out_path.to_string_lossy(),
    ]);
    assert!(!out.status.success());
    assert!(!out_path.exists(), "file left behind after a bad input");
    // And after bad live-capture arguments.
    let out_path = dir.path().join("nolink.pcap");
    let out = rdma_capture(&["-i", "no-such-if0", "-w", &out_path.to_string_lossy()]);
    assert!(!out.status.success());
    assert!(!out_path.exists(), "file left behind after a bad interface");
}
