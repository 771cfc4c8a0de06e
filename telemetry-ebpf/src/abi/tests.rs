//! The C structs, read back from the compiled objects' BTF, against the Rust mirrors.
//!
//! `llvm-strip -g` keeps `.BTF` (aya needs it), so the objects the crate embeds describe their
//! own `struct event`. aya-obj does not expose struct members, and the format is small, so the
//! reader below walks the type section itself.

use super::*;

use crate::objects::{CAPTURE as CAPTURE_OBJECT, MONITOR as MONITOR_OBJECT};

/// A struct as BTF describes it: its size and each member's name and byte offset.
#[derive(Debug, PartialEq, Eq)]
struct Layout {
    size: usize,
    members: Vec<(String, usize)>,
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    let bytes = b.get(off..off + 4).expect("BTF read past its end");
    u32::from_le_bytes(bytes.try_into().expect("4 bytes"))
}

fn btf_section(object: &[u8]) -> &[u8] {
    use object::{Object, ObjectSection};
    let file = object::File::parse(object).expect("BPF object is ELF");
    let section = file.section_by_name(".BTF").expect("object has .BTF");
    section.data().expect(".BTF readable")
}

/// The struct named `name` in a BTF blob.
fn struct_layout(btf: &[u8], name: &str) -> Layout {
    assert_eq!(u16::from_le_bytes([btf[0], btf[1]]), 0xeb9f, "BTF magic");
    let hdr_len = u32_at(btf, 4) as usize;
    let (type_off, type_len) = (u32_at(btf, 8) as usize, u32_at(btf, 12) as usize);
    let str_off = u32_at(btf, 16) as usize;
    let types = &btf[hdr_len + type_off..hdr_len + type_off + type_len];
    let strings = &btf[hdr_len + str_off..];
    let string = |off: u32| -> String {
        let s = &strings[off as usize..];
        let end = s.iter().position(|&c| c == 0).unwrap_or(s.len());
        String::from_utf8_lossy(&s[..end]).into_owned()
    };
    let mut at = 0;
    while at < types.len() {
        let (name_off, info, size) = (
            u32_at(types, at),
            u32_at(types, at + 4),
            u32_at(types, at + 8),
        );
        let (kind, vlen, kind_flag) = ((info >> 24) & 0x1f, (info & 0xffff) as usize, info >> 31);
        at += 12;
        // Bytes that follow the common header, per kind (linux/btf.h).
        let extra = match kind {
            1 | 14 | 17 => 4,             // INT, VAR, DECL_TAG
            3 => 12,                      // ARRAY
            4 | 5 | 15 | 19 => 12 * vlen, // STRUCT, UNION, DATASEC, ENUM64
            6 | 13 => 8 * vlen,           // ENUM, FUNC_PROTO
            _ => 0,
        };
        if kind == 4 && string(name_off) == name {
            let members = (0..vlen)
                .map(|i| {
                    let m = at + 12 * i;
                    let bits = u32_at(types, m + 8);
                    let bit_off = if kind_flag == 1 {
                        bits & 0xff_ffff
                    } else {
                        bits
                    };
                    assert_eq!(bit_off % 8, 0, "bit field in {name}");
                    (string(u32_at(types, m)), (bit_off / 8) as usize)
                })
                .collect();
            return Layout {
                size: size as usize,
                members,
            };
        }
        at += extra;
    }
    panic!("struct {name} not in BTF");
}

fn object_or_skip(name: &str, object: &'static [u8]) -> Option<&'static [u8]> {
    if object.is_empty() {
        // build.rs leaves an empty object when clang is missing; CI installs clang.
        eprintln!("{name} not built (no clang): skipped");
        return None;
    }
    Some(object)
}

#[test]
fn monitor_event_matches_the_c_struct() {
    let Some(obj) = object_or_skip("monitor.bpf.o", MONITOR_OBJECT) else {
        return;
    };
    let c = struct_layout(btf_section(obj), "event");
    let rust = Layout {
        size: MONITOR_EVENT_LEN,
        members: [
            ("ktime_ns", monitor_event::KTIME_NS),
            ("cgroup_id", monitor_event::CGROUP_ID),
            ("latency_ns", monitor_event::LATENCY_NS),
            ("pid", monitor_event::PID),
            ("tid", monitor_event::TID),
            ("result", monitor_event::RESULT),
            ("verb", monitor_event::VERB),
            ("pad", offset_of!(MonitorEvent, pad)),
            ("comm", monitor_event::COMM),
            ("device", monitor_event::DEVICE),
        ]
        .map(|(n, o)| (n.to_owned(), o))
        .to_vec(),
    };
    assert_eq!(c, rust);
}

#[test]
fn capture_header_matches_the_c_struct() {
    let Some(obj) = object_or_skip("capture.bpf.o", CAPTURE_OBJECT) else {
        return;
    };
    let c = struct_layout(btf_section(obj), "event");
    let rust = Layout {
        // The C struct ends with the SNAP-byte packet buffer.
        size: CAPTURE_HEADER_LEN + SNAP as usize,
        members: [
            ("ifindex", capture_header::IFINDEX),
            ("dir", capture_header::DIR),
            ("pad", offset_of!(CaptureHeader, pad)),
            ("orig_len", capture_header::ORIG_LEN),
            ("cap_len", capture_header::CAP_LEN),
            ("ktime_ns", capture_header::KTIME_NS),
            ("data", CAPTURE_HEADER_LEN),
        ]
        .map(|(n, o)| (n.to_owned(), o))
        .to_vec(),
    };
    assert_eq!(c, rust);
}

#[test]
fn the_generated_header_carries_every_verb_and_constant() {
    let header = std::fs::read_to_string(concat!(env!("OUT_DIR"), "/abi.h")).expect("abi.h");
    for verb in rdma_quota::Verb::ALL {
        let line = format!("#define V_{} {}\n", verb.name(), verb.id());
        assert!(header.contains(&line), "{line:?} missing from abi.h");
        assert!(u32::from(verb.id()) < N_VERBS, "{verb} id beyond N_VERBS");
    }
    for r in rdma_quota::Resource::ALL {
        let line = format!("#define R_{} {}\n", r.name(), r.id());
        assert!(header.contains(&line), "{line:?} missing from abi.h");
        assert!(
            u32::from(r.id()) < LIVE_MR_BYTES,
            "{r:?} slot overlaps LIVE_MR_BYTES"
        );
    }
    for (name, value) in [
        ("SLOT_IOCTL", SLOT_IOCTL),
        ("SNAP", SNAP),
        ("N_STATS", N_STATS),
    ] {
        assert!(
            header.contains(&format!("#define {name} {value}\n")),
            "{name}"
        );
    }
    assert!(
        SNAP.is_power_of_two(),
        "the verifier bound needs a power of two"
    );
}
