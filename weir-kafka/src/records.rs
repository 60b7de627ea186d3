//! Kafka's record batch format (magic 2), both ways: [`BatchWriter`] encodes the records a
//! sink produces into one batch (with the producer's identity and sequence for idempotent and
//! transactional writes), compressed as the sink is told ([`crate::Compression`]);
//! [`batches`] walks the batches a fetch returned and hands on each record as slices of the
//! response, without copying it — or, for a compressed batch, of its records decompressed.
//!
//! May touch: `compression`.

use weir::{Error, Result};

/// Attribute bit: the batch belongs to a transaction.
const TRANSACTIONAL: i16 = 1 << 4;
/// Attribute bit: the batch is a control batch (a transaction's commit or abort marker).
const CONTROL: i16 = 1 << 5;
/// The batch header's length, up to and including the record count.
const HEADER: usize = 61;
/// Where the CRC-covered part of a batch starts (the attributes).
const CRC_FROM: usize = 21;

/// One record read from a batch: slices of the fetched bytes.
#[derive(Clone, Copy, Debug)]
pub struct RecordView<'a> {
    /// Its offset in the partition.
    pub offset: i64,
    /// Its timestamp, milliseconds since the epoch.
    pub timestamp: i64,
    /// Its key, if it has one.
    pub key: Option<&'a [u8]>,
    /// Its value, if it has one (a tombstone has none).
    pub value: Option<&'a [u8]>,
}

/// What a batch is, beside its records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchInfo {
    /// Its first offset.
    pub base_offset: i64,
    /// Its last offset.
    pub last_offset: i64,
    /// The producer that wrote it (-1: none).
    pub producer_id: i64,
    /// Whether it belongs to a transaction.
    pub transactional: bool,
    /// Whether it is a control batch (a transaction marker: [`Item::Marker`] says which).
    pub control: bool,
}

/// A transaction marker's kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Marker {
    /// The producer's transaction was aborted.
    Abort,
    /// The producer's transaction was committed.
    Commit,
}

fn corrupt(what: &str) -> Error {
    Error::Corrupt(format!("a Kafka record batch from the broker is malformed: {what}"))
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.buf.len() < n {
            return Err(corrupt("it ends inside a record"));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    fn varint(&mut self) -> Result<i64> {
        let mut v: u64 = 0;
        for shift in (0..64).step_by(7) {
            let [b] = self.take(1)? else { unreachable!("take(1) is one byte") };
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                // Zigzag.
                return Ok((v >> 1) as i64 ^ -((v & 1) as i64));
            }
        }
        Err(corrupt("a varint longer than 10 bytes"))
    }

    fn bytes(&mut self) -> Result<Option<&'a [u8]>> {
        let len = self.varint()?;
        if len < 0 {
            return Ok(None);
        }
        self.take(len as usize).map(Some)
    }
}

fn be_i64(b: &[u8]) -> i64 {
    i64::from_be_bytes(b[..8].try_into().expect("8 bytes"))
}
fn be_i32(b: &[u8]) -> i32 {
    i32::from_be_bytes(b[..4].try_into().expect("4 bytes"))
}
fn be_i16(b: &[u8]) -> i16 {
    i16::from_be_bytes(b[..2].try_into().expect("2 bytes"))
}

/// What [`batches`] finds, in log order.
#[derive(Clone, Copy, Debug)]
pub enum Item<'a> {
    /// A data batch begins (answer `false` to skip its records).
    Batch(BatchInfo),
    /// One of its records.
    Record(BatchInfo, RecordView<'a>),
    /// A control batch: a transaction's marker (`None`: a control record of another kind).
    Marker(BatchInfo, Option<Marker>),
}

/// Refuses a batch of a format other than version 2, or one that fails its CRC.
fn check_batch(batch: &[u8], base_offset: i64) -> Result<()> {
    let magic = batch[16] as i8;
    if magic != 2 {
        return Err(Error::config(format!(
            "a Kafka record batch has format version {magic}: weir reads only version 2 (Kafka 0.11 and later)"
        )));
    }
    let crc = u32::from_be_bytes(batch[17..21].try_into().expect("4 bytes"));
    if crc32c::crc32c(&batch[CRC_FROM..]) != crc {
        return Err(corrupt(&format!("the batch at offset {base_offset} fails its CRC")));
    }
    Ok(())
}

/// A control batch's marker, from its record's key: version (int16), type (int16): 0 abort,
/// 1 commit.
fn marker_of(record: RecordView<'_>) -> Option<Marker> {
    match record.key.filter(|k| k.len() >= 4).map(|k| be_i16(&k[2..])) {
        Some(0) => Some(Marker::Abort),
        Some(1) => Some(Marker::Commit),
        _ => None,
    }
}

/// Walks the record batches in `data` (a fetch response's records), handing `f` each
/// [`Item`]. A batch cut off at the end of `data` (the broker fills a response up to its size
/// limit) is left out.
pub fn batches(data: &[u8], mut f: impl FnMut(Item<'_>) -> Result<bool>) -> Result<()> {
    let mut rest = data;
    while rest.len() >= 12 {
        let base_offset = be_i64(rest);
        let length = be_i32(&rest[8..]);
        if length < (HEADER - 12) as i32 {
            return Err(corrupt("a batch shorter than its header"));
        }
        let total = 12 + length as usize;
        if rest.len() < total {
            break;
        }
        let (batch, after) = rest.split_at(total);
        rest = after;
        check_batch(batch, base_offset)?;
        let attributes = be_i16(&batch[21..]);
        let codec = crate::Compression::of_codec(attributes & 0x7)?;
        let decompressed;
        let records = match codec {
            crate::Compression::None => &batch[HEADER..],
            c => {
                decompressed = c.decompress(&batch[HEADER..]).map_err(|e| match e {
                    Error::Corrupt(m) => Error::Corrupt(format!("the record batch at offset {base_offset}: {m}")),
                    e => e,
                })?;
                &decompressed[..]
            }
        };
        let info = BatchInfo {
            base_offset,
            last_offset: base_offset + i64::from(be_i32(&batch[23..])),
            producer_id: be_i64(&batch[43..]),
            transactional: attributes & TRANSACTIONAL != 0,
            control: attributes & CONTROL != 0,
        };
        let base_timestamp = be_i64(&batch[27..]);
        let count = be_i32(&batch[57..]);
        let mut r = Reader { buf: records };
        let mut first = None;
        for _ in 0..count.max(0) {
            let len = r.varint()?;
            let mut rec =
                Reader { buf: r.take(usize::try_from(len).map_err(|_| corrupt("a negative record length"))?)? };
            rec.take(1)?; // attributes
            let timestamp = base_timestamp + rec.varint()?;
            let offset = base_offset + rec.varint()?;
            let key = rec.bytes()?;
            let value = rec.bytes()?;
            let view = RecordView { offset, timestamp, key, value };
            if info.control {
                first.get_or_insert(view);
                continue;
            }
            if first.is_none() {
                first = Some(view);
                if !f(Item::Batch(info))? {
                    break;
                }
            }
            f(Item::Record(info, view))?;
        }
        if info.control {
            f(Item::Marker(info, first.and_then(marker_of)))?;
        }
    }
    Ok(())
}

/// Encodes records into one record batch.
#[derive(Debug, Default)]
pub struct BatchWriter {
    records: Vec<u8>,
    count: i32,
    first_timestamp: i64,
    max_timestamp: i64,
    compression: crate::Compression,
}

fn put_varint(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

fn varint_len(v: i64) -> usize {
    let z = ((v << 1) ^ (v >> 63)) as u64;
    (64 - z.leading_zeros() as usize).max(1).div_ceil(7)
}

impl BatchWriter {
    /// A writer whose batches are compressed with `compression`.
    pub fn compressed(compression: crate::Compression) -> BatchWriter {
        BatchWriter { compression, ..BatchWriter::default() }
    }

    /// Records so far.
    pub fn len(&self) -> usize {
        self.count as usize
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Bytes so far (about what the batch will take).
    pub fn bytes(&self) -> usize {
        self.records.len() + HEADER
    }

    /// Appends a record.
    pub fn push(&mut self, timestamp: i64, key: Option<&[u8]>, value: &[u8]) {
        if self.count == 0 {
            self.first_timestamp = timestamp;
            self.max_timestamp = timestamp;
        }
        self.max_timestamp = self.max_timestamp.max(timestamp);
        let ts_delta = timestamp - self.first_timestamp;
        let key_len = key.map_or(-1, |k| k.len() as i64);
        let body = 1
            + varint_len(ts_delta)
            + varint_len(i64::from(self.count))
            + varint_len(key_len)
            + key.map_or(0, <[u8]>::len)
            + varint_len(value.len() as i64)
            + value.len()
            + 1;
        let out = &mut self.records;
        put_varint(out, body as i64);
        out.push(0);
        put_varint(out, ts_delta);
        put_varint(out, i64::from(self.count));
        put_varint(out, key_len);
        if let Some(k) = key {
            out.extend_from_slice(k);
        }
        put_varint(out, value.len() as i64);
        out.extend_from_slice(value);
        put_varint(out, 0); // no headers
        self.count += 1;
    }

    /// The batch, written by producer `producer` (`(id, epoch, first sequence)`; `None` for a
    /// plain producer), in a transaction or not; the writer is emptied.
    pub fn finish(&mut self, producer: Option<(i64, i16, i32)>, transactional: bool) -> bytes::Bytes {
        let packed;
        let records = match self.compression {
            crate::Compression::None => &self.records,
            c => {
                packed = c.compress(&self.records);
                &packed
            }
        };
        let mut out = Vec::with_capacity(HEADER + records.len());
        let (id, epoch, seq) = producer.unwrap_or((-1, -1, -1));
        out.extend_from_slice(&0i64.to_be_bytes()); // base offset: the broker assigns it
        out.extend_from_slice(&((HEADER - 12 + records.len()) as i32).to_be_bytes());
        out.extend_from_slice(&(-1i32).to_be_bytes()); // partition leader epoch
        out.push(2); // magic
        out.extend_from_slice(&[0; 4]); // CRC, below
        let attributes: i16 = if transactional { TRANSACTIONAL } else { 0 } | self.compression.codec();
        out.extend_from_slice(&attributes.to_be_bytes());
        out.extend_from_slice(&(self.count - 1).to_be_bytes());
        out.extend_from_slice(&self.first_timestamp.to_be_bytes());
        out.extend_from_slice(&self.max_timestamp.to_be_bytes());
        out.extend_from_slice(&id.to_be_bytes());
        out.extend_from_slice(&epoch.to_be_bytes());
        out.extend_from_slice(&seq.to_be_bytes());
        out.extend_from_slice(&self.count.to_be_bytes());
        out.extend_from_slice(records);
        let crc = crc32c::crc32c(&out[CRC_FROM..]);
        out[17..21].copy_from_slice(&crc.to_be_bytes());
        self.records.clear();
        self.count = 0;
        out.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_reads_back_as_written() {
        let mut w = BatchWriter::default();
        w.push(1000, Some(b"k"), b"first");
        w.push(1007, None, &[7u8; 300]);
        let batch = w.finish(Some((42, 3, 10)), true);
        let mut seen = Vec::new();
        let mut infos = Vec::new();
        batches(&batch, |item| {
            match item {
                Item::Batch(i) => infos.push(i),
                Item::Record(_, r) => {
                    seen.push((r.offset, r.timestamp, r.key.map(<[u8]>::to_vec), r.value.map(<[u8]>::len)))
                }
                Item::Marker(..) => unreachable!("no control batch was written"),
            }
            Ok(true)
        })
        .unwrap();
        assert_eq!(seen, vec![(0, 1000, Some(b"k".to_vec()), Some(5)), (1, 1007, None, Some(300))]);
        assert_eq!(infos.len(), 1);
        assert!(infos[0].transactional && !infos[0].control && infos[0].producer_id == 42);
        assert_eq!(infos[0].last_offset, 1);
        // A flipped bit is damage, named.
        let mut bad = batch.to_vec();
        bad[70] ^= 1;
        let err = batches(&bad, |_| Ok(true)).unwrap_err().to_string();
        assert!(err.contains("fails its CRC"), "{err}");
        // A batch cut off at the end is left for the next fetch.
        let mut n = 0;
        batches(&batch[..batch.len() - 1], |_| {
            n += 1;
            Ok(true)
        })
        .unwrap();
        assert_eq!(n, 0);
    }

    #[test]
    fn varints_are_zigzag() {
        for v in [0i64, 1, -1, 63, -64, 64, 300, -300, i64::from(i32::MAX), i64::MIN, i64::MAX] {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            assert_eq!(out.len(), varint_len(v), "{v}");
            assert_eq!(Reader { buf: &out }.varint().unwrap(), v);
        }
    }
}
