use std::os::unix::fs::FileExt;
use std::time::Instant;
fn cpu() -> f64 { let mut u: libc::rusage = unsafe { std::mem::zeroed() }; unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) }; let s = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6; s(u.ru_utime) + s(u.ru_stime) }
fn main() {
    let path = "/tmp/thp-hot.dat"; let file_mb = 1024usize;
    let f = std::fs::OpenOptions::new().read(true).write(true).create(true).open(path).unwrap();
    if f.metadata().unwrap().len() != (file_mb << 20) as u64 { let b = vec![7u8; 1 << 20]; for i in 0..file_mb { f.write_at(&b, (i << 20) as u64).unwrap(); } }
    let arena = 32usize << 20; let chunk: usize = std::env::args().nth(1).map(|a| a.parse::<usize>().unwrap() << 10).unwrap_or(1 << 20);
    for round in 0..3 { for mode in ["4k", "huge"] {
        let p = unsafe { libc::mmap(std::ptr::null_mut(), arena + (2 << 20), libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0) } as *mut u8;
        let p = ((p as usize + (2 << 20) - 1) & !((2 << 20) - 1)) as *mut u8; // 2 MiB aligned in both modes
        unsafe { libc::madvise(p.cast(), arena, if mode == "huge" { libc::MADV_HUGEPAGE } else { libc::MADV_NOHUGEPAGE }) };
        unsafe { std::ptr::write_bytes(p, 1, arena); libc::mlock(p.cast(), arena) };
        let buf = unsafe { std::slice::from_raw_parts_mut(p, arena) };
        // warm the file
        for off in (0..file_mb << 20).step_by(chunk) { let s = (off % arena) / chunk * chunk; f.read_at(&mut buf[s..s + chunk], off as u64).unwrap(); }
        let (t, c) = (Instant::now(), cpu()); let mut n = 0usize;
        for _ in 0..4 { for off in (0..file_mb << 20).step_by(chunk) { let s = (off % arena) / chunk * chunk; n += f.read_at(&mut buf[s..s + chunk], off as u64).unwrap(); } }
        let (w, c) = (t.elapsed().as_secs_f64(), cpu() - c);
        let smaps = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap(); let ah = smaps.lines().find(|l| l.starts_with("AnonHugePages")).unwrap_or("").to_string();
        println!("round {round} {mode}: chunk {} KiB {:.2} GiB/s, {:.3} CPU-s/GiB  ({ah})", chunk >> 10, n as f64 / w / (1u64 << 30) as f64, c / (n as f64 / (1u64 << 30) as f64));
    }}
}
