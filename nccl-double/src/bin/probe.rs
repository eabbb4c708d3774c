//! Test fixture: plays one rank through cudarc, either as a correct program does or
//! breaking one rule on purpose. `probe CASE RANK WORLD ID_FILE`; prints `ok ...` or
//! `error: CODE: NCCL's text` and exits 0 or 1.

use cudarc::driver::CudaContext;
use cudarc::nccl::{Comm, Id, ReduceOp, result, sys};
use std::ffi::CStr;
use std::time::{Duration, Instant};

fn shared_id(rank: usize, file: &str) -> Id {
    if rank == 0 {
        let id = Id::new().expect("ncclGetUniqueId");
        let bytes: Vec<u8> = id.internal().iter().map(|c| *c as u8).collect();
        std::fs::write(format!("{file}.tmp"), bytes).unwrap();
        std::fs::rename(format!("{file}.tmp"), file).unwrap();
        return id;
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(bytes) = std::fs::read(file) {
            return Id::uninit(std::array::from_fn(|i| bytes[i] as _));
        }
        assert!(Instant::now() < deadline, "rank 0 never wrote the id");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn fail(e: result::NcclError) -> ! {
    let text = unsafe { CStr::from_ptr(sys::ncclGetLastError(std::ptr::null_mut())) };
    println!("error: {:?}: {}", e.0, text.to_string_lossy());
    std::process::exit(1);
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let (case, rank, world, file) = (
        a[1].as_str(),
        a[2].parse::<usize>().unwrap(),
        a[3].parse::<usize>().unwrap(),
        &a[4],
    );
    let id = shared_id(rank, file);
    let ctx = CudaContext::new(rank).expect("CudaContext::new");
    let stream = ctx.default_stream();
    if case == "no-context" {
        // Comm::from_rank on a new thread, where no context is current.
        // NCCL keeps its last error per thread: report it from that thread.
        std::thread::scope(|s| {
            s.spawn(|| {
                Comm::from_rank(stream.clone(), rank, world, id)
                    .map(std::mem::forget)
                    .unwrap_or_else(|e| fail(e))
            });
        });
        println!("ok: joined with no context current");
        return;
    }
    if case == "host-memory" {
        // A host pointer where NCCL needs device memory (through cudarc's raw API, which
        // hands out the communicator).
        let mut raw = std::mem::MaybeUninit::uninit();
        let sys_id = sys::ncclUniqueId {
            internal: *id.internal(),
        };
        unsafe { result::comm_init_rank(raw.as_mut_ptr(), world as i32, sys_id, rank as i32) }
            .unwrap_or_else(|e| fail(e));
        let host = [1.0f32; 4];
        let (ptr, raw) = (host.as_ptr(), unsafe { raw.assume_init() });
        let dtype = sys::ncclDataType_t::ncclFloat32;
        unsafe {
            result::all_reduce(
                ptr.cast(),
                ptr as *mut _,
                4,
                dtype,
                sys::ncclRedOp_t::ncclSum,
                raw,
                std::ptr::null_mut(),
            )
        }
        .unwrap_or_else(|e| fail(e));
        println!("ok: reduced host memory");
        return;
    }
    let comm = match case {
        // Rank 1 believes the world is one rank larger.
        "world-mismatch" => Comm::from_rank(stream.clone(), rank, world + rank.min(1), id),
        // Every rank claims to be rank 0.
        "same-rank" => Comm::from_rank(stream.clone(), 0, world, id),
        _ => Comm::from_rank(stream.clone(), rank, world, id),
    }
    .unwrap_or_else(|e| fail(e));
    let count = if case == "count-mismatch" { 4 + rank } else { 4 };
    let mut buf = stream.clone_htod(&vec![(rank + 1) as f32; count]).unwrap();
    let done = match case {
        "root-mismatch" => comm.broadcast_in_place(&mut buf, rank as i32).map(drop),
        _ => comm.all_reduce_in_place(&mut buf, &ReduceOp::Sum).map(drop),
    };
    done.unwrap_or_else(|e| fail(e));
    println!("ok {:?}", stream.clone_dtoh(&buf).unwrap());
}
