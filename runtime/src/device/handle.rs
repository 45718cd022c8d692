//! Library-owned GPU objects (internal streams, events) behind the integer handles of
//! the `Device` trait: a handle is the address of a leaked `Box`, valid from `leak` until
//! `reclaim`. The GPU backends share these three functions, so the argument for their
//! soundness is made once, here.

/// Turns `value` into a handle.
pub(crate) fn leak<T>(value: Box<T>) -> usize {
    Box::into_raw(value) as usize
}

/// The object behind a handle.
///
/// # Safety
/// `handle` came from [`leak`] with the same `T` and has not been passed to [`reclaim`];
/// the reference is not used after it is.
pub(crate) unsafe fn borrow<'a, T>(handle: usize) -> &'a T {
    // SAFETY: per the contract, `handle` is the address of a live Box<T>.
    unsafe { &*(handle as *const T) }
}

/// Takes the object behind a handle back (the handle is dead afterwards).
///
/// # Safety
/// `handle` came from [`leak`] with the same `T` and is reclaimed once.
pub(crate) unsafe fn reclaim<T>(handle: usize) -> Box<T> {
    // SAFETY: per the contract, `handle` is the address of a Box<T> leaked once.
    unsafe { Box::from_raw(handle as *mut T) }
}
