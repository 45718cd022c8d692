//! Library-owned GPU objects (internal streams, events) behind the handles of the
//! `Device` trait: a handle's raw value is the address of a leaked `Box`, valid from
//! `leak` until `reclaim`. The GPU backends' one user of these functions is
//! `gpu::OwnedHandles`, so the argument for their soundness is made once, here.
//!
//! Why a backend may `borrow` the raw value of a handle it is given: every handle a GPU
//! backend makes is stamped with its `OwnedHandles`' *owner id* ([`next_owner_id`],
//! unique in the process and never 0), through the crate-private constructors
//! `InternalStream::owned` / `EventHandle::owned`, which only `OwnedHandles` calls and
//! only for a box it has just leaked. Safe code can make a handle only with `from_raw`, whose
//! owner is 0, so a backend that checks the owner before it borrows never dereferences
//! a forged value. The handle types are neither `Clone` nor `Copy`, and `destroy_*`
//! takes the handle by value: once its box is reclaimed, no handle naming it is left.

use std::sync::atomic::{AtomicU64, Ordering};

use super::DeviceError;

/// The next id for a device object that makes handles: unique in the process, never 0
/// (the owner of handles made with `from_raw`).
pub(crate) fn next_owner_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Turns `value` into a handle's raw value.
pub(crate) fn leak<T>(value: Box<T>) -> usize {
    Box::into_raw(value) as usize
}

/// The object behind a handle's raw value.
///
/// # Safety
/// `handle` came from [`leak`] with the same `T` and has not been passed to [`reclaim`];
/// the reference is not used after it is.
pub(crate) unsafe fn borrow<'a, T>(handle: usize) -> &'a T {
    // SAFETY: per the contract, `handle` is the address of a live Box<T>.
    unsafe { &*(handle as *const T) }
}

/// The object behind a handle that the device object with owner id `device_owner` made:
/// [`borrow`] after the owner check. The caller ties the reference to its borrow of the
/// handle.
///
/// # Errors
/// `HIP_ERROR_INVALID_HANDLE` (saying `what`) when `handle_owner` is not `device_owner`:
/// a handle of another device object, or one made with `from_raw`.
///
/// # Safety
/// The device stamps `device_owner` only on handles of a `Box<T>` it has just leaked
/// (the module's argument), and reclaims a box only by consuming its one handle; the
/// reference is not used after the caller's borrow of the handle ends.
pub(crate) unsafe fn borrow_owned<'a, T>(
    raw: usize,
    handle_owner: u64,
    device_owner: u64,
    what: &'static str,
) -> Result<&'a T, DeviceError> {
    if handle_owner != device_owner {
        return Err(DeviceError::new(DeviceError::HIP_ERROR_INVALID_HANDLE, what));
    }
    // SAFETY: the owner matches, so per the contract `raw` is a Box<T> this device leaked
    // and has not reclaimed while its handle is borrowed.
    Ok(unsafe { borrow(raw) })
}

/// Takes the object behind a handle's raw value back (the handle is dead afterwards).
///
/// # Safety
/// `handle` came from [`leak`] with the same `T` and is reclaimed once.
pub(crate) unsafe fn reclaim<T>(handle: usize) -> Box<T> {
    // SAFETY: per the contract, `handle` is the address of a Box<T> leaked once.
    unsafe { Box::from_raw(handle as *mut T) }
}

#[cfg(test)]
mod tests {
    use super::next_owner_id;
    use crate::device::{EventHandle, InternalStream};

    #[test]
    fn owner_ids_are_unique_and_never_zero() {
        let first = next_owner_id();
        let second = next_owner_id();
        assert_ne!(first, 0);
        assert_ne!(second, 0);
        assert_ne!(first, second);
    }

    #[test]
    fn handles_from_raw_have_no_owner() {
        let stream = InternalStream::from_raw(0x1000);
        assert_eq!((stream.raw(), stream.owner()), (0x1000, 0));
        let event = EventHandle::from_raw(0x2000);
        assert_eq!((event.raw(), event.owner()), (0x2000, 0));
        // An owned handle and a forged one with the same raw value are different handles.
        let owner = next_owner_id();
        assert_ne!(InternalStream::owned(0x1000, owner), stream);
        assert_ne!(EventHandle::owned(0x2000, owner), event);
        assert_eq!(InternalStream::owned(0x1000, owner).owner(), owner);
    }
}
