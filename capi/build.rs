//! Gives libhipfile.so its soname (`libhipfile.so.0`, as AMD's hipFile) and rebuilds
//! when the public headers change.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libhipfile.so.0");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=include/hipfile.h");
    println!("cargo:rerun-if-changed=include/hipfile_cpu.h");
}
