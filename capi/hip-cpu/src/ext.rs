//! libhipfile's `hipfileCpu*` extension API (`capi/include/hipfile_cpu.h`), looked up
//! at run time.
//!
//! The symbols are searched first in the process's global scope (`RTLD_DEFAULT`: a
//! program linked with `-lhipfile`, or one that exports them from a static
//! `libhipfile.a` with `-rdynamic`), then in `libhipfile.so.0` loaded with `dlopen`
//! (which returns the copy already loaded, if any). Either way this library and the
//! driver share one cpu device. A missing library is an error value
//! (`hipErrorNoDevice`), printed once, never a panic.

use core::ffi::{CStr, c_int, c_void};
use std::sync::OnceLock;

/// Declares the table of extension functions and its loader.
macro_rules! ext_api {
    ($( $field:ident = $symbol:literal: fn($($arg:ty),* $(,)?); )*) => {
        /// The extension functions, as loaded.
        pub struct Ext {
            $(
                #[doc = concat!("`", stringify!($field), "`.")]
                pub $field: unsafe extern "C" fn($($arg),*) -> c_int,
            )*
        }

        impl Ext {
            /// Resolves every function with `lookup`.
            ///
            /// # Safety
            /// `lookup` returns NULL or the address of the C function named by its
            /// argument, declared in `hipfile_cpu.h` with the signature given here.
            unsafe fn load(lookup: impl Fn(&CStr) -> *mut c_void) -> Result<Ext, String> {
                Ok(Ext {
                    $(
                        $field: {
                            let symbol: &CStr = $symbol;
                            let address = lookup(symbol);
                            if address.is_null() {
                                return Err(format!("symbol {symbol:?} not found"));
                            }
                            // SAFETY: per the contract, a non-NULL address is this
                            // function, with this C signature.
                            unsafe {
                                std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) -> c_int>(address)
                            }
                        },
                    )*
                })
            }
        }
    };
}

ext_api! {
    get_device_count = c"hipfileCpuGetDeviceCount": fn(*mut c_int);
    get_device = c"hipfileCpuGetDevice": fn(*mut c_int);
    set_device = c"hipfileCpuSetDevice": fn(c_int);
    malloc = c"hipfileCpuMalloc": fn(*mut *mut c_void, usize);
    malloc_managed = c"hipfileCpuMallocManaged": fn(*mut *mut c_void, usize);
    free = c"hipfileCpuFree": fn(*mut c_void);
    host_malloc = c"hipfileCpuHostMalloc": fn(*mut *mut c_void, usize);
    host_free = c"hipfileCpuHostFree": fn(*mut c_void);
    pointer_get_info = c"hipfileCpuPointerGetInfo": fn(*const c_void, *mut PointerInfo);
    stream_create = c"hipfileCpuStreamCreate": fn(*mut *mut c_void);
    stream_destroy = c"hipfileCpuStreamDestroy": fn(*mut c_void);
    stream_synchronize = c"hipfileCpuStreamSynchronize": fn(*mut c_void);
    stream_query = c"hipfileCpuStreamQuery": fn(*mut c_void);
    stream_get_device = c"hipfileCpuStreamGetDevice": fn(*mut c_void, *mut c_int);
    device_synchronize = c"hipfileCpuDeviceSynchronize": fn();
    memcpy_async = c"hipfileCpuMemcpyAsync": fn(*mut c_void, *const c_void, usize, *mut c_void);
    memset_async = c"hipfileCpuMemsetAsync": fn(*mut c_void, c_int, usize, *mut c_void);
    launch_host_func = c"hipfileCpuLaunchHostFunc": fn(*mut c_void, Option<HostFn>, *mut c_void);
    stream_wait_value32 = c"hipfileCpuStreamWaitValue32": fn(*mut c_void, *mut c_void, u32);
    stream_write_value32 = c"hipfileCpuStreamWriteValue32": fn(*mut c_void, *mut c_void, u32);
    store_value32 = c"hipfileCpuStoreValue32": fn(*mut c_void, u32);
    event_record = c"hipfileCpuEventRecord": fn(*mut c_void, *mut u64);
    event_query = c"hipfileCpuEventQuery": fn(u64);
    event_synchronize = c"hipfileCpuEventSynchronize": fn(u64);
    event_destroy = c"hipfileCpuEventDestroy": fn(u64);
}

/// A host function (`hipHostFn_t`).
pub type HostFn = unsafe extern "C" fn(*mut c_void);

/// `hipfileCpuPointerInfo_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PointerInfo {
    /// `hipfileCpuMemoryType_t`: see [`memory`].
    pub memory_type: c_int,
    /// Owning device.
    pub device: c_int,
    /// Allocation base (NULL when unregistered).
    pub base: *mut c_void,
    /// Allocation length (0 when unregistered).
    pub size: usize,
}

/// `hipfileCpuMemoryType_t` values.
pub mod memory {
    use core::ffi::c_int;
    /// Not memory of the cpu device.
    pub const UNREGISTERED: c_int = 0;
    /// Pinned host memory.
    pub const HOST: c_int = 1;
    /// Device memory.
    pub const DEVICE: c_int = 2;
    /// Managed memory.
    pub const MANAGED: c_int = 3;
    /// Array memory.
    pub const ARRAY: c_int = 10;
}

const _: () = assert!(size_of::<PointerInfo>() == 24 && align_of::<PointerInfo>() == 8);

/// The extension API, loaded on first use; `None` (reason printed once) when libhipfile
/// cannot be found.
pub fn ext() -> Option<&'static Ext> {
    static EXT: OnceLock<Option<Ext>> = OnceLock::new();
    EXT.get_or_init(|| match load() {
        Ok(ext) => Some(ext),
        Err(reason) => {
            eprintln!("libhipfile_hip_cpu: cannot use libhipfile's cpu device: {reason}");
            None
        }
    })
    .as_ref()
}

fn load() -> Result<Ext, String> {
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name has no precondition.
    let global = |name: &CStr| unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    if !global(c"hipfileCpuMalloc").is_null() {
        // SAFETY: the symbols are libhipfile's exports, declared in hipfile_cpu.h with
        // the signatures of the table.
        return unsafe { Ext::load(global) };
    }
    let mut handle = core::ptr::null_mut();
    for name in [c"libhipfile.so.0", c"libhipfile.so"] {
        // SAFETY: dlopen with a NUL-terminated name and valid flags.
        handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        if !handle.is_null() {
            break;
        }
    }
    if handle.is_null() {
        return Err("libhipfile.so.0 is not loaded and dlopen cannot find it".into());
    }
    // SAFETY: `handle` is a live dlopen handle (never closed); dlsym has no other
    // precondition.
    let in_library = |name: &CStr| unsafe { libc::dlsym(handle, name.as_ptr()) };
    // SAFETY: as above: libhipfile's exports.
    unsafe { Ext::load(in_library) }
}
