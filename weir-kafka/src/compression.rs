//! The compression codecs of Kafka's record batches, in pure Rust: gzip (`flate2` on
//! `miniz_oxide`), snappy (`snap`, in the xerial framing Kafka's Java client writes, and raw),
//! lz4 (`lz4_flex`, the LZ4 frame format) and zstd (`ruzstd`). A batch's records section is
//! compressed whole; its header says the codec (the attributes' low three bits).
//!
//! May touch: nothing else in the crate.

use std::io::{Read, Write};

use weir::{Error, Result};

/// How a sink compresses the batches it writes (Kafka's `compression.type`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Compression {
    /// Uncompressed.
    #[default]
    None,
    /// gzip.
    Gzip,
    /// snappy (xerial framing, as Kafka's Java client writes it).
    Snappy,
    /// lz4 (the LZ4 frame format).
    Lz4,
    /// zstd (`ruzstd`'s fastest level, about zstd's level 1).
    Zstd,
}

/// The xerial snappy stream's header (magic, version 1, compatible version 1).
const XERIAL: &[u8; 16] = b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01";
/// xerial's block size.
const SNAPPY_BLOCK: usize = 32 * 1024;
/// The most a compressed batch may expand to: a corrupt or hostile batch is refused before it
/// takes the process's memory (Kafka's own fetch limit is far below).
const MAX_UNCOMPRESSED: u64 = 1 << 30;

impl std::fmt::Display for Compression {
    /// Kafka's name for it (`compression.type`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Compression {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "none" => Compression::None,
            "gzip" => Compression::Gzip,
            "snappy" => Compression::Snappy,
            "lz4" => Compression::Lz4,
            "zstd" => Compression::Zstd,
            other => {
                return Err(Error::config(format!(
                    "unknown Kafka compression '{other}': none, gzip, snappy, lz4 or zstd"
                )))
            }
        })
    }
}

impl Compression {
    /// The codec's number in a batch's attributes.
    pub fn codec(self) -> i16 {
        match self {
            Compression::None => 0,
            Compression::Gzip => 1,
            Compression::Snappy => 2,
            Compression::Lz4 => 3,
            Compression::Zstd => 4,
        }
    }

    /// The codec numbered `codec`.
    pub fn of_codec(codec: i16) -> Result<Compression> {
        Ok(match codec {
            0 => Compression::None,
            1 => Compression::Gzip,
            2 => Compression::Snappy,
            3 => Compression::Lz4,
            4 => Compression::Zstd,
            n => {
                return Err(Error::Corrupt(format!("a Kafka record batch names compression codec {n}, which is none")))
            }
        })
    }

    /// `data` compressed.
    pub fn compress(self, data: &[u8]) -> Vec<u8> {
        match self {
            Compression::None => data.to_vec(),
            Compression::Gzip => {
                let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                e.write_all(data).and_then(|_| e.finish()).expect("writing into memory does not fail")
            }
            Compression::Snappy => {
                let mut out = XERIAL.to_vec();
                let mut encoder = snap::raw::Encoder::new();
                for block in data.chunks(SNAPPY_BLOCK) {
                    let compressed = encoder.compress_vec(block).expect("a block within snappy's limit");
                    out.extend_from_slice(&(compressed.len() as u32).to_be_bytes());
                    out.extend_from_slice(&compressed);
                }
                out
            }
            Compression::Lz4 => {
                let mut e = lz4_flex::frame::FrameEncoder::new(Vec::new());
                e.write_all(data).expect("writing into memory does not fail");
                e.finish().expect("writing into memory does not fail")
            }
            Compression::Zstd => ruzstd::encoding::compress_to_vec(data, ruzstd::encoding::CompressionLevel::Fastest),
        }
    }

    /// `data` decompressed, or what is wrong with it.
    pub fn decompress(self, data: &[u8]) -> Result<Vec<u8>> {
        let damaged =
            |e: &dyn std::fmt::Display| Error::Corrupt(format!("its {} data does not decompress: {e}", self.name()));
        let mut out = Vec::new();
        match self {
            Compression::None => out.extend_from_slice(data),
            Compression::Gzip => {
                let d = flate2::read::GzDecoder::new(data).take(MAX_UNCOMPRESSED);
                read_all(d, &mut out).map_err(|e| damaged(&e))?;
            }
            Compression::Snappy => snappy(data, &mut out).map_err(|e| damaged(&e))?,
            Compression::Lz4 => {
                let d = lz4_flex::frame::FrameDecoder::new(data).take(MAX_UNCOMPRESSED);
                read_all(d, &mut out).map_err(|e| damaged(&e))?;
            }
            Compression::Zstd => {
                let d = ruzstd::decoding::StreamingDecoder::new(data).map_err(|e| damaged(&e))?;
                read_all(d.take(MAX_UNCOMPRESSED), &mut out).map_err(|e| damaged(&e))?;
            }
        }
        Ok(out)
    }

    /// Its name, as `compression.type` says it.
    pub fn name(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Gzip => "gzip",
            Compression::Snappy => "snappy",
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
        }
    }
}

fn read_all(mut r: impl Read, out: &mut Vec<u8>) -> std::io::Result<()> {
    r.read_to_end(out).map(|_| ())
}

/// Snappy in xerial's framing (blocks each after its big-endian length) or raw.
fn snappy(data: &[u8], out: &mut Vec<u8>) -> std::result::Result<(), String> {
    let mut decoder = snap::raw::Decoder::new();
    let Some(mut rest) = data.strip_prefix(&XERIAL[..8]).map(|r| r.get(8..).unwrap_or_default()) else {
        out.extend(decoder.decompress_vec(data).map_err(|e| e.to_string())?);
        return Ok(());
    };
    while !rest.is_empty() {
        let len = rest.get(..4).ok_or("a block's length is cut off")?;
        let len = u32::from_be_bytes(len.try_into().expect("4 bytes")) as usize;
        let block = rest.get(4..4 + len).ok_or("a block is cut off")?;
        out.extend(decoder.decompress_vec(block).map_err(|e| e.to_string())?);
        if out.len() as u64 > MAX_UNCOMPRESSED {
            return Err("it expands past 1 GiB".into());
        }
        rest = &rest[4 + len..];
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every codec gives back what it was given (more than one snappy block), and damage is
    /// an error, never other data.
    #[test]
    fn every_codec_round_trips_and_damage_is_refused() {
        let data: Vec<u8> = (0..100_000u32).flat_map(|i| (i % 251).to_le_bytes()).collect();
        for c in [Compression::None, Compression::Gzip, Compression::Snappy, Compression::Lz4, Compression::Zstd] {
            let packed = c.compress(&data);
            assert_eq!(Compression::of_codec(c.codec()).unwrap(), c);
            assert_eq!(c.decompress(&packed).unwrap(), data, "{c:?}");
            if c != Compression::None {
                assert!(packed.len() < data.len() / 2, "{c:?} compressed {} to {}", data.len(), packed.len());
                let cut = &packed[..packed.len() / 2];
                assert!(c.decompress(cut).is_err(), "{c:?} read a cut stream");
            }
        }
        assert!(Compression::of_codec(7).is_err());
        assert!("brotli".parse::<Compression>().unwrap_err().to_string().contains("none, gzip, snappy, lz4 or zstd"));
    }
}
