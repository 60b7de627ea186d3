//! [`Persist`]: how records, keys and state become bytes in checkpoints, and back.
//!
//! Records cross rings as plain `Copy` values with no serialisation; only a checkpoint (state,
//! source offsets, sink transactions, in-flight records) writes them out. The encoding is
//! little-endian and fixed-width for numbers, so a value's bytes do not depend on the
//! machine's padding. Implemented for numbers, `bool`, `char`, `()`, tuples, arrays, `Option`,
//! `Vec`, [`crate::Word`] and [`crate::WindowBounds`]; user structs get it from
//! [`crate::persist_struct!`].
//!
//! May touch: `error`.

use crate::error::{Error, Result};

/// A value that can be written to and read back from a checkpoint.
pub trait Persist: Sized {
    /// Appends the value's bytes.
    fn persist(&self, out: &mut Vec<u8>);
    /// Reads a value from the front of `input`, advancing it.
    fn restore(input: &mut &[u8]) -> Result<Self>;
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
        for v in self {
            v.persist(out);
        }
    }
    fn restore(input: &mut &[u8]) -> Result<Self> {
        let len = checked_len(input, u64::restore(input)?)?;
        let mut v = Vec::with_capacity(len.min(input.len()));
        for _ in 0..len {
            v.push(T::restore(input)?);
        }
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
        for v in self {
            v.persist(out);
        }
    }
    fn restore(input: &mut &[u8]) -> Result<Self> {
        let mut v = Vec::with_capacity(N);
        for _ in 0..N {
            v.push(T::restore(input)?);
        }
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

/// Implements [`Persist`] for a struct by persisting its fields in order.
///
/// ```
/// #[derive(Clone, Copy, Debug, PartialEq)]
/// struct Bid { auction: u64, price: u64 }
/// weir::persist_struct!(Bid { auction, price });
///
/// use weir::persist::Persist;
/// let mut bytes = Vec::new();
/// Bid { auction: 1, price: 2 }.persist(&mut bytes);
/// assert_eq!(Bid::restore(&mut bytes.as_slice()).unwrap(), Bid { auction: 1, price: 2 });
/// ```
#[macro_export]
macro_rules! persist_struct {
    ($t:ident { $($field:ident),* $(,)? }) => {
        impl $crate::persist::Persist for $t {
            fn persist(&self, out: &mut Vec<u8>) {
                $($crate::persist::Persist::persist(&self.$field, out);)*
            }
            fn restore(input: &mut &[u8]) -> $crate::Result<Self> {
                Ok($t { $($field: $crate::persist::Persist::restore(input)?),* })
            }
        }
    };
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
