//! Target BTF for CO-RE relocation: `vmlinux`, extended with one module's split BTF.
//!
//! aya 0.14 relocates only against `/sys/kernel/btf/vmlinux`. The private `ib_uverbs`
//! structures (and, on kernels whose built-in code never references InfiniBand, the `ib_core`
//! ones) are described only by module BTF. A module's BTF is "split BTF" on top of vmlinux:
//! its type ids continue after vmlinux's last id and its string offsets continue after
//! vmlinux's string section, so appending its type and string sections to vmlinux's yields one
//! self-contained BTF blob that aya can parse.

use std::path::Path;

use aya::{Btf, Endianness};

const BTF_MAGIC: u16 = 0xeb9f;
const HEADER_LEN: usize = 24;

#[derive(Debug, Clone, Copy)]
struct Header {
    hdr_len: usize,
    type_off: usize,
    type_len: usize,
    str_off: usize,
    str_len: usize,
}

fn le32(b: &[u8], off: usize) -> usize {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]]) as usize
}

fn header(what: &str, b: &[u8]) -> Result<Header, String> {
    if b.len() < HEADER_LEN {
        return Err(format!("{what}: BTF shorter than its header"));
    }
    if u16::from_le_bytes([b[0], b[1]]) != BTF_MAGIC {
        return Err(format!("{what}: not little-endian BTF"));
    }
    let h = Header {
        hdr_len: le32(b, 4),
        type_off: le32(b, 8),
        type_len: le32(b, 12),
        str_off: le32(b, 16),
        str_len: le32(b, 20),
    };
    let end = |off: usize, len: usize| h.hdr_len.checked_add(off).and_then(|v| v.checked_add(len));
    match (end(h.type_off, h.type_len), end(h.str_off, h.str_len)) {
        (Some(t), Some(s)) if h.hdr_len >= HEADER_LEN && t <= b.len() && s <= b.len() => Ok(h),
        _ => Err(format!("{what}: BTF sections out of bounds")),
    }
}

fn section<'a>(b: &'a [u8], h: &Header, off: usize, len: usize) -> &'a [u8] {
    &b[h.hdr_len + off..h.hdr_len + off + len]
}

/// Appends `split` (a module's BTF, split on top of `base`) to `base` (vmlinux BTF): one
/// self-contained blob. Errors say which input is not little-endian BTF or is truncated.
pub fn merge_split_btf(base: &[u8], split: &[u8]) -> Result<Vec<u8>, String> {
    let hb = header("vmlinux", base)?;
    let hs = header("module", split)?;
    let type_len = hb.type_len + hs.type_len;
    let str_len = hb.str_len + hs.str_len;
    let too_big = |_| "merged BTF larger than 4 GiB".to_string();
    let mut out = Vec::with_capacity(HEADER_LEN + type_len + str_len);
    out.extend_from_slice(&BTF_MAGIC.to_le_bytes());
    out.push(base[2]); // version
    out.push(0); // flags
    for v in [HEADER_LEN, 0, type_len, type_len, str_len] {
        out.extend_from_slice(&u32::try_from(v).map_err(too_big)?.to_le_bytes());
    }
    out.extend_from_slice(section(base, &hb, hb.type_off, hb.type_len));
    out.extend_from_slice(section(split, &hs, hs.type_off, hs.type_len));
    out.extend_from_slice(section(base, &hb, hb.str_off, hb.str_len));
    out.extend_from_slice(section(split, &hs, hs.str_off, hs.str_len));
    Ok(out)
}

/// The BTF to relocate against (`sys_btf/vmlinux` extended with `sys_btf/module` when that
/// module's BTF exists and merges), and a description of where it came from
/// (`vmlinux+MODULE`, or `vmlinux (...)` saying why the module's types are missing).
///
/// Errors name the vmlinux file that cannot be read or parsed.
pub fn target_btf(sys_btf: &Path, module: &str) -> Result<(Btf, String), String> {
    let vmlinux_path = sys_btf.join("vmlinux");
    let vmlinux =
        std::fs::read(&vmlinux_path).map_err(|e| format!("{}: {e}", vmlinux_path.display()))?;
    let module_path = sys_btf.join(module);
    if let Ok(split) = std::fs::read(&module_path) {
        match merge_split_btf(&vmlinux, &split)
            .and_then(|m| Btf::parse(&m, Endianness::default()).map_err(|e| e.to_string()))
        {
            Ok(btf) => return Ok((btf, format!("vmlinux+{module}"))),
            Err(e) => {
                let btf = Btf::parse(&vmlinux, Endianness::default()).map_err(|e| e.to_string())?;
                return Ok((btf, format!("vmlinux ({module} BTF unusable: {e})")));
            }
        }
    }
    let btf = Btf::parse(&vmlinux, Endianness::default()).map_err(|e| e.to_string())?;
    Ok((btf, format!("vmlinux (no {module} BTF)")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use aya_obj::btf::BtfKind;

    /// A BTF blob with the given raw type section and string section.
    fn blob(types: &[u8], strings: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&BTF_MAGIC.to_le_bytes());
        b.push(1);
        b.push(0);
        for v in [
            24u32,
            0,
            types.len() as u32,
            types.len() as u32,
            strings.len() as u32,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(types);
        b.extend_from_slice(strings);
        b
    }

    fn words(ws: &[u32]) -> Vec<u8> {
        ws.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    #[test]
    fn module_types_resolve_against_base() {
        // base: [1] INT 'int' size 4; strings "\0int\0"
        const KIND_INT: u32 = 1;
        const KIND_STRUCT: u32 = 4;
        let base = blob(&words(&[1, KIND_INT << 24, 4, 32]), b"\0int\0");
        // module: [2] STRUCT 'ib_device' size 4 with member 'devnum' of type [1] at bit 0.
        // Module string offsets start after base's 5 bytes: "\0ib_device\0devnum\0" -> 6, 16.
        let module = blob(
            &words(&[6, (KIND_STRUCT << 24) | 1, 4, 16, 1, 0]),
            b"\0ib_device\0devnum\0",
        );
        let merged = merge_split_btf(&base, &module).unwrap();
        let btf = Btf::parse(&merged, Endianness::default()).unwrap();
        assert_eq!(
            btf.id_by_type_name_kind("ib_device", BtfKind::Struct)
                .unwrap(),
            2
        );
        assert_eq!(btf.id_by_type_name_kind("int", BtfKind::Int).unwrap(), 1);
    }

    #[test]
    fn rejects_garbage() {
        assert!(merge_split_btf(b"short", b"").is_err());
        let mut bad = blob(&[], b"\0");
        bad[12] = 0xff; // type_len beyond the blob
        assert!(merge_split_btf(&bad, &blob(&[], b"\0")).is_err());
        let mut be = blob(&[], b"\0");
        be.swap(0, 1);
        assert!(merge_split_btf(&be, &blob(&[], b"\0")).is_err());
    }
}
