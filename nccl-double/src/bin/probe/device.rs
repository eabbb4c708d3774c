//! The ops of one process and no job: what the driver and NCCL say (`info`, `devices`,
//! `present`) and the driver alone (`driver`).

use crate::args::Args;
use crate::ffi::{Fail, cuda, nccl};
use crate::values::show;
use cudarc::driver::sys as cu;
use cudarc::driver::{CudaContext, CudaSlice};
use cudarc::nccl::{result, sys};
use std::ffi::{CStr, c_char};

/// Device count, NCCL's version and every device's name.
pub fn info() -> Result<String, Fail> {
    let n = CudaContext::device_count().map_err(cuda("CudaContext::device_count"))?;
    let version = result::get_nccl_version().map_err(nccl("ncclGetVersion"))?;
    let mut driver = 0;
    // SAFETY: a plain C call with a valid pointer.
    unsafe { cu::cuDriverGetVersion(&mut driver) }
        .result()
        .map_err(cuda("cuDriverGetVersion"))?;
    let mut names = Vec::new();
    for d in 0..n as usize {
        names.push(CudaContext::new(d)?.name()?);
    }
    Ok(format!(
        "devices={n} nccl_version={version} driver_version={driver} names={}",
        names.join(";")
    ))
}

/// The devices as the driver shows them: what cuInit says, what cuDeviceGetCount says
/// then, and each device's bus id, UUID (both entry points) and name; also that a bus id
/// buffer one byte too short is refused.
pub fn devices() -> Result<Vec<String>, Fail> {
    // SAFETY: a plain C call.
    let init = unsafe { cu::cuInit(0) };
    let mut n = 0;
    // SAFETY: a plain C call with a valid pointer.
    let counted = unsafe { cu::cuDeviceGetCount(&mut n) };
    let count = if counted == cu::CUresult::CUDA_SUCCESS {
        n.to_string()
    } else {
        format!("{counted:?}")
    };
    let mut lines = vec![format!("init={init:?} count={count}")];
    if init != cu::CUresult::CUDA_SUCCESS {
        return Ok(lines);
    }
    for i in 0..n {
        let dev = cudarc::driver::result::device::get(i)?;
        let name = cudarc::driver::result::device::get_name(dev)?;
        let mut bus = [0 as c_char; 32];
        // SAFETY: the buffer holds the length given.
        unsafe { cu::cuDeviceGetPCIBusId(bus.as_mut_ptr(), bus.len() as i32, dev) }
            .result()
            .map_err(cuda("cuDeviceGetPCIBusId"))?;
        // SAFETY: NUL-terminated by the driver.
        let bus = unsafe { CStr::from_ptr(bus.as_ptr()) }.to_string_lossy().into_owned();
        let mut short = [0 as c_char; 32];
        // SAFETY: as above, with a length one short of the id and its NUL.
        let short = unsafe { cu::cuDeviceGetPCIBusId(short.as_mut_ptr(), bus.len() as i32, dev) };
        let uuid = cudarc::driver::result::device::get_uuid(dev)?;
        let mut v2 = std::mem::MaybeUninit::<cu::CUuuid>::uninit();
        // SAFETY: a plain C call with a valid pointer.
        unsafe { cu::cuDeviceGetUuid_v2(v2.as_mut_ptr(), dev) }
            .result()
            .map_err(cuda("cuDeviceGetUuid_v2"))?;
        // SAFETY: written by the successful call.
        let v2 = unsafe { v2.assume_init() };
        let hex: String = uuid.bytes.iter().map(|b| format!("{:02x}", *b as u8)).collect();
        let text = format!(
            "GPU-{}-{}-{}-{}-{}",
            &hex[..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..]
        );
        lines.push(format!(
            "device={i} bus={bus} uuid={text} uuid_v2_same={} short_bus_buffer={short:?} name={name}",
            v2.bytes == uuid.bytes
        ));
    }
    Ok(lines)
}

/// Whether cudarc finds a CUDA driver and an NCCL library to load.
pub fn present() -> String {
    // SAFETY: these only try to load the libraries.
    let (cuda, nccl) = unsafe { (cu::is_culib_present(), sys::is_culib_present()) };
    format!("cuda_present={cuda} nccl_present={nccl}")
}

/// The driver alone: a second stream, copies both ways, fresh memory, and two misuses.
pub fn driver(a: &Args) -> Result<String, Fail> {
    let ctx = CudaContext::new(a.device.unwrap_or(0))?;
    if a.brk.as_deref() == Some("free-without-context") {
        // With the default stream only, as the workbook uses cudarc (once a context has
        // other streams, cudarc binds it before a free, to wait for the buffer's events).
        let doomed = ctx.default_stream().clone_htod(&[1f32, 2.0, 3.0, 4.0])?;
        // Dropped on a thread where no context is current: the free fails quietly.
        std::thread::spawn(move || drop(doomed))
            .join()
            .map_err(|_| Fail("drop thread panicked".into()))?;
        ctx.name()
            .map_err(cuda("ctx.name() after a buffer was dropped on another thread"))?;
    }
    let stream = ctx.new_stream()?;
    let input: Vec<f32> = (0..a.count).map(|i| i as f32 + 0.5).collect();
    let mut dev = stream.alloc_zeros::<f32>(a.count)?;
    let zeros = stream.clone_dtoh(&dev)?;
    stream.memcpy_htod(&input, &mut dev)?;
    let mut back = vec![0f32; a.count];
    stream.memcpy_dtoh(&dev, &mut back)?;
    stream.synchronize()?;
    // SAFETY: read back only to show that fresh device memory is not zeroed.
    let fresh: CudaSlice<f32> = unsafe { stream.alloc(a.count) }?;
    let fresh = stream.clone_dtoh(&fresh)?;
    match a.brk.as_deref() {
        Some("dtoh-host-pointer") => {
            let host = vec![0f32; a.count];
            // SAFETY: on purpose: a host address where a device pointer belongs.
            let fake: CudaSlice<f32> = unsafe { stream.upgrade_device_ptr(host.as_ptr() as u64, a.count) };
            let r = stream.clone_dtoh(&fake);
            fake.leak();
            r.map_err(cuda("clone_dtoh from a host pointer"))?;
        }
        Some("free-without-context") | None => {}
        Some(other) => return Err(Fail(format!("--break {other} is not for --op driver"))),
    }
    Ok(format!(
        "zeros={} roundtrip={} fresh_is_nan={} name={}",
        show(&zeros),
        show(&back),
        fresh.iter().all(|x| x.is_nan()),
        ctx.name()?
    ))
}
