//! hipfile-capi will own the C API: `libhipfile.so.0` / `libhipfile.a` exporting every
//! hipFile symbol, `include/hipfile.h` and `hipfile.pc`. It is the only crate with
//! `extern "C"` exports. Not built yet: see the open issues.
