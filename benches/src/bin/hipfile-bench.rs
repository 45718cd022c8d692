//! `hipfile-bench`: the project's main job (gdsio-like benchmark). The I/O runtime is not
//! built yet, so for now it shows what the core decides for a sample request.

use hipfile_core::{BufferSpan, ChunkMode, DioAlignment, PlanConfig, RawIo, StreamFlags, validate};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("hipfile-bench: the I/O runtime (engine, devices) is not built yet;");
    println!("showing how hipfile-core validates and plans a sample async read instead.\n");
    let buffer = BufferSpan { base_addr: 0x7f00_0000_0000, len_bytes: 64 << 20 };
    let raw =
        RawIo { size_bytes: (16 << 20) + 300, file_offset_bytes: 100, buffer_offset_bytes: 0 };
    let io = validate(raw, buffer, StreamFlags::FIXED_ALL, 4096)?;
    let plan = PlanConfig::new(4 << 20, Some(DioAlignment::DEFAULT), 4096)?;
    println!("request: {} bytes at file offset {}", io.size_bytes(), io.file_offset_bytes());
    println!("{:>5} {:>12} {:>10} {:>9}", "chunk", "file_offset", "bytes", "mode");
    for chunk in plan.plan(&io) {
        let mode = match chunk.mode {
            ChunkMode::Direct => "O_DIRECT",
            ChunkMode::Buffered => "buffered",
        };
        println!(
            "{:>5} {:>12} {:>10} {:>9}",
            chunk.index, chunk.file_offset_bytes, chunk.len_bytes, mode
        );
    }
    Ok(())
}
