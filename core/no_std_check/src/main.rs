//! no_std consumer of hipfile-core (see Cargo.toml).
#![no_std]
#![no_main]

use core::hint::black_box;
use hipfile_core::{BufferSpan, DioAlignment, PlanConfig, RawIo, StreamFlags, validate};

#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

/// Never called with `panic = "abort"`; libcore's precompiled objects still name it.
#[unsafe(no_mangle)]
pub extern "C" fn rust_eh_personality() {}

fn exercise() -> u64 {
    let buffer = BufferSpan { base_addr: black_box(0x1000), len_bytes: black_box(1 << 20) };
    let raw =
        RawIo { size_bytes: black_box(1 << 20), file_offset_bytes: 0, buffer_offset_bytes: 0 };
    let Ok(flags) = StreamFlags::parse(black_box(7)) else { return 1 };
    let Ok(io) = validate(raw, buffer, flags, 4096) else { return 2 };
    let Ok(plan) = PlanConfig::new(1 << 16, Some(DioAlignment::DEFAULT), 4096) else { return 3 };
    plan.plan(&io).map(|c| c.len_bytes).sum()
}

// `_start` is entered with a 16-byte aligned stack and no return address: align it as
// the C ABI expects at a call, then call `entry`.
core::arch::global_asm!(".globl _start", "_start:", "and rsp, -16", "call {entry}", "ud2", entry = sym entry);

/// Runs the core once and exits with status 0 when the plan covered the request.
extern "C" fn entry() -> ! {
    let status = u64::from(exercise() != 1 << 20);
    // SAFETY: the `exit` system call (60 on x86-64) takes one integer and never returns.
    unsafe { core::arch::asm!("syscall", in("rax") 60u64, in("rdi") status, options(noreturn)) }
}
