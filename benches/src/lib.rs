//! hipfile-bench will hold the `hipfile-bench` CLI (the project's main job) and the
//! criterion micro-benches.
