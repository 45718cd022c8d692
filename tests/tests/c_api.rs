//! The C API end to end: the programs of `tests/c/` compiled with gcc/g++ against
//! `capi/include/hipfile.h`, linked against the freshly built `libhipfile.so` /
//! `libhipfile.a` / `libhipfile_hip_cpu.so` (this crate depends on both crates, so cargo
//! builds them first, into `target/<profile>/deps/`, next to this test's executable) and
//! run on the cpu device with `LD_LIBRARY_PATH`.
//!
//! Tools: gcc, g++, pkg-config, nm and the HIP headers (`libamdhip64-dev`) come from
//! `.ci/install-deps`. Outside CI a missing tool skips its test with a printed reason;
//! under CI (`CI` set) it fails the test.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long one C program may run.
const RUN_TIMEOUT: Duration = Duration::from_secs(180);

/// Flags every C/C++ compilation uses.
const WARNINGS: &[&str] = &["-Wall", "-Wextra", "-Werror"];

/// Where the tests build and run things.
struct Env {
    /// `target/<profile>/deps`: the freshly built libraries.
    deps: PathBuf,
    /// A directory holding the shared libraries under their run-time names
    /// (`libhipfile.so.0` is the soname).
    libdir: PathBuf,
    /// Scratch space (executables, temp files).
    work: PathBuf,
    /// `capi/include`.
    include: PathBuf,
    /// `tests/c`.
    sources: PathBuf,
}

fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| {
        let exe = std::env::current_exe().expect("test executable path");
        let deps = exe.parent().expect("deps directory").to_path_buf();
        for lib in ["libhipfile.so", "libhipfile.a", "libhipfile_hip_cpu.so"] {
            assert!(
                deps.join(lib).is_file(),
                "{} not built next to the test",
                deps.join(lib).display()
            );
        }
        // One scratch directory per profile, emptied at the start of each run.
        let work = deps.parent().expect("profile directory").join("hipfile-c-tests");
        let _ = fs::remove_dir_all(&work);
        let libdir = work.join("lib");
        fs::create_dir_all(&libdir).expect("create the scratch directory");
        for (name, target) in [
            ("libhipfile.so", "libhipfile.so"),
            ("libhipfile.so.0", "libhipfile.so"),
            ("libhipfile_hip_cpu.so", "libhipfile_hip_cpu.so"),
        ] {
            symlink(deps.join(target), libdir.join(name)).expect("link a library");
        }
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
        Env {
            deps,
            libdir,
            work,
            include: manifest.join("../capi/include"),
            sources: manifest.join("c"),
        }
    })
}

/// Whether a tool can run; outside CI a missing tool skips (`false`, reason printed),
/// under CI it fails.
fn have(tool: &str, why: &str) -> bool {
    let found =
        Command::new(tool).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status();
    if found.is_ok_and(|status| status.success()) {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{tool} is required in CI ({why}); .ci/install-deps installs it"
    );
    println!("SKIP: {tool} not found ({why})");
    false
}

/// Whether `<hip/hip_runtime_api.h>` is on gcc's include path.
fn have_hip_headers() -> bool {
    let probe = env().work.join("hip-probe.c");
    fs::write(&probe, "#include <hip/hip_runtime_api.h>\nint main(void) { return 0; }\n")
        .expect("write probe");
    let output = Command::new("gcc")
        .args(["-D__HIP_PLATFORM_AMD__", "-fsyntax-only"])
        .arg(&probe)
        .output()
        .expect("run gcc");
    if output.status.success() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "the HIP headers (libamdhip64-dev) are required in CI"
    );
    println!("SKIP: <hip/hip_runtime_api.h> not found (apt install libamdhip64-dev)");
    false
}

/// Compiles with `compiler` and `args` (sources, flags, libraries) into `work/output`.
fn compile(compiler: &str, output: &str, args: &[String]) -> PathBuf {
    let exe = env().work.join(output);
    let result =
        Command::new(compiler).args(args).arg("-o").arg(&exe).output().expect("run the compiler");
    assert!(
        result.status.success(),
        "{compiler} {} failed:\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&result.stdout),
        String::from_utf8_lossy(&result.stderr)
    );
    exe
}

fn source(name: &str) -> String {
    env().sources.join(name).display().to_string()
}

fn include_flag() -> String {
    format!("-I{}", env().include.display())
}

/// `-std=... -Wall -Wextra -Werror -D__HIP_PLATFORM_AMD__ -I capi/include source`.
fn c_args(std: &str, source_name: &str) -> Vec<String> {
    let mut args = vec![format!("-std={std}")];
    args.extend(WARNINGS.iter().map(|w| w.to_string()));
    args.extend(["-D__HIP_PLATFORM_AMD__".to_string(), include_flag(), source(source_name)]);
    args
}

/// Link flags for the shared libraries.
fn shared_libs(with_hip_cpu: bool) -> Vec<String> {
    let mut args = vec![format!("-L{}", env().libdir.display()), "-lhipfile".to_string()];
    if with_hip_cpu {
        args.push("-lhipfile_hip_cpu".to_string());
    }
    args
}

/// Runs a program on the cpu device with the test's libraries; returns its stdout.
/// Panics (with its output) when it fails or runs past [`RUN_TIMEOUT`].
fn run(program: &Path, wrapper: &[&str], extra_env: &[(&str, &str)]) -> String {
    let e = env();
    let name = program.file_name().expect("program name").to_string_lossy().into_owned();
    let (out_path, err_path) =
        (e.work.join(format!("{name}.stdout")), e.work.join(format!("{name}.stderr")));
    let mut command = match wrapper.split_first() {
        Some((tool, args)) => {
            let mut c = Command::new(tool);
            c.args(args).arg(program);
            c
        }
        None => Command::new(program),
    };
    command
        .env("LD_LIBRARY_PATH", &e.libdir)
        .env("HIPFILE_DEVICE", "cpu")
        .env("TMPDIR", &e.work)
        .envs(extra_env.iter().copied())
        .stdin(Stdio::null())
        .stdout(fs::File::create(&out_path).expect("stdout file"))
        .stderr(fs::File::create(&err_path).expect("stderr file"));
    let mut child = command.spawn().expect("start the program");
    let deadline = Instant::now() + RUN_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the program") {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let stdout = fs::read_to_string(&out_path).unwrap_or_default();
    let stderr = fs::read_to_string(&err_path).unwrap_or_default();
    match status {
        Some(status) if status.success() => {
            print!("{stdout}");
            stdout
        }
        Some(status) => panic!("{name} failed ({status}):\n{stdout}\n{stderr}"),
        None => panic!("{name} ran past {RUN_TIMEOUT:?}:\n{stdout}\n{stderr}"),
    }
}

#[test]
fn abi_c11_and_cxx17_with_hip_headers() {
    if !have("gcc", "C tests") || !have("g++", "C++ ABI test") || !have_hip_headers() {
        return;
    }
    let mut c = c_args("c11", "abi.c");
    c.push("-pedantic".into());
    c.extend(shared_libs(false));
    let exe = compile("gcc", "abi-c11", &c);
    assert!(run(&exe, &[], &[]).contains("(C)"));

    let mut cxx = vec!["-x".to_string(), "c++".to_string()];
    cxx.extend(c_args("c++17", "abi.c"));
    cxx.extend(["-x".to_string(), "none".to_string()]);
    cxx.extend(shared_libs(false));
    let exe = compile("g++", "abi-cxx17", &cxx);
    assert!(run(&exe, &[], &[]).contains("(C++)"));
}

/// The include path of `compiler` with `/usr/include` replaced by a mirror that lacks
/// `hip/`, so `__has_include(<hip/hip_runtime_api.h>)` is false.
fn include_path_without_hip(compiler: &str, language: &str) -> Vec<String> {
    let mirror = env().work.join("include-without-hip");
    if !mirror.exists() {
        fs::create_dir_all(&mirror).expect("mirror dir");
        for entry in fs::read_dir("/usr/include").expect("read /usr/include").flatten() {
            if entry.file_name() != "hip" {
                let _ = symlink(entry.path(), mirror.join(entry.file_name()));
            }
        }
    }
    let output = Command::new(compiler)
        .args(["-x", language, "-E", "-v", "/dev/null"])
        .output()
        .expect("ask the compiler for its include path");
    let text = String::from_utf8_lossy(&output.stderr).into_owned();
    let start = text.find("#include <...> search starts here:").expect("include list start");
    let end = text.find("End of search list.").expect("include list end");
    let mut args = vec!["-nostdinc".to_string()];
    for dir in text[start..end].lines().skip(1).map(str::trim).filter(|l| !l.is_empty()) {
        let dir = match dir.strip_prefix("/usr/include") {
            Some(rest) => format!("{}{rest}", mirror.display()),
            None => dir.to_string(),
        };
        args.push(format!("-isystem{dir}"));
    }
    args
}

#[test]
fn abi_without_hip_headers_uses_the_fallback_declarations() {
    if !have("gcc", "C tests") || !have("g++", "C++ ABI test") {
        return;
    }
    let mut c = include_path_without_hip("gcc", "c");
    c.extend(["-std=c11".into(), "-pedantic".into(), "-DHIPFILE_EXPECT_FALLBACK".into()]);
    c.extend([include_flag(), source("abi.c")]);
    c.extend(WARNINGS.iter().map(|w| w.to_string()));
    c.extend(shared_libs(false));
    let exe = compile("gcc", "abi-c11-no-hip", &c);
    run(&exe, &[], &[]);

    let mut cxx = include_path_without_hip("g++", "c++");
    cxx.extend([
        "-x".into(),
        "c++".into(),
        "-std=c++17".into(),
        "-DHIPFILE_EXPECT_FALLBACK".into(),
    ]);
    cxx.extend([include_flag(), source("abi.c")]);
    cxx.extend(["-x".into(), "none".into()]);
    cxx.extend(WARNINGS.iter().map(|w| w.to_string()));
    cxx.extend(shared_libs(false));
    let exe = compile("g++", "abi-cxx17-no-hip", &cxx);
    run(&exe, &[], &[]);
}

#[test]
fn unmodified_hip_program_runs_async_io_on_the_cpu_runtime() {
    if !have("gcc", "C tests") || !have_hip_headers() {
        return;
    }
    let mut args = c_args("c11", "hip_async.c");
    args.extend(shared_libs(true));
    let exe = compile("gcc", "hip_async", &args);
    assert!(run(&exe, &[], &[]).contains("hip_async: all checks passed"));
}

/// The cpu HIP runtime speaks HIP 5.x and HIP 6 (`HIPFILE_HIP_CPU_API`): memory-type
/// numbering and unknown memory in `hipPointerGetAttributes`.
#[test]
fn pointer_attributes_in_hip5_and_hip6_numbering() {
    if !have("gcc", "C tests") || !have_hip_headers() {
        return;
    }
    let mut args = c_args("c11", "pointer_attributes.c");
    args.extend(shared_libs(true));
    let exe = compile("gcc", "pointer_attributes", &args);
    for major in ["5", "6"] {
        let output = run(&exe, &[], &[("HIPFILE_HIP_CPU_API", major)]);
        assert!(output.contains(&format!("all checks passed (HIP {major} numbering)")), "{output}");
    }
}

#[test]
fn behaviour_rows_through_the_c_abi() {
    if !have("gcc", "C tests") || !have_hip_headers() {
        return;
    }
    let mut args = c_args("c11", "behaviour.c");
    args.extend(shared_libs(true));
    let exe = compile("gcc", "behaviour", &args);
    assert!(run(&exe, &[], &[]).contains("behaviour: all checks passed"));
}

#[test]
fn static_library_links_and_runs() {
    if !have("gcc", "C tests") || !have_hip_headers() {
        return;
    }
    let mut args = c_args("c11", "static_link.c");
    args.push(env().deps.join("libhipfile.a").display().to_string());
    args.extend(["-lpthread", "-ldl", "-lm"].map(String::from));
    let exe = compile("gcc", "static_link", &args);
    assert!(run(&exe, &[], &[]).contains("libhipfile.a works"));
}

/// hip_async and behaviour under AddressSanitizer (the C side instrumented; ASan's
/// allocator and leak checker cover the Rust libraries' malloc/free too). Valgrind is
/// not used: it does not support the io_uring rings of the I/O engine (runs hang).
#[test]
fn programs_under_address_sanitizer() {
    if !have("gcc", "C tests") || !have_hip_headers() {
        return;
    }
    let probe = env().work.join("asan-probe.c");
    fs::write(&probe, "int main(void) { return 0; }\n").expect("write probe");
    let asan = Command::new("gcc")
        .args(["-fsanitize=address", "-o"])
        .arg(env().work.join("asan-probe"))
        .arg(&probe)
        .output()
        .is_ok_and(|o| o.status.success());
    if !asan {
        assert!(
            std::env::var_os("CI").is_none(),
            "gcc -fsanitize=address must work in CI (libasan)"
        );
        println!("SKIP: gcc -fsanitize=address does not link here (no libasan)");
        return;
    }
    for program in ["hip_async", "behaviour"] {
        let mut args = c_args("c11", &format!("{program}.c"));
        args.extend(["-g", "-fsanitize=address", "-fno-omit-frame-pointer"].map(String::from));
        args.extend(shared_libs(true));
        let exe = compile("gcc", &format!("{program}-asan"), &args);
        let output = run(&exe, &[], &[("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0")]);
        assert!(output.contains("all checks passed"));
    }
}

#[test]
fn pkg_config_file_from_install_script() {
    if !have("gcc", "C tests") || !have("pkg-config", "pkg-config test") || !have_hip_headers() {
        return;
    }
    let e = env();
    let prefix = e.work.join("prefix");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../capi/install.sh");
    let installed = Command::new("bash")
        .arg(&script)
        .arg("--prefix")
        .arg(&prefix)
        .arg("--build-dir")
        .arg(&e.deps)
        .output()
        .expect("run install.sh");
    assert!(
        installed.status.success(),
        "install.sh failed: {}",
        String::from_utf8_lossy(&installed.stderr)
    );
    let pkg_config = |args: &[&str]| {
        let out = Command::new("pkg-config")
            .args(args)
            .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig"))
            .output()
            .expect("run pkg-config");
        assert!(
            out.status.success(),
            "pkg-config {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(pkg_config(&["--modversion", "hipfile"]), "0.2.0");
    let flags = pkg_config(&["--cflags", "--libs", "hipfile", "hipfile-hip-cpu"]);
    assert!(
        flags.contains("-lhipfile")
            && flags.contains(&format!("-I{}", prefix.join("include").display()))
    );
    assert!(pkg_config(&["--static", "--libs", "hipfile"]).contains("-lpthread"));

    let mut args = vec!["-std=c11".to_string(), source("hip_async.c")];
    args.extend(WARNINGS.iter().map(|w| w.to_string()));
    args.extend(flags.split_whitespace().map(String::from));
    let exe = compile("gcc", "hip_async-pkg-config", &args);
    let lib = prefix.join("lib").display().to_string();
    let mut command_env = vec![("LD_LIBRARY_PATH", lib.as_str())];
    command_env.push(("HIPFILE_DEVICE", "cpu"));
    assert!(run(&exe, &[], &command_env).contains("all checks passed"));
}

/// Defined dynamic symbols of a shared library (`nm -D --defined-only`), text only.
fn exported_functions(library: &Path) -> Vec<String> {
    let output =
        Command::new("nm").args(["-D", "--defined-only"]).arg(library).output().expect("run nm");
    assert!(output.status.success(), "nm failed");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (_, kind, name) = (fields.next()?, fields.next()?, fields.next()?);
            (kind == "T").then(|| name.to_string())
        })
        .collect()
}

#[test]
fn exported_symbols_are_the_api_table() {
    if !have("nm", "symbol check") {
        return;
    }
    let e = env();
    let hipfile = exported_functions(&e.deps.join("libhipfile.so"));
    let api: Vec<_> = hipfile.iter().filter(|name| name.starts_with("hipFile")).collect();
    let cpu: Vec<_> = hipfile.iter().filter(|name| name.starts_with("hipfileCpu")).collect();
    let ext: Vec<_> = hipfile
        .iter()
        .filter(|name| name.starts_with("hipfileStats") || name.starts_with("hipfileExplain"))
        .collect();
    assert_eq!(api.len(), 31, "hipFile functions exported: {api:?}");
    assert_eq!(cpu.len(), 25, "hipfileCpu functions exported: {cpu:?}");
    assert_eq!(ext.len(), 4, "hipfile_ext.h functions exported: {ext:?}");
    let ours = api.len() + cpu.len() + ext.len();
    assert_eq!(hipfile.len(), ours, "unexpected exports: {hipfile:?}");

    let hip = exported_functions(&e.deps.join("libhipfile_hip_cpu.so"));
    let required = [
        "hipInit",
        "hipGetDevice",
        "hipSetDevice",
        "hipGetDeviceCount",
        "hipDeviceGetAttribute",
        "hipDeviceSynchronize",
        "hipMalloc",
        "hipFree",
        "hipHostMalloc",
        "hipHostFree",
        "hipMallocManaged",
        "hipExtMallocWithFlags",
        "hipMemcpy",
        "hipMemcpyAsync",
        "hipMemset",
        "hipMemsetAsync",
        "hipPointerGetAttributes",
        "hipMemGetAddressRange",
        "hipStreamCreate",
        "hipStreamCreateWithFlags",
        "hipStreamDestroy",
        "hipStreamSynchronize",
        "hipStreamQuery",
        "hipStreamGetDevice",
        "hipStreamWaitValue32",
        "hipStreamWaitValue64",
        "hipStreamWriteValue32",
        "hipStreamWriteValue64",
        "hipLaunchHostFunc",
        "hipEventCreate",
        "hipEventRecord",
        "hipEventSynchronize",
        "hipEventQuery",
        "hipEventDestroy",
        "hipGetErrorString",
        "hipGetErrorName",
        "hipGetLastError",
    ];
    for name in required {
        assert!(hip.iter().any(|n| n == name), "libhipfile_hip_cpu.so does not export {name}");
    }
    assert!(hip.iter().all(|n| n.starts_with("hip")), "unexpected exports: {hip:?}");
}
