//! The Python package's pytest suite (`python/run-tests.sh`, on the cpu device) as part
//! of `cargo test --workspace`: it builds the extension into this test's target
//! directory, installs it into `python/.venv` and runs pytest.
//!
//! Outside CI, a machine without Python >= 3.9 skips it with a message; in CI
//! (`CI=true`) that is a failure, as for the C tests.

use std::path::Path;
use std::process::Command;

#[test]
fn the_python_package_passes_its_tests_on_the_cpu_device() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../python/run-tests.sh");
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("python-build");
    let output = Command::new("bash")
        .arg(&script)
        .env("CARGO_TARGET_DIR", &target)
        .output()
        .expect("run python/run-tests.sh");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}{stderr}");
    assert!(output.status.success(), "python/run-tests.sh failed:\n{stdout}\n{stderr}");
    if stdout.contains("SKIP") {
        let ci = std::env::var("CI").is_ok_and(|v| v == "true");
        assert!(!ci, "CI must run the Python tests: {stdout}");
        return;
    }
    assert!(stdout.contains(" passed"), "no pytest summary:\n{stdout}");
}
