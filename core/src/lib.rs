//! hipfile-core (being written).
#![no_std]
