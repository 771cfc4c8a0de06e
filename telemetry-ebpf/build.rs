//! Compiles every `bpf/NAME.bpf.c` (kernel-side programs, C with CO-RE) with clang into
//! `$OUT_DIR/NAME.bpf.o`: `capture.bpf.c` (rdma-capture's XDP/TC/kprobe programs) and
//! `monitor.bpf.c` (rdma-monitor's control-path probes).
//!
//! * `BPF_CLANG` overrides the compiler (default `clang`), `BPF_STRIP` the stripper
//!   (default `llvm-strip`; stripping is skipped when it is missing).
//! * `vmlinux.h` comes from `$BPF_VMLINUX_H_DIR`, else `bpf/vmlinux.h`, else it is generated into
//!   `$OUT_DIR` with `bpftool btf dump file /sys/kernel/btf/vmlinux format c`.
//! * If an object cannot be built (no clang, no BTF), the build does NOT fail: an empty object
//!   is written and a warning printed, and the tool reports at run time that it was built
//!   without its BPF programs. The decoder and the report renderers never need clang.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=bpf");
    println!("cargo:rerun-if-env-changed=BPF_CLANG");
    println!("cargo:rerun-if-env-changed=BPF_STRIP");
    println!("cargo:rerun-if-env-changed=BPF_VMLINUX_H_DIR");

    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"));
    let mut sources: Vec<PathBuf> = std::fs::read_dir("bpf")
        .expect("read telemetry-ebpf/bpf")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".bpf.c"))
        .collect();
    sources.sort();
    for source in sources {
        let name = source
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".bpf.c"))
            .expect("NAME.bpf.c")
            .to_owned();
        println!("cargo:rerun-if-changed={}", source.display());
        let object = out_dir.join(format!("{name}.bpf.o"));
        if let Err(why) = build(&out_dir, &source, &object) {
            println!("cargo:warning={name}.bpf.o not built ({why}); its tool will refuse to run");
            std::fs::write(&object, b"").expect("write empty BPF object");
        }
    }
}

fn build(out_dir: &Path, source: &Path, object: &Path) -> Result<(), String> {
    let include = vmlinux_dir(out_dir)?;
    let clang = env::var("BPF_CLANG").unwrap_or_else(|_| "clang".into());
    let status = Command::new(&clang)
        .args([
            "-target",
            "bpf",
            "-g",
            "-O2",
            "-Wall",
            "-D__TARGET_ARCH_x86",
        ])
        .arg("-I")
        .arg(&include)
        .arg("-c")
        .arg(source)
        .arg("-o")
        .arg(object)
        .status()
        .map_err(|e| format!("cannot run {clang}: {e}"))?;
    if !status.success() {
        return Err(format!("{clang} failed: {status}"));
    }
    let strip = env::var("BPF_STRIP").unwrap_or_else(|_| "llvm-strip".into());
    // Stripping debug info shrinks the object ~15x; aya only needs .BTF/.BTF.ext.
    let _ = Command::new(strip).arg("-g").arg(object).status();
    Ok(())
}

fn vmlinux_dir(out_dir: &Path) -> Result<PathBuf, String> {
    if let Some(dir) = env::var_os("BPF_VMLINUX_H_DIR") {
        return Ok(PathBuf::from(dir));
    }
    if Path::new("bpf/vmlinux.h").exists() {
        return Ok(PathBuf::from("bpf"));
    }
    let header = out_dir.join("vmlinux.h");
    if header.exists() {
        return Ok(out_dir.to_path_buf());
    }
    let out = Command::new("bpftool")
        .args([
            "btf",
            "dump",
            "file",
            "/sys/kernel/btf/vmlinux",
            "format",
            "c",
        ])
        .output()
        .map_err(|e| format!("cannot run bpftool: {e}"))?;
    if !out.status.success() {
        return Err(format!("bpftool btf dump failed: {}", out.status));
    }
    std::fs::write(&header, out.stdout).map_err(|e| format!("write vmlinux.h: {e}"))?;
    Ok(out_dir.to_path_buf())
}
