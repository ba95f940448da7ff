//! Compiles the BPF programs in `bpf/` with clang for the kernel they run on
//! (`-target bpf`, the installed kernel headers). Without clang the crate
//! still builds, and loading says what is missing (`Error::NotBuilt`): the
//! HTTP-level filter keeps working.

use std::path::PathBuf;
use std::process::Command;

/// The programs, and a fixture the verifier refuses (the loader's test).
const PROGRAMS: [&str; 3] = ["dispatcher", "agent", "tests/refused"];

fn main() {
    println!("cargo:rustc-check-cfg=cfg(vcdn_bpf)");
    println!("cargo:rerun-if-changed=bpf");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".into());
    let arch = match std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() {
        Ok("x86_64") => "x86_64-linux-gnu",
        Ok("aarch64") => "aarch64-linux-gnu",
        _ => "",
    };
    // libbpf's own headers (bpf_helpers.h), from libbpf-sys's build.
    let libbpf = std::env::var("DEP_BPF_INCLUDE").expect("libbpf-sys gives its include dir");
    let mut built = true;
    for p in PROGRAMS {
        let src = format!("bpf/{p}.bpf.c");
        let obj = out.join(format!("{}.bpf.o", p.replace('/', "-")));
        let status = Command::new(&clang)
            .args(["-O2", "-g", "-Wall", "-Werror", "-target", "bpf"])
            .arg(format!("-I/usr/include/{arch}"))
            .arg(format!("-I{libbpf}"))
            .args(["-c", &src, "-o"])
            .arg(&obj)
            .status();
        match status {
            Ok(s) if s.success() => {}
            Ok(s) => panic!("clang failed on {src} ({s})"),
            Err(e) => {
                println!(
                    "cargo:warning=vcdn-srv6: cannot run {clang} ({e}): built without the BPF \
                     programs; install clang (Debian: apt-get install clang) for the SRv6 data path"
                );
                built = false;
                break;
            }
        }
    }
    if built {
        println!("cargo:rustc-cfg=vcdn_bpf");
    }
}
