//! What flows through weir: records, timestamps, keys and the compact [`Word`] encoding.
//!
//! A record that crosses a ring is [`Record`]: any owned, [`Persist`] type, moved with no
//! serialisation. [`Word`] is a fast plain-data encoding for short words of text (see its doc);
//! `String` works as well.
//!
//! May touch: `persist`, `error`.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};

use crate::persist::{take, Persist};

/// Event time, in whatever unit the job chooses (the built-in jobs use nanoseconds or
/// milliseconds and say so). Watermarks are timestamps too.
pub type Timestamp = u64;

/// A record that can cross a ring between subtasks: any owned type (numbers, `String`,
/// `Vec<u8>`, enums with data, nested structs) that is [`Persist`], so checkpoints can store it
/// (in sink transactions and in-flight data).
///
/// Records cross rings by move: nothing is serialised or cloned on the ring path, and a `Copy`
/// type moves as its bytes, as fast as before. `Clone` is used only where a record must be
/// duplicated: a [`crate::Stream::broadcast`] edge and a stream read by more than one
/// operator. Blanket-implemented; give your own types [`Persist`] with
/// `#[derive(weir::Persist)]`.
///
/// ```
/// #[derive(Clone, Debug, PartialEq, weir::Persist)]
/// enum Event { Click { user: String }, Bytes(Vec<u8>), Tick }
///
/// let job = weir::Job::new("events");
/// let out = job
///     .generator(weir::source::Generator::new(|i, _| match i % 3 {
///         0 => Event::Click { user: format!("u{i}") },
///         1 => Event::Bytes(vec![i as u8; 3]),
///         _ => Event::Tick,
///     }).count(6))
///     .filter(|e| *e != Event::Tick)
///     .rebalance()
///     .collect();
/// job.execute(weir::RunConfig::default()).unwrap();
/// assert_eq!(out.lock().unwrap().len(), 4);
/// ```
///
/// A type without `Persist` is refused at compile time, with a message that says to derive it
/// ("`Reading` cannot be a weir record … add `#[derive(Clone, weir::Persist)]`"):
///
/// ```compile_fail,E0277
/// #[derive(Clone)]
/// struct Reading { sensor: String, value: f64 }
/// let job = weir::Job::new("readings");
/// job.generator(weir::source::Generator::new(|i, _| Reading { sensor: i.to_string(), value: 0.0 })).discard();
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a weir record: records must be `Clone + Send + Sync + 'static` and `weir::Persist`",
    label = "not a record",
    note = "add `#[derive(Clone, weir::Persist)]` to the type's definition (checkpoints store records with `Persist`)",
    note = "numbers, bool, char, String, Vec, Box, Option, tuples and arrays of records are records already"
)]
pub trait Record: Clone + Send + Sync + 'static + Persist {}
impl<T: Clone + Send + Sync + 'static + Persist> Record for T {}

/// A key for `key_by`: compared, hashed, cloned into state and persisted with it (a `String`
/// key works; a `Copy` key costs a copy).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a weir key: keys must be `Hash + Eq + Clone + Send + Sync + 'static` and `weir::Persist`",
    label = "not a key",
    note = "add `#[derive(Clone, PartialEq, Eq, Hash, weir::Persist)]` to the type's definition"
)]
pub trait Key: Hash + Eq + Clone + Send + Sync + 'static + Persist {}
impl<T: Hash + Eq + Clone + Send + Sync + 'static + Persist> Key for T {}

/// A fast, deterministic hasher for keys (the FxHash multiply-rotate family, as in
/// rustc-hash 2). Deterministic across processes, which key groups and snapshots need; not
/// DoS-resistant, which a stream processor keyed by its own data does not need.
#[derive(Default, Clone, Copy)]
pub struct KeyHasher {
    hash: u64,
}

const SEED: u64 = 0xf135_7aea_2e62_a9c5;

impl Hasher for KeyHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.write_u64(u64::from_le_bytes(c.try_into().expect("chunk of 8")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut buf = [0u8; 8];
            buf[..rest.len()].copy_from_slice(rest);
            self.write_u64(u64::from_le_bytes(buf));
        }
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.write_u64(i as u64)
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.write_u64(i as u64)
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.hash = self.hash.wrapping_add(i).wrapping_mul(SEED);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64)
    }
    #[inline]
    fn finish(&self) -> u64 {
        // NB: the multiply leaves the high bits well mixed; hash tables index by the low bits,
        // so rotate the good bits down (rustc-hash 2 does the same).
        self.hash.rotate_left(26)
    }
}

/// `BuildHasher` for [`KeyHasher`].
pub type BuildKeyHasher = BuildHasherDefault<KeyHasher>;

/// A `HashMap` keyed with [`KeyHasher`].
pub type KeyMap<K, V> = HashMap<K, V, BuildKeyHasher>;

/// Hashes a key with [`KeyHasher`].
#[inline]
pub fn hash_key<K: Hash + ?Sized>(key: &K) -> u64 {
    let mut h = KeyHasher::default();
    key.hash(&mut h);
    h.finish()
}

/// The key group of a key hash, in `0 .. max_parallelism` (Flink's unit of state
/// redistribution). The hash is mixed again (splitmix64's finaliser) so weak key hashes still
/// spread, then mapped by multiply-shift instead of a division.
#[inline]
pub fn key_group(hash: u64, max_parallelism: usize) -> usize {
    let mut z = hash;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    ((z as u128 * max_parallelism as u128) >> 64) as usize
}

/// The subtask that owns a key group, as Flink assigns them: contiguous ranges of key groups.
#[inline]
pub fn subtask_of_key_group(key_group: usize, max_parallelism: usize, parallelism: usize) -> usize {
    debug_assert!(key_group < max_parallelism);
    key_group * parallelism / max_parallelism
}

/// The key groups one subtask owns at a parallelism: what a keyed operator keeps when state
/// saved at another parallelism is redistributed.
#[derive(Clone, Copy, Debug)]
pub struct KeyScope {
    /// The subtask.
    pub subtask: usize,
    /// The operator's (new) parallelism.
    pub parallelism: usize,
    /// The number of key groups.
    pub max_parallelism: usize,
}

impl KeyScope {
    /// Whether a key with this hash belongs to the subtask.
    #[inline]
    pub fn owns(&self, key_hash: u64) -> bool {
        subtask_of_key_group(key_group(key_hash, self.max_parallelism), self.max_parallelism, self.parallelism)
            == self.subtask
    }
}

/// Bytes a [`Word`] stores inline.
pub const WORD_INLINE_BYTES: usize = 24;

/// A word of text in 32 bytes: short words inline, long words owning their text.
///
/// Words of up to [`WORD_INLINE_BYTES`] bytes (nearly all words of real text) are stored
/// inline: no allocation, and a clone is a 32-byte copy. A longer word owns its text in an
/// `Arc<str>`, freed when the last record or state entry holding it goes, so a job over
/// ever-new long words keeps flat memory (an earlier version interned them process-wide and
/// never freed them). Equality and hashing compare the text.
///
/// ```
/// use weir::Word;
/// let w = Word::new("weir");
/// assert_eq!(w.as_str(), "weir");
/// let long = "a".repeat(100);
/// assert_eq!(Word::new(&long).as_str(), long);
/// assert_eq!(Word::new(&long), Word::new(&long));
/// ```
#[repr(transparent)]
pub struct Word(WordRepr);

/// The layout is fixed (`repr(u8)`: each variant a C struct that starts with the tag) so an
/// inline word is 32 initialized bytes: tag, length, six zero bytes, then the text from offset
/// 8. Comparisons and hashing read them as four aligned 64-bit words ([`Word::inline_raw`]).
/// With the text right after the tag (offset 1), its 8-byte loads straddled the two 16-byte
/// stores a word had just been moved with; the CPU cannot forward such a load from the stores
/// and waits for them to reach the cache: word count ran at half speed with as many
/// instructions (and the compiler merges shifted aligned loads back into unaligned ones, so
/// the text itself must be aligned).
#[repr(u8)]
enum WordRepr {
    // Built as raw words by `Word::inline` (which checks it against this variant).
    #[allow(dead_code)]
    Inline {
        len: u8,
        zero: [u8; 6],
        bytes: [u8; WORD_INLINE_BYTES],
    },
    Long(std::sync::Arc<str>),
    /// A long text that lives as long as the program (a constant, or a table made once): no
    /// count to keep, so clones and drops cost nothing.
    Static(&'static str),
}

const _: () = assert!(WORD_INLINE_BYTES < u8::MAX as usize);
const _: () = assert!(std::mem::size_of::<Word>() == 32 && std::mem::align_of::<Word>() == 8);
const _: () = assert!(1 + 1 + 6 + WORD_INLINE_BYTES == 32, "an inline word fills its 32 bytes");

// Clone and equality by hand: the derived ones compare and copy the inline bytes as arrays
// (a `memcmp` call per key lookup), which cost the word count ~40% of its keyed path.
impl Clone for Word {
    #[inline(always)]
    fn clone(&self) -> Self {
        // Every variant is copied whole, as one 32-byte value: a copy field by field (which
        // the compiler made of a `match` building each variant) wrote the tag and length in
        // small stores that a 16-byte load of the copy cannot be forwarded from.
        if let WordRepr::Long(s) = &self.0 {
            // The copy below is one more owner of the text: the reference count is taken here
            // and handed to it, which is what forgetting this clone does.
            #[allow(clippy::mem_forget)]
            std::mem::forget(std::sync::Arc::clone(s));
        }
        // SAFETY: an inline or static word owns nothing, so a bitwise copy is a clone; a long
        // word's copy owns the reference count taken just above.
        unsafe { std::ptr::read(self) }
    }
}

impl PartialEq for Word {
    #[inline(always)]
    fn eq(&self, other: &Word) -> bool {
        match (&self.0, &other.0) {
            (WordRepr::Inline { .. }, WordRepr::Inline { .. }) => self.inline_raw() == other.inline_raw(),
            (WordRepr::Inline { .. }, _) | (_, WordRepr::Inline { .. }) => false,
            // A word is inline exactly when it is short: the two are different words.
            (a, b) => a.long_text() == b.long_text(),
        }
    }
}

impl Eq for Word {}

/// Hashes the text's bytes (zero-padded to whole words) and length: the same for equal words,
/// whichever way they are stored (a long word is never stored inline).
impl Hash for Word {
    #[inline]
    fn hash<H: Hasher>(&self, state: &mut H) {
        match &self.0 {
            WordRepr::Inline { .. } => {
                let [head, a, b, c] = self.inline_raw();
                // Text bytes 24-28 (none inline) with the length above them.
                hash_padded([a, b, c, ((head >> 8) & 0xff) << 32], state);
            }
            long => {
                let s = long.long_text();
                if s.len() <= HASHED_PADDED {
                    // Words that were inline when the inline text held 28 bytes hash as they
                    // did then (the hash picks key groups: a snapshot's keys must keep it).
                    let mut padded = [0u8; 32];
                    padded[..s.len()].copy_from_slice(s.as_bytes());
                    let at = |i: usize| u64::from_le_bytes(padded[i..i + 8].try_into().expect("eight bytes"));
                    hash_padded([at(0), at(8), at(16), at(24) | ((s.len() as u64) << 32)], state);
                } else {
                    state.write(s.as_bytes());
                    state.write_usize(s.len());
                }
            }
        }
    }
}

/// Words of up to this many bytes hash as their text zero-padded to 28 bytes and their length
/// (see [`hash_padded`]); longer ones as their bytes and length.
const HASHED_PADDED: usize = 28;

/// The hash of a word of at most [`HASHED_PADDED`] bytes: its zero-padded text as three 64-bit
/// words and a fourth of text bytes 24-28 with the length above them (little-endian).
#[inline(always)]
fn hash_padded<H: Hasher>(words: [u64; 4], state: &mut H) {
    for w in words {
        state.write_u64(w);
    }
}

impl WordRepr {
    /// The text of a long word (empty for an inline one).
    #[inline]
    fn long_text(&self) -> &str {
        match self {
            WordRepr::Inline { .. } => "",
            WordRepr::Long(s) => s,
            WordRepr::Static(s) => s,
        }
    }
}

impl Word {
    /// Encodes `text` (any length).
    pub fn new(text: &str) -> Word {
        if text.len() <= WORD_INLINE_BYTES {
            let mut bytes = [0u8; WORD_INLINE_BYTES];
            bytes[..text.len()].copy_from_slice(text.as_bytes());
            return Word::inline(bytes, text.len());
        }
        Self::new_long(text)
    }

    /// A word of text that lives as long as the program: no allocation, and clones and drops
    /// keep no count (a restored copy owns its text as usual).
    pub fn from_static(text: &'static str) -> Word {
        if text.len() <= WORD_INLINE_BYTES {
            return Word::new(text);
        }
        Word(WordRepr::Static(text))
    }

    /// A word of ASCII bytes (at most [`WORD_INLINE_BYTES`]: inline, no allocation; longer
    /// ones are checked and stored as usual).
    #[inline]
    pub fn from_ascii(text: &[u8]) -> Word {
        // (Bytes that are not ASCII are still memory-safe inline: `with_str` reads invalid
        // UTF-8 as U+FFFD; they are refused here so a word's text is what was given.)
        if text.len() <= WORD_INLINE_BYTES && text.iter().all(|b| b.is_ascii()) {
            let mut bytes = [0u8; WORD_INLINE_BYTES];
            bytes[..text.len()].copy_from_slice(text);
            return Word::inline(bytes, text.len());
        }
        Self::new(&String::from_utf8_lossy(text))
    }

    /// The first `len` bytes of `window` (ASCII, `len` at most [`WORD_INLINE_BYTES`]) as an
    /// inline word, without a copy of variable length: the window is copied whole and the
    /// rest masked off.
    #[inline]
    #[doc(hidden)] // for weir's own crates (weir-jobs)
    pub fn from_ascii_prefix(window: &[u8; WORD_INLINE_BYTES], len: usize) -> Word {
        debug_assert!(len <= WORD_INLINE_BYTES && window[..len].is_ascii());
        let mut bytes = *window;
        for (lane, chunk) in bytes.chunks_mut(8).enumerate() {
            let keep = len.saturating_sub(lane * 8).min(8);
            let mask = if keep == 8 { u64::MAX } else { (1u64 << (8 * keep)) - 1 };
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            let masked = (u64::from_le_bytes(word) & mask).to_le_bytes();
            chunk.copy_from_slice(&masked[..chunk.len()]);
        }
        Word::inline(bytes, len)
    }

    /// An inline word from its zero-padded bytes (the splitter's fast path).
    #[inline(always)]
    fn inline(bytes: [u8; WORD_INLINE_BYTES], len: usize) -> Word {
        debug_assert!(len <= WORD_INLINE_BYTES && bytes[len..].iter().all(|&b| b == 0));
        let at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("eight bytes"));
        // Tag 0 (`Inline`), the length, six zero bytes; then the text.
        let raw = [(len as u64) << 8, at(0), at(8), at(16)].map(u64::to_le);
        const _: () = assert!(WORD_INLINE_BYTES == 24, "the text is three 64-bit words");
        // SAFETY: these are the 32 bytes of `WordRepr::Inline { len, zero: [0; 6], bytes }`
        // (`repr(u8)`: tag 0 for the first variant, then its fields in order, no padding), and
        // a `Word` is exactly that (`repr(transparent)`, 32 bytes). Built as whole 64-bit
        // words, it is stored as such (see `WordRepr`).
        let word: Word = unsafe { std::mem::transmute(raw) };
        debug_assert!(
            matches!(&word.0, WordRepr::Inline { len: l, zero, bytes: b } if *l as usize == len && *zero == [0; 6] && *b == bytes)
        );
        word
    }

    /// An inline word's 32 bytes as four little-endian 64-bit words (see [`WordRepr`]).
    #[inline(always)]
    fn inline_raw(&self) -> [u64; 4] {
        debug_assert!(matches!(self.0, WordRepr::Inline { .. }));
        // SAFETY: `WordRepr` is `repr(u8)` (and `Word` is `repr(transparent)` over it), so its
        // `Inline` variant is laid out as a C struct of tag, length, six zero bytes and 24
        // text bytes: 32 bytes, every one initialized (the constructor sets `zero`), and this
        // is only called on that variant. `Word` is 32 bytes and 8-aligned (asserted above),
        // so it may be read as `[u64; 4]`.
        let raw = unsafe { &*(self as *const Word).cast::<[u64; 4]>() };
        raw.map(u64::from_le)
    }

    #[cold]
    #[inline(never)]
    fn new_long(text: &str) -> Word {
        Word(WordRepr::Long(text.into()))
    }

    /// The word's length in bytes.
    pub fn len(&self) -> usize {
        match &self.0 {
            WordRepr::Inline { len, .. } => *len as usize,
            WordRepr::Long(s) => s.len(),
            WordRepr::Static(s) => s.len(),
        }
    }

    /// Whether the word is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Calls `f` with the word's text.
    pub fn with_str<R>(&self, f: impl FnOnce(&str) -> R) -> R {
        match &self.0 {
            WordRepr::Inline { bytes, len, .. } => {
                // The bytes came from a `&str` cut at char boundaries.
                f(std::str::from_utf8(&bytes[..*len as usize]).unwrap_or("\u{FFFD}"))
            }
            WordRepr::Long(s) => f(s),
            WordRepr::Static(s) => f(s),
        }
    }

    /// Appends the word's text (UTF-8) to `out`. An inline word is copied as its whole fixed
    /// buffer, then cut back (a copy of known size needs no `memmove` call).
    #[inline]
    pub fn write_to(&self, out: &mut Vec<u8>) {
        match &self.0 {
            WordRepr::Inline { bytes, len, .. } => {
                let start = out.len();
                out.extend_from_slice(bytes);
                out.truncate(start + *len as usize);
            }
            WordRepr::Long(s) => out.extend_from_slice(s.as_bytes()),
            WordRepr::Static(s) => out.extend_from_slice(s.as_bytes()),
        }
    }

    /// The word's text, as an owned string.
    pub fn as_str(&self) -> String {
        self.with_str(str::to_owned)
    }
}

/// A word persists as its length and full text.
impl Persist for Word {
    fn persist(&self, out: &mut Vec<u8>) {
        (self.len() as u32).persist(out);
        self.write_to(out);
    }
    fn restore(input: &mut &[u8]) -> crate::Result<Self> {
        let len = u32::restore(input)? as usize;
        let bytes = take(input, len)?;
        let text = std::str::from_utf8(bytes).map_err(|_| crate::Error::Corrupt("a word is not UTF-8".into()))?;
        Ok(Word::new(text))
    }
}

impl std::fmt::Debug for Word {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.with_str(|s| write!(f, "Word({s:?})"))
    }
}

impl std::fmt::Display for Word {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.with_str(|s| f.write_str(s))
    }
}

/// Calls `f` for every word of `line`: maximal runs of `char::is_alphanumeric`, lowercased
/// with `str::to_lowercase`. ASCII words take a fast path that lowercases into a stack buffer.
///
/// ```
/// let mut words = Vec::new();
/// weir::for_each_word("Ünïcode, WORDS—and 42x!", |w| words.push(w.as_str()));
/// assert_eq!(words, ["ünïcode", "words", "and", "42x"]);
/// ```
pub fn for_each_word(line: &str, f: impl FnMut(Word)) {
    for_each_word_in_bytes(line.as_bytes(), f)
}

/// The character starting at `bytes[i]` (not ASCII) and its length, or `None` where the bytes
/// there are not valid UTF-8 (they read as U+FFFD, which is not alphanumeric).
#[inline]
fn char_at(bytes: &[u8], i: usize) -> Option<(char, usize)> {
    let width = match bytes[i] {
        0xC2..=0xDF => 2,
        0xE0..=0xEF => 3,
        0xF0..=0xF4 => 4,
        _ => return None,
    };
    let s = std::str::from_utf8(bytes.get(i..i + width)?).ok()?;
    s.chars().next().map(|c| (c, width))
}

const LOW_BITS: u64 = 0x0101_0101_0101_0101;
const HIGH_BITS: u64 = 0x8080_8080_8080_8080;

/// The eight bytes at `bytes[i..]` as a little-endian word (byte `i` lowest), if there are eight.
#[inline(always)]
fn load8(bytes: &[u8], i: usize) -> Option<u64> {
    bytes.get(i..i + 8).map(|b| u64::from_le_bytes(b.try_into().expect("eight bytes")))
}

/// Per byte of `x`, the high bit set where the byte is `lo..=hi`; `x`'s bytes must be below
/// 0x80 (so no sum carries into the next byte).
#[inline(always)]
fn bytes_in_range(x: u64, lo: u8, hi: u8) -> u64 {
    let at_least_lo = x.wrapping_add(LOW_BITS * u64::from(0x80 - lo));
    let above_hi = x.wrapping_add(LOW_BITS * u64::from(0x7f - hi));
    at_least_lo & !above_hi & HIGH_BITS
}

/// Per byte of `x`: (high bit set where it is an ASCII letter or digit, high bit set where it
/// is an ASCII letter). Bytes of 0x80 and above are neither.
#[inline(always)]
fn ascii_alnum(x: u64) -> (u64, u64) {
    let seven = x & !HIGH_BITS;
    let letters = bytes_in_range(seven | (LOW_BITS * 0x20), b'a', b'z') & !x;
    let digits = bytes_in_range(seven, b'0', b'9') & !x;
    (letters | digits, letters)
}

/// Takes the ASCII word starting at `bytes[start]` (a letter or digit) eight bytes at a time,
/// lowercased, and hands it to `f`; returns where it ends. `None` (nothing handed) when the
/// word is longer than [`WORD_INLINE_BYTES`], may continue with a non-ASCII character, or runs
/// into the last seven bytes: the byte-wise path takes those.
#[inline(always)]
fn ascii_word(bytes: &[u8], start: usize, f: &mut impl FnMut(Word)) -> Option<usize> {
    let mut buf = [0u8; WORD_INLINE_BYTES + 8];
    let (mut len, mut i) = (0, start);
    loop {
        let x = load8(bytes, i)?;
        let (alnum, letters) = ascii_alnum(x);
        let run = (!alnum & HIGH_BITS).trailing_zeros() as usize / 8;
        if len + run > WORD_INLINE_BYTES {
            return None;
        }
        // Setting 0x20 lowercases a letter. Bytes past the run are cleared here, so the
        // buffer (zeroed, written in order) holds zeros after the word without a fill.
        let lower = x | (letters >> 2);
        let kept = if run < 8 { lower & ((1u64 << (run * 8)) - 1) } else { lower };
        buf[len..len + 8].copy_from_slice(&kept.to_le_bytes());
        len += run;
        i += run;
        if run < 8 {
            if bytes[i] >= 0x80 {
                return None;
            }
            let mut inline = [0u8; WORD_INLINE_BYTES];
            inline.copy_from_slice(&buf[..WORD_INLINE_BYTES]);
            f(Word::inline(inline, len));
            return Some(i);
        }
    }
}

/// [`for_each_word`] over bytes that may not be valid UTF-8, without checking them first:
/// the same words as over `String::from_utf8_lossy(bytes)` (an invalid sequence separates
/// words, as the U+FFFD it would become does).
pub fn for_each_word_in_bytes(bytes: &[u8], mut f: impl FnMut(Word)) {
    let mut i = 0;
    while i < bytes.len() {
        // Eight bytes at a time while they are ASCII: skip separators, take a whole word.
        if let Some(x) = load8(bytes, i) {
            if x & HIGH_BITS == 0 {
                let (alnum, _) = ascii_alnum(x);
                if alnum == 0 {
                    i += 8;
                    continue;
                }
                i += alnum.trailing_zeros() as usize / 8;
                if let Some(end) = ascii_word(bytes, i, &mut f) {
                    i = end;
                    continue;
                }
                // Not a short ASCII word (or too near the end): the byte-wise path takes it.
            }
        }
        // Skip separators.
        let b = bytes[i];
        if b.is_ascii() {
            if !b.is_ascii_alphanumeric() {
                i += 1;
                continue;
            }
        } else {
            match char_at(bytes, i) {
                Some((c, _)) if c.is_alphanumeric() => {}
                Some((_, n)) => {
                    i += n;
                    continue;
                }
                None => {
                    i += 1;
                    continue;
                }
            }
        }
        // A word starts at i; find its end and whether it is pure ASCII.
        let start = i;
        let mut ascii = true;
        while i < bytes.len() {
            let b = bytes[i];
            if b.is_ascii() {
                if !b.is_ascii_alphanumeric() {
                    break;
                }
                i += 1;
            } else {
                match char_at(bytes, i) {
                    Some((c, n)) if c.is_alphanumeric() => {
                        ascii = false;
                        i += n;
                    }
                    _ => break,
                }
            }
        }
        let word = &bytes[start..i];
        if ascii && word.len() <= WORD_INLINE_BYTES {
            let mut buf = [0u8; WORD_INLINE_BYTES];
            for (d, s) in buf.iter_mut().zip(word) {
                *d = s.to_ascii_lowercase();
            }
            f(Word::inline(buf, word.len()));
        } else {
            // Only whole valid characters were taken into the word.
            let text = std::str::from_utf8(word).expect("a word is made of valid characters");
            f(Word::new(&text.to_lowercase()));
        }
    }
}

/// The calendar date of day `days` after 1970-01-01 (proleptic Gregorian; Howard Hinnant's
/// days-to-civil).
#[doc(hidden)] // for weir's own crates (weir-jobs)
pub fn civil_date(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + u64::from(m <= 2), m, d)
}

/// A time given in nanoseconds since the Unix epoch, as `YYYY-MM-DD HH:MM:SS UTC` (for
/// messages); "an unknown time" for 0.
pub(crate) fn utc_text(unix_ns: u64) -> String {
    if unix_ns == 0 {
        return "at an unknown time".into();
    }
    let secs = unix_ns / 1_000_000_000;
    let (y, m, d) = civil_date(secs / 86_400);
    let t = secs % 86_400;
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC", t / 3600, t / 60 % 60, t % 60)
}

// Their fields are closures, shared internals or whole state: a name says enough.
crate::debug_as_name!([] KeyHasher);

#[cfg(test)]
mod tests {
    #[test]
    fn static_and_ascii_prefix_words_equal_and_hash_as_the_same_text() {
        let long = "https://www.nexmark.com/abcde/fghij/klmno/item.htm?query=1";
        let (a, b) = (Word::from_static(long), Word::new(long));
        assert_eq!(a, b);
        assert_eq!(hash_key(&a), hash_key(&b));
        assert_eq!(a.clone().as_str(), long);
        let mut encoded = Vec::new();
        a.persist(&mut encoded);
        assert_eq!(crate::persist::from_bytes::<Word>(&encoded).unwrap(), b, "restores as an owned word");
        let window: [u8; WORD_INLINE_BYTES] = *b"abcdefghijklmnopqrstuvwx";
        for len in 0..=WORD_INLINE_BYTES {
            let w = Word::from_ascii_prefix(&window, len);
            assert_eq!(w, Word::new(std::str::from_utf8(&window[..len]).unwrap()), "length {len}");
        }
        assert_eq!(Word::from_ascii(b"plain"), Word::new("plain"));
        assert_eq!(Word::from_ascii(&[0xff, b'a']).as_str(), "\u{FFFD}a", "not ASCII: checked as UTF-8");
    }

    use super::*;

    fn words(s: &str) -> Vec<String> {
        let mut v = Vec::new();
        for_each_word(s, |w| v.push(w.as_str()));
        v
    }

    proptest::proptest! {
        /// Over any bytes, the words are those of the lossy UTF-8 reading.
        #[test]
        fn bytes_split_like_their_lossy_text(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
                                             text in "\\PC{0,24}") {
            for input in [bytes, text.into_bytes()] {
                let mut from_bytes = Vec::new();
                for_each_word_in_bytes(&input, |w| from_bytes.push(w));
                let mut from_text = Vec::new();
                for_each_word(&String::from_utf8_lossy(&input), |w| from_text.push(w));
                proptest::prop_assert_eq!(from_bytes, from_text);
            }
        }

        /// Mostly-ASCII text (the eight-bytes-at-a-time path, words longer than the inline
        /// size, non-ASCII letters inside and after words, every byte near the end) splits as
        /// the definition says: maximal alphanumeric runs of the lossy reading, lowercased.
        #[test]
        fn text_splits_like_the_definition(text in "([a-zA-Z0-9]{0,40}[ ,.;:!?\\-_'\t@\\[`{]{0,3}(é|Ü|ß|\u{2014}|\u{80}|)){0,12}",
                                           invalid in proptest::prelude::any::<bool>()) {
            let mut input = text.into_bytes();
            if invalid && !input.is_empty() {
                let at = input.len() / 2;
                input[at] = 0xff;
            }
            let mut got = Vec::new();
            for_each_word_in_bytes(&input, |w| got.push(w.as_str()));
            let expected: Vec<String> = String::from_utf8_lossy(&input)
                .split(|c: char| !c.is_alphanumeric())
                .filter(|w| !w.is_empty())
                .map(str::to_lowercase)
                .collect();
            proptest::prop_assert_eq!(got, expected);
        }
    }

    #[test]
    fn splits_like_the_definition() {
        let samples =
            ["Hello, World! hello", "  a-b_c 9x ", "ÀÉÎ ß straße İstanbul", "", "日本語 テキスト", "x\u{FFFD}y"];
        for s in samples {
            let expected: Vec<String> =
                s.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).map(str::to_lowercase).collect();
            assert_eq!(words(s), expected, "for {s:?}");
        }
    }

    #[test]
    fn long_words_round_trip_and_compare() {
        let a = "x".repeat(40);
        let mut b = "x".repeat(39);
        b.push('y');
        assert_eq!(Word::new(&a).as_str(), a);
        assert_ne!(Word::new(&a), Word::new(&b));
        assert_eq!(Word::new(&a), Word::new(&a.clone()));
        assert_eq!(Word::new(&a).len(), 40);
        assert_eq!(std::mem::size_of::<Word>(), 32, "a word is 32 bytes");
    }

    /// A word hashes as its text zero-padded to 28 bytes, in three 64-bit and one 32-bit
    /// little-endian words with the length above the last, whatever the layout in memory: the
    /// hash picks each key's key group, so a snapshot's keys must hash as they did when it
    /// was written.
    #[test]
    fn an_inline_word_hashes_as_its_padded_text_and_length() {
        struct Words(Vec<u64>);
        impl Hasher for Words {
            fn finish(&self) -> u64 {
                0
            }
            fn write(&mut self, _: &[u8]) {
                unreachable!("inline words hash whole words")
            }
            fn write_u64(&mut self, n: u64) {
                self.0.push(n)
            }
        }
        for text in [
            "",
            "a",
            "weir",
            "exactly8",
            "twenty-four-bytes-long-w",
            "twenty-eight-bytes-long-word",
            "über",
            "abcdefghijklmnopqrstuvwxyz0",
        ] {
            let mut padded = [0u8; 32];
            padded[..text.len()].copy_from_slice(text.as_bytes());
            let at = |i: usize| u64::from_le_bytes(padded[i..i + 8].try_into().unwrap());
            let tail = u64::from(u32::from_le_bytes(padded[24..28].try_into().unwrap()));
            let expected = vec![at(0), at(8), at(16), tail | ((text.len() as u64) << 32)];
            let mut words = vec![Word::new(text), Word::from_ascii(text.as_bytes())];
            if text.is_ascii() && text.len() <= WORD_INLINE_BYTES {
                words.push(Word::from_ascii_prefix(&padded[..WORD_INLINE_BYTES].try_into().unwrap(), text.len()));
            }
            for w in words {
                let mut h = Words(Vec::new());
                w.hash(&mut h);
                assert_eq!(h.0, expected, "{text:?}");
                assert_eq!(w, w.clone());
            }
        }
        assert_ne!(Word::new("ab"), Word::new("ab\0"), "the length tells words padded alike apart");
    }

    /// Long words own their text: the last clone dropped frees it (nothing is interned).
    #[test]
    fn a_long_word_frees_its_text_with_its_last_clone() {
        let w = Word::new(&"z".repeat(64));
        let WordRepr::Long(text) = &w.0 else { panic!("a long word") };
        let weak = std::sync::Arc::downgrade(text);
        let copy = w.clone();
        drop(w);
        assert!(weak.upgrade().is_some(), "a clone still holds it");
        drop(copy);
        assert!(weak.upgrade().is_none(), "freed with the last clone");
    }

    #[test]
    fn key_groups_cover_the_range_and_map_to_subtasks() {
        let mut seen = [0usize; 128];
        for k in 0..100_000u64 {
            let g = key_group(hash_key(&k), 128);
            seen[g] += 1;
        }
        assert!(seen.iter().all(|&c| c > 500), "key groups unevenly used: {seen:?}");
        assert_eq!(subtask_of_key_group(0, 128, 3), 0);
        assert_eq!(subtask_of_key_group(127, 128, 3), 2);
    }
}
