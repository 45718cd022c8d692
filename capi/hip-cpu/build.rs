//! Picks the HIP API generation the cpu HIP runtime speaks by default: the major version
//! of the HIP headers found at build time (`$HIP_PATH/include/hip/hip_version.h`, then
//! `/opt/rocm`, then `/usr/include/hip`), 5 when none is found. `HIPFILE_HIP_CPU_API`
//! overrides it when a program runs (src/lib.rs, `hip_api_major`).

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=HIP_PATH");
    let mut candidates = Vec::new();
    if let Some(hip) = std::env::var_os("HIP_PATH") {
        candidates.push(PathBuf::from(hip).join("include/hip/hip_version.h"));
    }
    candidates.push(PathBuf::from("/opt/rocm/include/hip/hip_version.h"));
    candidates.push(PathBuf::from("/usr/include/hip/hip_version.h"));
    let mut major = 5;
    for path in candidates {
        println!("cargo:rerun-if-changed={}", path.display());
        let Ok(text) = std::fs::read_to_string(&path) else { continue };
        let found = text.lines().find_map(|line| {
            line.trim().strip_prefix("#define HIP_VERSION_MAJOR")?.trim().parse::<u32>().ok()
        });
        if let Some(found) = found {
            major = if found >= 6 { 6 } else { 5 };
            break;
        }
    }
    println!("cargo:rustc-env=HIPFILE_HIP_CPU_DEFAULT_API={major}");
}
