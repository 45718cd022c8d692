//! Link without the C runtime's start files (the binary provides `_start`); link libc
//! only for `memcpy`/`memset`, which rustc's no_std builds expect from the platform.
fn main() {
    println!("cargo:rustc-link-arg-bins=-nostartfiles");
    println!("cargo:rustc-link-arg-bins=-lc");
}
