//! hipfile-tests will hold the end-to-end tests: the Rust suites shared by all device
//! backends and the C programs compiled against `hipfile.h`. Not built yet.
