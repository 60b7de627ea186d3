//! [`Persist`]: how records, keys and state become bytes in checkpoints, and back.
//!
//! Records cross rings by move with no serialisation; only a checkpoint (state,
//! source offsets, sink transactions, in-flight records) writes them out. The encoding is
//! little-endian and fixed-width for numbers, so a value's bytes do not depend on the
//! machine's padding. Implemented for numbers, `bool`, `char`, `()`, tuples, arrays, `Option`,
//! `Vec`, `String`, `Box`, [`crate::Word`] and [`crate::WindowBounds`]; your own types get it
//! from `#[derive(weir::Persist)]`, or, for plain data, from [`persist_pod!`](crate::persist_pod).
//! Slices of numbers and of plain data (a `Vec<u64>` in list state, a window's buffered
//! `Pod` records) are written and read as one copy of their bytes
//! ([`Persist::persist_slice`]), the same bytes value-by-value encoding gives.
//!
//! ```
//! #[derive(Clone, Debug, PartialEq, weir::Persist)]
//! struct Bid { auction: u64, bidder: String, price: u64 }
//!
//! use weir::persist::{from_bytes, to_bytes};
//! let bid = Bid { auction: 1, bidder: "ann".into(), price: 2 };
//! assert_eq!(from_bytes::<Bid>(&to_bytes(&bid)).unwrap(), bid);
//! ```
//!
//! # State that evolves
//!
//! A derived struct (and each variant of a derived enum) is written as a length-prefixed frame
//! of its fields in declaration order; an enum writes its variant's index first. Between a
//! checkpoint or savepoint and the job that restores it, a type **may**:
//! - gain fields at the end marked `#[persist(default)]` (they restore as `Default::default()`
//!   from data written before them; Flink's POJO and Avro rule);
//! - gain enum variants at the end;
//! - rename fields, variants and the type itself (names are not stored).
//!
//! It **may not** remove, reorder or retype fields, insert fields before the end, reorder
//! variants, or change a tuple, array or built-in type. Such a restore is refused with an error
//! naming the job, the operator and the field that did not decode; nothing is restored halfway
//! and no output is produced from wrong state.
//!
//! ```
//! use weir::persist::{from_bytes, to_bytes};
//! #[derive(weir::Persist)]
//! struct Before { count: u64 }
//! #[derive(Debug, PartialEq, weir::Persist)]
//! struct After { count: u64, #[persist(default)] sum: u64 }
//! assert_eq!(from_bytes::<After>(&to_bytes(&Before { count: 3 })).unwrap(), After { count: 3, sum: 0 });
//!
//! #[derive(Debug, weir::Persist)]
//! struct Changed { count: u64, sum: u64 } // `sum` not marked: refused, and the error says why
//! let err = from_bytes::<Changed>(&to_bytes(&Before { count: 3 })).unwrap_err().to_string();
//! assert!(err.contains("field `sum` of Changed"), "{err}");
//! ```
//!
//! The derive refuses, at compile time, a `#[persist(default)]` field before one without it
//! (older data could not say which is missing), an unknown attribute, and unions:
//!
//! ```compile_fail
//! #[derive(weir::Persist)]
//! struct Misordered { #[persist(default)] added: u64, count: u64 }
//! ```
//!
//! ```compile_fail
//! #[derive(weir::Persist)]
//! struct Unknown { #[persist(skip)] count: u64 }
//! ```
//!
//! ```compile_fail
//! #[derive(weir::Persist)]
//! union Bits { int: u32, float: f32 }
//! ```
//!
//! A field whose type is not `Persist` is refused with the trait's message:
//!
//! ```compile_fail,E0277
//! struct Opaque;
//! #[derive(weir::Persist)]
//! struct Holder { inner: Opaque }
//! ```
//!
//! May touch: `error`.

use crate::error::{Error, Result};

/// A value that can be written to and read back from a checkpoint.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be written to a checkpoint: it does not implement `weir::Persist`",
    label = "records, keys and state must be `Persist`",
    note = "add `#[derive(weir::Persist)]` to the type's definition (and `Clone`, which records need too)",
    note = "numbers, bool, char, String, Vec, Box, Option, tuples and arrays of Persist types are Persist already"
)]
pub trait Persist: Sized {
    /// Appends the value's bytes.
    fn persist(&self, out: &mut Vec<u8>);
    /// Reads a value from the front of `input`, advancing it.
    fn restore(input: &mut &[u8]) -> Result<Self>;

    /// Appends the bytes of every value of `values`, exactly what `persist` on each in turn
    /// would. Plain data whose encoding is its memory (numbers on a little-endian machine,
    /// types made `Persist` by [`persist_pod!`](crate::persist_pod)) copies them in one go:
    /// how a `Vec` of them is written.
    #[inline]
    fn persist_slice(values: &[Self], out: &mut Vec<u8>) {
        for v in values {
            v.persist(out);
        }
    }

    /// Reads `n` values from the front of `input` onto `out`, what `n` calls of `restore`
    /// would (the bulk counterpart of [`Persist::persist_slice`]).
    #[inline]
    fn restore_many(input: &mut &[u8], n: usize, out: &mut Vec<Self>) -> Result<()> {
        out.reserve(n.min(input.len()));
        for _ in 0..n {
            out.push(Self::restore(input)?);
        }
        Ok(())
    }
}

/// Appends `values` as their bytes in memory: the bulk encoding of plain data ([`bytemuck::Pod`]
/// types), where that is the value-by-value encoding too (little-endian numbers, with no
/// padding). Hidden: what [`persist_pod!`](crate::persist_pod) expands to.
#[doc(hidden)]
#[inline]
pub fn persist_pod_slice<T: bytemuck::Pod>(values: &[T], out: &mut Vec<u8>) {
    out.extend_from_slice(bytemuck::cast_slice(values));
}

/// Reads one plain-data value written by [`persist_pod_slice`].
#[doc(hidden)]
#[inline]
pub fn restore_pod<T: bytemuck::Pod>(input: &mut &[u8]) -> Result<T> {
    Ok(bytemuck::pod_read_unaligned(take(input, std::mem::size_of::<T>())?))
}

/// Reads `n` plain-data values written by [`persist_pod_slice`] onto `out`, in one copy.
#[doc(hidden)]
#[inline]
pub fn restore_pod_many<T: bytemuck::Pod>(input: &mut &[u8], n: usize, out: &mut Vec<T>) -> Result<()> {
    let bytes = n
        .checked_mul(std::mem::size_of::<T>())
        .ok_or_else(|| Error::Corrupt(format!("{n} values are more than memory holds")))?;
    let bytes = take(input, bytes)?;
    out.reserve(n);
    let start = out.len();
    // SAFETY: `reserve` made room for `n` more values after `start`, that is `bytes.len()`
    // bytes, which the copy fills whole (the input need not be aligned for `T`: it is copied
    // as bytes). `T: Pod` makes any bytes a valid `T`, so all `n` are initialised before
    // `set_len` counts them.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.as_mut_ptr().add(start).cast::<u8>(), bytes.len());
        out.set_len(start + n);
    }
    Ok(())
}

/// Makes a plain-data type ([`bytemuck::Pod`]: `Copy`, `#[repr(C)]` or transparent, no
/// padding, every bit pattern valid) [`Persist`] as its bytes in memory, so a `Vec` of it (in
/// list state, a window's buffered records, a record's fields) is written and read in one
/// copy instead of value by value. Its encoding is the machine's (weir builds only for
/// little-endian targets' numbers to match the rest) and it cannot evolve: changing the type
/// makes older checkpoints unreadable, where `#[derive(weir::Persist)]` allows fields added
/// at the end.
///
/// ```
/// #[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
/// #[repr(C)]
/// struct Reading { sensor: u32, celsius: f32, at: u64 }
/// weir::persist_pod!(Reading);
///
/// use weir::persist::{from_bytes, to_bytes};
/// let readings = vec![Reading { sensor: 7, celsius: 21.5, at: 3 }; 1000];
/// assert_eq!(to_bytes(&readings).len(), 8 + 1000 * 16);
/// assert_eq!(from_bytes::<Vec<Reading>>(&to_bytes(&readings)).unwrap(), readings);
/// ```
#[macro_export]
macro_rules! persist_pod {
    ($($t:ty),+ $(,)?) => {$(
        impl $crate::persist::Persist for $t {
            #[inline]
            fn persist(&self, out: &mut ::std::vec::Vec<u8>) {
                $crate::persist::persist_pod_slice(::std::slice::from_ref(self), out)
            }
            #[inline]
            fn restore(input: &mut &[u8]) -> $crate::Result<Self> {
                $crate::persist::restore_pod(input)
            }
            #[inline]
            fn persist_slice(values: &[Self], out: &mut ::std::vec::Vec<u8>) {
                $crate::persist::persist_pod_slice(values, out)
            }
            #[inline]
            fn restore_many(input: &mut &[u8], n: usize, out: &mut ::std::vec::Vec<Self>) -> $crate::Result<()> {
                $crate::persist::restore_pod_many(input, n, out)
            }
        }
    )+};
}

/// Takes `n` bytes from the front of `input`, or says the data is truncated.
#[inline]
pub fn take<'a>(input: &mut &'a [u8], n: usize) -> Result<&'a [u8]> {
    if input.len() < n {
        return Err(Error::Corrupt(format!("truncated data: needed {n} bytes, {} left", input.len())));
    }
    let (head, rest) = input.split_at(n);
    *input = rest;
    Ok(head)
}

macro_rules! persist_number {
    ($($t:ty),*) => {$(
        impl Persist for $t {
            #[inline]
            fn persist(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            #[inline]
            fn restore(input: &mut &[u8]) -> Result<Self> {
                let b = take(input, std::mem::size_of::<$t>())?;
                Ok(<$t>::from_le_bytes(b.try_into().expect("exact size")))
            }
            // On a little-endian machine a number's memory is its encoding: copied in bulk.
            #[cfg(target_endian = "little")]
            #[inline]
            fn persist_slice(values: &[Self], out: &mut Vec<u8>) {
                persist_pod_slice(values, out)
            }
            #[cfg(target_endian = "little")]
            #[inline]
            fn restore_many(input: &mut &[u8], n: usize, out: &mut Vec<Self>) -> Result<()> {
                restore_pod_many(input, n, out)
            }
        }
    )*};
}
persist_number!(u8, u16, u32, u64, u128, i8, i16, i32, i64, i128, f32, f64);

impl Persist for usize {
    fn persist(&self, out: &mut Vec<u8>) {
        (*self as u64).persist(out)
    }
    fn restore(input: &mut &[u8]) -> Result<Self> {
        usize::try_from(u64::restore(input)?).map_err(|_| Error::Corrupt("usize out of range".into()))
    }
}

impl Persist for isize {
    fn persist(&self, out: &mut Vec<u8>) {
        (*self as i64).persist(out)
    }
    fn restore(input: &mut &[u8]) -> Result<Self> {
        isize::try_from(i64::restore(input)?).map_err(|_| Error::Corrupt("isize out of range".into()))
    }
}

impl Persist for bool {
    fn persist(&self, out: &mut Vec<u8>) {
        out.push(*self as u8)
    }
    fn restore(input: &mut &[u8]) -> Result<Self> {
        match take(input, 1)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(Error::Corrupt(format!("invalid bool byte {b}"))),
        }
    }
}

impl Persist for char {
    fn persist(&self, out: &mut Vec<u8>) {
        (*self as u32).persist(out)
    }
    fn restore(input: &mut &[u8]) -> Result<Self> {
        let v = u32::restore(input)?;
        char::from_u32(v).ok_or_else(|| Error::Corrupt(format!("invalid char {v:#x}")))
    }
}

impl Persist for () {
    fn persist(&self, _: &mut Vec<u8>) {}
    fn restore(_: &mut &[u8]) -> Result<Self> {
        Ok(())
    }
}

impl<T: Persist> Persist for Option<T> {
    fn persist(&self, out: &mut Vec<u8>) {
        match self {
            None => out.push(0),
            Some(v) => {
                out.push(1);
                v.persist(out);
            }
        }
    }
    fn restore(input: &mut &[u8]) -> Result<Self> {
        match take(input, 1)?[0] {
            0 => Ok(None),
            1 => Ok(Some(T::restore(input)?)),
            b => Err(Error::Corrupt(format!("invalid option tag {b}"))),
        }
    }
}

/// Upper bound on a decoded collection's length, so corrupt input cannot make a reader
/// allocate without bound (each element takes at least one byte, or is counted).
fn checked_len(input: &[u8], len: u64) -> Result<usize> {
    if len > input.len() as u64 && len > (1 << 20) {
        return Err(Error::Corrupt(format!("collection length {len} exceeds the data")));
    }
    usize::try_from(len).map_err(|_| Error::Corrupt("collection too long".into()))
}

impl<T: Persist> Persist for Vec<T> {
    fn persist(&self, out: &mut Vec<u8>) {
        (self.len() as u64).persist(out);
        T::persist_slice(self, out);
    }
    fn restore(input: &mut &[u8]) -> Result<Self> {
        let len = checked_len(input, u64::restore(input)?)?;
        let mut v = Vec::new();
        T::restore_many(input, len, &mut v)?;
        Ok(v)
    }
}

impl Persist for String {
    fn persist(&self, out: &mut Vec<u8>) {
        (self.len() as u64).persist(out);
        out.extend_from_slice(self.as_bytes());
    }
    fn restore(input: &mut &[u8]) -> Result<Self> {
        let len = checked_len(input, u64::restore(input)?)?;
        String::from_utf8(take(input, len)?.to_vec()).map_err(|_| Error::Corrupt("invalid UTF-8 in a string".into()))
    }
}

impl<T: Persist, const N: usize> Persist for [T; N] {
    fn persist(&self, out: &mut Vec<u8>) {
        T::persist_slice(self, out);
    }
    fn restore(input: &mut &[u8]) -> Result<Self> {
        let mut v = Vec::with_capacity(N);
        T::restore_many(input, N, &mut v)?;
        v.try_into().map_err(|_| Error::Corrupt("array length".into()))
    }
}

macro_rules! persist_tuple {
    ($($name:ident),+) => {
        impl<$($name: Persist),+> Persist for ($($name,)+) {
            #[allow(non_snake_case)]
            fn persist(&self, out: &mut Vec<u8>) {
                let ($($name,)+) = self;
                $($name.persist(out);)+
            }
            fn restore(input: &mut &[u8]) -> Result<Self> {
                Ok(($($name::restore(input)?,)+))
            }
        }
    };
}
persist_tuple!(A);
persist_tuple!(A, B);
persist_tuple!(A, B, C);
persist_tuple!(A, B, C, D);
persist_tuple!(A, B, C, D, E);
persist_tuple!(A, B, C, D, E, F);
persist_tuple!(A, B, C, D, E, F, G);
persist_tuple!(A, B, C, D, E, F, G, H);

impl<T: Persist> Persist for Box<T> {
    fn persist(&self, out: &mut Vec<u8>) {
        (**self).persist(out)
    }
    fn restore(input: &mut &[u8]) -> Result<Self> {
        T::restore(input).map(Box::new)
    }
}

/// As a `Vec<T>`.
impl<T: Persist> Persist for Box<[T]> {
    fn persist(&self, out: &mut Vec<u8>) {
        (self.len() as u64).persist(out);
        T::persist_slice(self, out);
    }
    fn restore(input: &mut &[u8]) -> Result<Self> {
        Vec::<T>::restore(input).map(Vec::into_boxed_slice)
    }
}

/// As a `String`.
impl Persist for Box<str> {
    fn persist(&self, out: &mut Vec<u8>) {
        (self.len() as u64).persist(out);
        out.extend_from_slice(self.as_bytes());
    }
    fn restore(input: &mut &[u8]) -> Result<Self> {
        String::restore(input).map(String::into_boxed_str)
    }
}

impl<T> Persist for std::marker::PhantomData<T> {
    fn persist(&self, _: &mut Vec<u8>) {}
    fn restore(_: &mut &[u8]) -> Result<Self> {
        Ok(std::marker::PhantomData)
    }
}

// What `#[derive(Persist)]` (the `weir-derive` crate) generates calls these; they are public
// for it, not for hand-written code.

/// Appends `v` as LEB128 (seven bits a byte, low first).
#[doc(hidden)]
#[inline]
pub fn write_varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Reads a LEB128 number; `what` names the value in errors.
#[doc(hidden)]
#[inline]
pub fn read_varint(input: &mut &[u8], what: &str) -> Result<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let Some((&b, rest)) = input.split_first() else {
            return Err(Error::Corrupt(format!("{what}: truncated data: a length or variant index is cut short")));
        };
        *input = rest;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(Error::Corrupt(format!("{what}: a length or variant index is longer than 64 bits")))
}

/// Starts a frame: reserves its length byte; returns where it is.
#[doc(hidden)]
#[inline]
pub fn begin_frame(out: &mut Vec<u8>) -> usize {
    out.push(0);
    out.len() - 1
}

/// Ends the frame begun at `at`: writes its length (moving the fields along in the rare case
/// the length needs more than one byte).
#[doc(hidden)]
#[inline]
pub fn end_frame(out: &mut Vec<u8>, at: usize) {
    let len = out.len() - at - 1;
    if len < 0x80 {
        out[at] = len as u8;
    } else {
        let mut prefix = Vec::with_capacity(10);
        write_varint(len as u64, &mut prefix);
        out.splice(at..at + 1, prefix);
    }
}

/// Takes one frame's bytes off the front of `input`.
#[doc(hidden)]
#[inline]
pub fn take_frame<'a>(input: &mut &'a [u8], what: &str) -> Result<&'a [u8]> {
    let len = read_varint(input, what)?;
    let len = usize::try_from(len).map_err(|_| Error::Corrupt(format!("{what}: frame too long")))?;
    take(input, len).map_err(|e| Error::Corrupt(format!("{what}: {}", bare(&e))))
}

/// Reads field `field` of `what` from its frame.
#[doc(hidden)]
#[inline]
pub fn field<T: Persist>(frame: &mut &[u8], what: &str, field: &str) -> Result<T> {
    T::restore(frame).map_err(|e| {
        Error::Corrupt(format!(
            "field `{field}` of {what} ({}): {}",
            std::any::type_name::<T>(),
            if frame.is_empty() && matches!(e, Error::Corrupt(ref m) if m.starts_with("truncated")) {
                "missing from the saved data (a field added since? mark it #[persist(default)] if a default will do)"
                    .to_string()
            } else {
                bare(&e)
            }
        ))
    })
}

/// Checks that a frame was read to its end.
#[doc(hidden)]
#[inline]
pub fn end_of_frame(frame: &[u8], what: &str) -> Result<()> {
    if frame.is_empty() {
        return Ok(());
    }
    Err(Error::Corrupt(format!(
        "{what}: {} bytes left after its last field (the data was written by a version of the type with more fields, or by another type)",
        frame.len()
    )))
}

/// The error for an enum variant index that `what` does not have.
#[doc(hidden)]
pub fn unknown_variant(what: &str, index: u64) -> Error {
    Error::Corrupt(format!(
        "{what} has no variant number {index} (the data was written by a version with more variants, or by another type)"
    ))
}

/// A decoding error's message without the "damaged data: " every `Corrupt` starts with.
fn bare(e: &Error) -> String {
    match e {
        Error::Corrupt(m) => m.clone(),
        other => other.to_string(),
    }
}

/// Encodes a value into a fresh vector.
pub fn to_bytes<T: Persist>(value: &T) -> Vec<u8> {
    let mut out = Vec::new();
    value.persist(&mut out);
    out
}

/// Decodes a value that must use all of `bytes`.
pub fn from_bytes<T: Persist>(mut bytes: &[u8]) -> Result<T> {
    let v = T::restore(&mut bytes)?;
    if !bytes.is_empty() {
        return Err(Error::Corrupt(format!("{} unexpected bytes after the value", bytes.len())));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    #[test]
    fn numbers_in_bulk_encode_as_one_by_one_and_corrupt_lengths_are_refused() {
        let values: Vec<u64> = (0..1000).map(|i| i * 0x0101_0101).collect();
        let mut one_by_one = Vec::new();
        (values.len() as u64).persist(&mut one_by_one);
        values.iter().for_each(|v| v.persist(&mut one_by_one));
        assert_eq!(to_bytes(&values), one_by_one, "the bulk copy is the same bytes");
        assert_eq!(from_bytes::<Vec<u64>>(&one_by_one).unwrap(), values);
        let floats = vec![1.5f32, -0.0, f32::MAX];
        assert_eq!(from_bytes::<Vec<f32>>(&to_bytes(&floats)).unwrap(), floats);
        // Read from an odd offset: the input is not aligned for the values.
        let mut odd = vec![0u8];
        odd.extend(to_bytes(&values));
        let mut input = &odd[1..];
        assert_eq!(Vec::<u64>::restore(&mut input).unwrap(), values);
        // A length past the data is refused before anything is allocated for it.
        let mut short = to_bytes(&values);
        short.truncate(100);
        assert!(from_bytes::<Vec<u64>>(&short).is_err());
        let mut huge = Vec::new();
        u64::MAX.persist(&mut huge);
        assert!(from_bytes::<Vec<u64>>(&huge).is_err());
        ((1u64 << 20) - 1).persist(&mut huge);
        assert!(from_bytes::<Vec<u128>>(&huge[8..]).is_err());
    }

    use super::*;

    type Mixed = (u64, i32, bool, char, Option<f64>, Vec<(u8, String)>, [u16; 3]);

    #[test]
    fn round_trips() {
        let v: Mixed = (7, -3, true, 'é', Some(2.5), vec![(1, "a".into()), (2, "β".into())], [1, 2, 3]);
        assert_eq!(from_bytes::<Mixed>(&to_bytes(&v)).unwrap(), v);
    }

    #[test]
    fn corrupt_input_is_an_error_not_a_panic() {
        assert!(from_bytes::<u64>(&[1, 2, 3]).is_err());
        assert!(from_bytes::<bool>(&[7]).is_err());
        assert!(from_bytes::<Vec<u64>>(&u64::MAX.to_le_bytes()).is_err());
        assert!(from_bytes::<u8>(&[1, 2]).is_err());
    }
}
