//! Nexmark: the online-auction benchmark of Tucker et al. (NEXMark, 2002) as Apache Beam and
//! the Flink Nexmark suite generate it, with queries q0–q22 as
//! weir jobs and as plain sequential functions that the tests (and `weir nexmark --check`)
//! compare them with.
//!
//! The generator follows the standard parameters: out of every 50 events, 1 person, 3
//! auctions and 46 bids; 1,000 active people and 100 auctions in flight; half the bids go to
//! hot auctions (every 100th id) and a quarter to hot bidders, a quarter of the auctions to hot
//! sellers; prices are log-uniform from $1 to $1,000,000 (in cents); event time advances 100 µs
//! per event (a first event rate of 10,000/s). Event `n` depends only on `n`, so a run can be
//! replayed and split over subtasks. The text fields of the standard generator are there
//! (names, e-mails, credit cards, cities and states; item names and descriptions; channels,
//! URLs; padding), drawn from the event's number when a query reads them (methods of
//! [`Person`], [`Auction`] and [`Bid`]): short ones inline in a [`Word`], channel URLs made
//! once per process and shared, as the standard generator caches them.
//!
//! May touch: `error`, `operator`, `persist`, `pipeline`, `prng`, `record`, `runtime`,
//! `sink` (to read back what q10 wrote), `source`, `state`.

use std::collections::HashMap;

use weir::operator::window::{Window, WindowBounds};
use weir::pipeline::Job;
use weir::prng::mix;
use weir::record::{hash_key, Word};
use weir::source::Generator;

/// Event time between two events, in microseconds (10,000 events/s).
pub const INTER_EVENT_US: u64 = 100;
const PERSON_PROPORTION: u64 = 1;
const AUCTION_PROPORTION: u64 = 3;
const TOTAL_PROPORTION: u64 = 50;
const ACTIVE_PEOPLE: u64 = 1_000;
const IN_FLIGHT_AUCTIONS: u64 = 100;
const HOT_AUCTION_RATIO: u64 = 2;
const HOT_BIDDER_RATIO: u64 = 4;
const HOT_SELLER_RATIO: u64 = 4;
/// Hot ids are multiples of this.
#[doc(hidden)] // for the tests (tests/jobs.rs)
pub const HOT_ID_STEP: u64 = 100;
#[doc(hidden)] // for the tests (tests/jobs.rs)
pub const FIRST_PERSON_ID: u64 = 1_000;
#[doc(hidden)] // for the tests (tests/jobs.rs)
pub const FIRST_AUCTION_ID: u64 = 1_000;
const FIRST_CATEGORY_ID: u64 = 10;
/// q5 and q7/q8 windows: 10 s, sliding every 2 s for q5.
pub const WINDOW_MS: u64 = 10_000;
/// q5's slide.
pub const SLIDE_MS: u64 = 2_000;

const FIRST_NAMES: [&str; 8] = ["Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie"];
const LAST_NAMES: [&str; 8] = ["Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones"];

const US_STATES: [&str; 6] = ["AZ", "CA", "ID", "OR", "WA", "WY"];
const US_CITIES: [&str; 10] =
    ["Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond", "Seattle", "Kent", "Cheyenne"];
const HOT_CHANNELS: [&str; 4] = ["Google", "Facebook", "Baidu", "Apple"];
/// Channels other than the hot ones: `channel-<n>` for `n` below this.
const CHANNELS: u64 = 10_000;

/// A new user. Its text — name, e-mail address, credit card, city, state, padding — is
/// drawn from the event's number when a query reads it, as a bid's is (see [`Bid`]): the
/// standard generator's values, the same on every read.
#[derive(Clone, Debug, PartialEq, Eq, weir::Persist)]
pub struct Person {
    /// Person id.
    pub id: u64,
    /// Event time, ms.
    pub date_time: u64,
    /// The event's number in the stream, which its text is drawn from.
    pub event: u64,
}

impl Person {
    /// Full name: a first and a last name.
    pub fn name(&self) -> String {
        let r = draw(self.event, 0);
        format!("{} {}", FIRST_NAMES[(r % 8) as usize], LAST_NAMES[((r >> 8) % 8) as usize])
    }

    /// E-mail address.
    pub fn email_address(&self) -> String {
        format!("{}@{}.com", text(self.event, 1, 7), text(self.event, 2, 5))
    }

    /// Credit card number, four groups of four digits.
    pub fn credit_card(&self) -> String {
        let card = draw(self.event, 3);
        format!(
            "{:04} {:04} {:04} {:04}",
            card % 10_000,
            (card >> 16) % 10_000,
            (card >> 32) % 10_000,
            (card >> 48) % 10_000
        )
    }

    /// City.
    pub fn city(&self) -> Word {
        Word::from_static(US_CITIES[((draw(self.event, 0) >> 16) % 10) as usize])
    }

    /// US state.
    pub fn state(&self) -> Word {
        Word::from_static(US_STATES[((draw(self.event, 0) >> 24) % 6) as usize])
    }

    /// Padding text, 0 to 20 characters.
    pub fn extra(&self) -> Word {
        extra(self.event, 4)
    }
}

/// A new auction. Its text — item name, description, padding — is drawn from the event's
/// number when a query reads it, as a bid's is (see [`Bid`]).
#[derive(Clone, Debug, PartialEq, Eq, weir::Persist)]
pub struct Auction {
    /// Auction id.
    pub id: u64,
    /// Opening price, cents.
    pub initial_bid: u64,
    /// Reserve price, cents.
    pub reserve: u64,
    /// Event time, ms.
    pub date_time: u64,
    /// When the auction closes, ms.
    pub expires: u64,
    /// The seller's person id.
    pub seller: u64,
    /// Category id.
    pub category: u64,
    /// The event's number in the stream, which its text is drawn from.
    pub event: u64,
}

impl Auction {
    /// Item name, 12 letters and digits.
    pub fn item_name(&self) -> String {
        text(self.event, 6, 12)
    }

    /// Description, 40 letters and digits.
    pub fn description(&self) -> String {
        text(self.event, 7, 40)
    }

    /// Padding text, 0 to 20 characters.
    pub fn extra(&self) -> Word {
        extra(self.event, 9)
    }
}

/// A bid. Its text — the channel it came through, the page it was made on, its padding —
/// is drawn from the event's number when a query reads it ([`Bid::channel`], [`Bid::url`],
/// [`Bid::extra`]: the standard generator's values, the same on every read), as a query
/// engine materializes columns late: most queries read only the numbers, so a bid is 40
/// bytes, not 128, and its text is made only by the queries that read it (q14, q16, q21, q22).
#[derive(Clone, Debug, PartialEq, Eq, weir::Persist)]
pub struct Bid {
    /// Auction id.
    pub auction: u64,
    /// The bidder's person id.
    pub bidder: u64,
    /// Price, cents.
    pub price: u64,
    /// Event time, ms.
    pub date_time: u64,
    /// The event's number in the stream, which its text is drawn from.
    pub event: u64,
}

/// A bid's numbers only: what most queries read (they project bids onto this before the
/// first key-by, as a query engine would, so the strings never cross a ring).
#[derive(Clone, Copy, Debug, PartialEq, Eq, weir::Persist)]
pub struct BidPrice {
    /// Auction id.
    pub auction: u64,
    /// The bidder's person id.
    pub bidder: u64,
    /// Price, cents.
    pub price: u64,
    /// Event time, ms.
    pub date_time: u64,
}

impl Bid {
    /// The bid's numbers.
    pub fn numbers(&self) -> BidPrice {
        BidPrice { auction: self.auction, bidder: self.bidder, price: self.price, date_time: self.date_time }
    }

    /// The channel the bid came through: half the bids one of the hot channels, the rest one
    /// of many.
    pub fn channel(&self) -> Word {
        channel(bid_channel(self.event)).0.clone()
    }

    /// The page it was made on (the channel's URL).
    pub fn url(&self) -> Word {
        channel(bid_channel(self.event)).1.clone()
    }

    /// Padding text, 0 to 20 characters.
    pub fn extra(&self) -> Word {
        extra(self.event, 10)
    }
}

/// The channel of bid event `n`. (Chosen without a branch: a coin flip per bid mispredicts
/// half the time.)
#[inline]
fn bid_channel(n: u64) -> u64 {
    let c = draw(n, 9);
    let hot = u64::from(c.is_multiple_of(2));
    hot * (CHANNELS + (c >> 8) % HOT_CHANNELS.len() as u64) + (1 - hot) * ((c >> 8) % CHANNELS)
}

/// One Nexmark event.
#[derive(Clone, Debug, PartialEq, Eq, weir::Persist)]
pub enum Event {
    /// A new user (boxed: people are one event in fifty, and the largest).
    Person(Box<Person>),
    /// A new auction (boxed, as people are: auctions are three events in fifty, and larger
    /// than a bid, so the event stays the size of a bid).
    Auction(Box<Auction>),
    /// A bid.
    Bid(Bid),
}

impl Event {
    /// Event time, ms.
    pub fn date_time(&self) -> u64 {
        match self {
            Event::Person(p) => p.date_time,
            Event::Auction(a) => a.date_time,
            Event::Bid(b) => b.date_time,
        }
    }
}

/// Random numbers for event `n`: the `k`-th draw.
fn draw(n: u64, k: u64) -> u64 {
    mix(n.wrapping_mul(8).wrapping_add(k))
}

/// People that exist at event `n` of an epoch after its person (every auction and bid):
/// one per epoch so far, this one included.
#[doc(hidden)] // for the tests (tests/jobs.rs)
pub fn people_before(n: u64) -> u64 {
    (n / TOTAL_PROPORTION + 1) * PERSON_PROPORTION
}

/// Auctions that exist at a bid `n` (bids come after the epoch's auctions).
#[doc(hidden)] // for the tests (tests/jobs.rs)
pub fn auctions_before(n: u64) -> u64 {
    (n / TOTAL_PROPORTION + 1) * AUCTION_PROPORTION
}

/// A recent id among `count` created so far: hot (a multiple of 100) one time in `ratio`.
fn pick(count: u64, recent: u64, ratio: u64, r: u64) -> u64 {
    let last = count - 1;
    if r.is_multiple_of(ratio) {
        // Hot: the newest multiple of the step.
        last / HOT_ID_STEP * HOT_ID_STEP
    } else if count >= recent {
        // Past the first few epochs, always: a remainder by the constant `recent` is a
        // multiplication, where one by `count` was a division (two per bid).
        last - (r >> 8) % recent
    } else {
        last - (r >> 8) % count
    }
}

/// Log-uniform price from $1 to $1,000,000, in cents: 10^(6u) dollars for a uniform u. Taken
/// as 2^y with y = 6u·log2(10): the whole part goes into the exponent bits, the fraction's top
/// eight bits index [`EXP2_TABLE`] and the rest (below 1/256) is a cubic, relative error under
/// 1e-11 (a cent at most on the largest price). `exp` was a sixth of making a bid.
#[inline]
#[doc(hidden)] // for the tests (tests/jobs.rs)
pub fn price(r: u64) -> u64 {
    let unit = (r >> 11) as f64 / (1u64 << 53) as f64;
    let y = unit * 6.0 * std::f64::consts::LOG2_10;
    let scaled = y * 256.0;
    let step = scaled as u64;
    let t = (scaled - step as f64) * (std::f64::consts::LN_2 / 256.0);
    let whole = f64::from_bits((1023 + (step >> 8)) << 52);
    let dollars = whole * EXP2_TABLE[(step & 255) as usize] * (1.0 + t * (1.0 + t * (0.5 + t / 6.0)));
    (dollars * 100.0 + 0.5) as u64
}

/// 2^(k/256) for k in 0..256, made at compile time from the exponential's series.
const EXP2_TABLE: [f64; 256] = {
    let mut table = [0.0; 256];
    let mut k = 0;
    while k < 256 {
        let x = k as f64 / 256.0 * std::f64::consts::LN_2;
        let (mut sum, mut term, mut i) = (1.0, 1.0, 1);
        while i < 30 {
            term = term * x / i as f64;
            sum += term;
            i += 1;
        }
        table[k] = sum;
        k += 1;
    }
    table
};

/// Fills `out` with letters, digits, `-` and `_` drawn for event `n` (draw `k`, then more as
/// needed): six bits a character, ten to a draw.
fn fill_text(n: u64, k: u64, out: &mut [u8]) {
    const CHARS: &[u8; 64] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_";
    let mut r = draw(n, k);
    for chunk in out.chunks_mut(10) {
        for (i, c) in chunk.iter_mut().enumerate() {
            *c = CHARS[((r >> (6 * i)) & 63) as usize];
        }
        r = mix(r);
    }
}

/// `len` letters and digits for event `n`.
fn text(n: u64, k: u64, len: usize) -> String {
    let mut bytes = vec![0; len];
    fill_text(n, k, &mut bytes);
    String::from_utf8(bytes).expect("ASCII")
}

/// Padding of 0 to 20 characters, inline in a [`Word`] (no allocation): a stretch of a fixed
/// random text, at a place drawn for the event.
fn extra(n: u64, k: u64) -> Word {
    static PAD: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    let pad = PAD.get_or_init(|| {
        let mut pad = vec![0; 4096];
        fill_text(0x5EED, 0, &mut pad);
        pad
    });
    let r = draw(n, k);
    // (28: the events are the same as when words held 28 bytes inline.)
    let at = ((r >> 8) % (pad.len() - 28) as u64) as usize;
    let window = &pad[at..at + weir::record::WORD_INLINE_BYTES];
    Word::from_ascii_prefix(window.try_into().expect("a window"), (r % 21) as usize)
}

/// Every channel's name and URL, made once per process (as the standard generator caches
/// them; a bounded table of about 1.3 MB): a bid's name is copied (inline) and its URL
/// referred to, where making them would format and allocate per bid. Channels below [`CHANNELS`] are
/// `channel-<c>`, the others the hot ones; a URL has three directories and the channel id as a
/// query parameter.
#[inline]
fn channel(c: u64) -> &'static (Word, Word) {
    static TABLE: std::sync::OnceLock<Vec<(Word, Word)>> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        (0..CHANNELS + HOT_CHANNELS.len() as u64)
            .map(|c| {
                let seed = c.wrapping_mul(0x9E37_79B9);
                let url = format!(
                    "https://www.nexmark.com/{}/{}/{}/item.htm?query=1&channel_id={c}",
                    text(seed, 0, 5),
                    text(seed, 1, 5),
                    text(seed, 2, 5)
                );
                let name = match c.checked_sub(CHANNELS) {
                    Some(hot) => Word::new(HOT_CHANNELS[hot as usize]),
                    None => Word::new(&format!("channel-{c}")),
                };
                (name, Word::from_static(Box::leak(url.into_boxed_str())))
            })
            .collect()
    });
    &table[c as usize]
}

/// The event generator: `events` of them (unbounded if `None`), at `rate` per second in all if
/// given.
fn generator(events: Option<u64>, rate: Option<f64>) -> Generator<impl Fn(u64, u64) -> Event + Clone + Send + 'static> {
    let mut g = Generator::new(|n, _| event(n));
    if let Some(n) = events {
        g = g.count(n);
    }
    if let Some(r) = rate {
        g = g.rate(r);
    }
    g
}

/// q10's partition of a bid: `dt=YYYY-MM-DD/hm=HH:MM` of its event time (the epoch being the
/// stream's start).
fn q10_partition(b: &Bid, out: &mut String) {
    use std::fmt::Write;
    let (minutes, days) = (b.date_time / 60_000, b.date_time / 86_400_000);
    let (y, m, d) = weir::record::civil_date(days);
    write!(out, "dt={y:04}-{m:02}-{d:02}/hm={:02}:{:02}", minutes / 60 % 24, minutes % 60).expect("to a String");
}

/// q10's line for a bid: auction, bidder, price, event time (ms), padding.
fn q10_line(b: &Bid, out: &mut Vec<u8>) {
    use std::io::Write;
    write!(out, "{},{},{},{},", b.auction, b.bidder, b.price, b.date_time).expect("to a Vec");
    b.extra().write_to(out);
    out.push(b'\n');
}

/// q10 as the suite runs it: every bid written under `dir`, partitioned by day and minute
/// (`<dir>/dt=…/hm=…/part-<subtask>`, one line per bid: auction, bidder, price, time, padding),
/// exactly once with checkpoints ([`weir::pipeline::Stream::write_files_partitioned`]).
pub fn write_q10(job: &Job, events: Option<u64>, rate: Option<f64>, dir: &std::path::Path) {
    job.generator(generator(events, rate))
        .named("nexmark")
        .flat_map(|e: Event, out| {
            if let Event::Bid(b) = e {
                out.emit(b);
            }
        })
        .write_files_partitioned(dir, q10_partition, q10_line);
}

/// What q10 writes for the first `events` events, as [`read_q10`] reads it back.
pub fn q10_reference(events: u64) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut files: std::collections::BTreeMap<String, Vec<String>> = std::collections::BTreeMap::new();
    for e in (0..events).map(event) {
        let Some(b) = bid_of(&e) else { continue };
        let (mut partition, mut line) = (String::new(), Vec::new());
        q10_partition(b, &mut partition);
        q10_line(b, &mut line);
        line.pop();
        files.entry(partition).or_default().push(String::from_utf8(line).expect("ASCII"));
    }
    files.values_mut().for_each(|lines| lines.sort_unstable());
    files
}

/// The lines q10 wrote under `dir`, per partition (every subtask's file together, sorted).
pub fn read_q10(dir: &std::path::Path) -> weir::error::Result<std::collections::BTreeMap<String, Vec<String>>> {
    let mut files: std::collections::BTreeMap<String, Vec<String>> = std::collections::BTreeMap::new();
    for (partition, path) in weir::sink::partition_files(dir)? {
        if path.file_name().is_some_and(|n| n.to_string_lossy().starts_with("part-")) {
            let text = std::fs::read_to_string(&path)
                .map_err(|e| weir::error::Error::io("cannot read output file", &path, e))?;
            files.entry(partition).or_default().extend(text.lines().map(str::to_owned));
        }
    }
    files.values_mut().for_each(|lines| lines.sort_unstable());
    Ok(files)
}

/// Event number `n`. (Inlined into the generator's loop, so each event is built in its place
/// in the batch, not built aside and copied there.)
#[inline(always)]
pub fn event(n: u64) -> Event {
    let date_time = n * INTER_EVENT_US / 1_000;
    let offset = n % TOTAL_PROPORTION;
    if offset < PERSON_PROPORTION {
        Event::Person(Box::new(Person { id: FIRST_PERSON_ID + n / TOTAL_PROPORTION, date_time, event: n }))
    } else if offset < PERSON_PROPORTION + AUCTION_PROPORTION {
        let id = FIRST_AUCTION_ID + n / TOTAL_PROPORTION * AUCTION_PROPORTION + (offset - PERSON_PROPORTION);
        let seller = FIRST_PERSON_ID + pick(people_before(n), ACTIVE_PEOPLE, HOT_SELLER_RATIO, draw(n, 1));
        let initial_bid = price(draw(n, 2));
        Event::Auction(Box::new(Auction {
            id,
            initial_bid,
            reserve: initial_bid + price(draw(n, 4)),
            date_time,
            expires: date_time + 1 + draw(n, 5) % 20_000,
            seller,
            category: FIRST_CATEGORY_ID + draw(n, 3) % 5,
            event: n,
        }))
    } else {
        Event::Bid(Bid {
            auction: FIRST_AUCTION_ID + pick(auctions_before(n), IN_FLIGHT_AUCTIONS, HOT_AUCTION_RATIO, draw(n, 6)),
            bidder: FIRST_PERSON_ID + pick(people_before(n), ACTIVE_PEOPLE, HOT_BIDDER_RATIO, draw(n, 7)),
            price: price(draw(n, 8)),
            date_time,
            event: n,
        })
    }
}

/// The queries, numbered as in the Nexmark suite.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Query {
    /// Pass-through: every event to the sink.
    Q0,
    /// Currency conversion: every bid's price in euros (× 0.908).
    Q1,
    /// Selection: bids on auctions whose id is a multiple of 123.
    Q2,
    /// Local item suggestion: sellers in Oregon, Idaho or California and their auctions in
    /// category 10 (an unwindowed join of people and auctions).
    Q3,
    /// Average price per category: each auction's closing price (its highest bid while it was
    /// open), averaged per category.
    Q4,
    /// Hot items: per 10 s window sliding every 2 s, the auction(s) with the most bids.
    Q5,
    /// Average selling price by seller: the mean closing price of each seller's last 10
    /// auctions.
    Q6,
    /// Highest bid: per 10 s tumbling window, the highest price.
    Q7,
    /// New users: people who created an auction in the same 10 s tumbling window.
    Q8,
    /// Winning bids: each auction with its winning bid.
    Q9,
    /// Log to a file system: every bid, partitioned into folders by day and minute
    /// (`dt=YYYY-MM-DD/hm=HH:MM`; see [`write_q10`]). As rows: (auction, bidder, price).
    Q10,
    /// User sessions: bids per bidder session (a gap of 10 s ends one).
    Q11,
    /// Processing-time windows: bids per bidder per 10 s of processing time.
    Q12,
    /// Bounded side-input join: each bid with its auction's entry in a fixed table.
    Q13,
    /// Calculation: bids between 1,000,000 and 50,000,000 (euro cents), with the time of day
    /// and the number of zeros in their padding.
    Q14,
    /// Bidding statistics per day: bids, bidders and auctions, in all and by price range.
    Q15,
    /// Channel statistics per channel and day.
    Q16,
    /// Auction statistics per auction and day: bids, lowest, highest, mean and total price.
    Q17,
    /// Each bidder's last bid on each auction.
    Q18,
    /// Each auction's ten highest bids.
    Q19,
    /// Bids expanded with their auction, for auctions in category 10 (an unwindowed join).
    Q20,
    /// The channel id of each bid: from the channel's name, or the URL's `channel_id`.
    Q21,
    /// The first three directories of each bid's URL.
    Q22,
}

impl Query {
    /// Every query.
    pub const ALL: [Query; 23] = [
        Query::Q0,
        Query::Q1,
        Query::Q2,
        Query::Q3,
        Query::Q4,
        Query::Q5,
        Query::Q6,
        Query::Q7,
        Query::Q8,
        Query::Q9,
        Query::Q10,
        Query::Q11,
        Query::Q12,
        Query::Q13,
        Query::Q14,
        Query::Q15,
        Query::Q16,
        Query::Q17,
        Query::Q18,
        Query::Q19,
        Query::Q20,
        Query::Q21,
        Query::Q22,
    ];

    fn number(self) -> u32 {
        match self {
            Query::Q0 => 0,
            Query::Q1 => 1,
            Query::Q2 => 2,
            Query::Q3 => 3,
            Query::Q4 => 4,
            Query::Q5 => 5,
            Query::Q6 => 6,
            Query::Q7 => 7,
            Query::Q8 => 8,
            Query::Q9 => 9,
            Query::Q10 => 10,
            Query::Q11 => 11,
            Query::Q12 => 12,
            Query::Q13 => 13,
            Query::Q14 => 14,
            Query::Q15 => 15,
            Query::Q16 => 16,
            Query::Q17 => 17,
            Query::Q18 => 18,
            Query::Q19 => 19,
            Query::Q20 => 20,
            Query::Q21 => 21,
            Query::Q22 => 22,
        }
    }

    /// How a job's rows reduce to the reference's (see [`final_rows`]).
    fn result(self) -> Result {
        match self {
            Query::Q5 | Query::Q7 => Result::BestPerWindow,
            // Running results: the last row per key is the final one.
            Query::Q4 | Query::Q6 | Query::Q15 => Result::LastPerKey(1),
            Query::Q16 | Query::Q17 | Query::Q18 => Result::LastPerKey(2),
            Query::Q12 => Result::SumPerKey,
            _ => Result::All,
        }
    }
}

/// How a query's output rows compare with the reference's.
enum Result {
    /// Every row.
    All,
    /// Per window, the best row (q5: most bids; q7: highest price).
    BestPerWindow,
    /// The last row of each key (the first 1 or 2 columns): running aggregates.
    LastPerKey(usize),
    /// Per key (the first column), the sum of the second (counts over processing-time windows,
    /// which depend on timing; their sum does not).
    SumPerKey,
}

impl std::str::FromStr for Query {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        weir::error::one_of(&Query::ALL, s, "a query here")
    }
}

impl std::fmt::Display for Query {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "q{}", self.number())
    }
}

/// A query's results as comparable rows (`(a, b, c)`: see each query).
pub type Row = (u64, u64, u64);

#[doc(hidden)] // for the tests (tests/jobs.rs)
pub fn bid_of(e: &Event) -> Option<&Bid> {
    match e {
        Event::Bid(b) => Some(b),
        _ => None,
    }
}

type Stream<T> = weir::pipeline::Stream<T>;

/// The bids' numbers, with event-time watermarks. Events come in time order, ten to a
/// millisecond: a watermark trails the newest time by 1 ms, so a bid in the same millisecond as
/// the last one is never late.
fn bid_prices(events: Stream<Event>) -> Stream<BidPrice> {
    events
        .flat_map(|e: Event, out| {
            if let Event::Bid(b) = &e {
                out.emit(b.numbers());
            }
        })
        .with_watermarks(|b: &BidPrice| b.date_time, 1)
}

/// The auctions, with watermarks.
fn auctions(events: Stream<Event>) -> Stream<Auction> {
    events
        .flat_map(|e: Event, out| {
            if let Event::Auction(a) = e {
                out.emit(*a);
            }
        })
        .with_watermarks(|a: &Auction| a.date_time, 1)
}

fn window_start(t: u64, size: u64) -> u64 {
    t - t % size
}

/// Milliseconds in a day (q15–q17 group by day).
const DAY_MS: u64 = 86_400_000;

/// One closed auction (q4, q6, q9): its winning bid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, weir::Persist)]
pub struct Closed {
    /// Auction id.
    pub auction: u64,
    /// Its category.
    pub category: u64,
    /// Its seller.
    pub seller: u64,
    /// When it closed.
    pub expires: u64,
    /// The winning price.
    pub price: u64,
    /// The winner.
    pub bidder: u64,
}

/// The winning bid of a bid: highest price, then earliest, then the smallest bidder.
fn beats(a: &BidPrice, b: &BidPrice) -> bool {
    (a.price, u64::MAX - a.date_time, u64::MAX - a.bidder) > (b.price, u64::MAX - b.date_time, u64::MAX - b.bidder)
}

/// Closes auctions: keyed by auction id, it keeps the auction and its best bid while it is
/// open, bids that came before their auction (from the other input) until it does, and emits
/// the winner when event time reaches the auction's end (a timer). Bids after the end lose.
#[derive(Clone)]
struct CloseAuctions;

impl weir::operator::co_process::KeyedCoProcessFunction<u64, Auction, BidPrice> for CloseAuctions {
    type Out = Closed;
    /// The auction (id, category, seller, start, end) and the best bid so far; bids waiting
    /// for their auction.
    type State = (
        weir::state::KeyedValueState<u64, ((u64, u64, u64, u64), Option<BidPrice>)>,
        weir::state::ListState<u64, BidPrice>,
    );
    fn state(&self) -> Self::State {
        (weir::state::KeyedValueState::new(), weir::state::ListState::new())
    }
    fn process1(&mut self, a: Auction, ctx: &mut weir::KeyedContext<'_, u64, Self::State, Closed>) {
        let (mut open, mut waiting) = ctx.state();
        let mut best: Option<BidPrice> = None;
        for b in waiting.take().into_iter().filter(|b| (a.date_time..=a.expires).contains(&b.date_time)) {
            if best.is_none_or(|x| beats(&b, &x)) {
                best = Some(b);
            }
        }
        open.set(((a.category, a.seller, a.date_time, a.expires), best));
        ctx.register_event_time_timer(a.expires);
    }
    fn process2(&mut self, b: BidPrice, ctx: &mut weir::KeyedContext<'_, u64, Self::State, Closed>) {
        let (mut open, mut waiting) = ctx.state();
        match open.get().copied() {
            Some(((category, seller, start, end), best)) => {
                if (start..=end).contains(&b.date_time) && best.is_none_or(|x| beats(&b, &x)) {
                    open.set(((category, seller, start, end), Some(b)));
                }
            }
            None => waiting.add(b),
        }
    }
    fn on_timer(
        &mut self,
        _: u64,
        _: weir::state::TimeDomain,
        ctx: &mut weir::KeyedContext<'_, u64, Self::State, Closed>,
    ) {
        let auction = *ctx.key();
        let (mut open, _) = ctx.state();
        if let Some(((category, seller, _, expires), Some(b))) = open.clear() {
            ctx.emit(Closed { auction, category, seller, expires, price: b.price, bidder: b.bidder });
        }
    }
}

/// The closed auctions of `events` (q4, q6, q9).
fn closed(events: Stream<Event>) -> Stream<Closed> {
    let auctions = auctions(events.clone()).key_by(|a: &Auction| a.id);
    let bids = bid_prices(events).key_by(|b: &BidPrice| b.auction);
    auctions.connect(bids).process(CloseAuctions).named("close-auctions")
}

/// q3's join: a person of OR, ID or CA kept by id; their category-10 auctions, before or
/// after the person arrives.
#[derive(Clone)]
struct LocalItems;

impl weir::operator::co_process::KeyedCoProcessFunction<u64, Person, Auction> for LocalItems {
    type Out = Row;
    type State = (weir::state::KeyedValueState<u64, u64>, weir::state::ListState<u64, u64>);
    fn state(&self) -> Self::State {
        (weir::state::KeyedValueState::new(), weir::state::ListState::new())
    }
    fn process1(&mut self, p: Person, ctx: &mut weir::KeyedContext<'_, u64, Self::State, Row>) {
        let who = hash_key(&(p.name(), p.city(), p.state()));
        let (mut person, mut waiting) = ctx.state();
        person.set(who);
        let pending = waiting.take();
        for auction in pending {
            ctx.emit((p.id, auction, who));
        }
    }
    fn process2(&mut self, a: Auction, ctx: &mut weir::KeyedContext<'_, u64, Self::State, Row>) {
        let (person, mut waiting) = ctx.state();
        match person.get().copied() {
            Some(who) => ctx.emit((a.seller, a.id, who)),
            None => waiting.add(a.id),
        }
    }
}

/// q20's join: category-10 auctions by id, and the bids on them, in either order.
#[derive(Clone)]
struct ExpandBids;

impl weir::operator::co_process::KeyedCoProcessFunction<u64, Auction, BidPrice> for ExpandBids {
    type Out = Row;
    /// The auction's item name (hashed), or the bids waiting for it.
    type State = (weir::state::KeyedValueState<u64, u64>, weir::state::ListState<u64, BidPrice>);
    fn state(&self) -> Self::State {
        (weir::state::KeyedValueState::new(), weir::state::ListState::new())
    }
    fn process1(&mut self, a: Auction, ctx: &mut weir::KeyedContext<'_, u64, Self::State, Row>) {
        let item = hash_key(&a.item_name());
        let (mut auction, mut waiting) = ctx.state();
        auction.set(item);
        for b in waiting.take() {
            ctx.emit((b.auction, b.price, item));
        }
    }
    fn process2(&mut self, b: BidPrice, ctx: &mut weir::KeyedContext<'_, u64, Self::State, Row>) {
        let (auction, mut waiting) = ctx.state();
        match auction.get().copied() {
            Some(item) => ctx.emit((b.auction, b.price, item)),
            None => waiting.add(b),
        }
    }
}

/// q6: per seller, the closed auctions in order of closing; the mean of the last ten.
#[derive(Clone)]
struct SellerAverage;

impl weir::operator::process::KeyedProcessFunction<u64, Closed> for SellerAverage {
    type Out = Row;
    /// The last ten (expires, auction, price), oldest first, and how many closed in all.
    type State = weir::state::KeyedValueState<u64, (Vec<(u64, u64, u64)>, u64)>;
    fn state(&self) -> Self::State {
        weir::state::KeyedValueState::new()
    }
    fn process(&mut self, c: Closed, ctx: &mut weir::KeyedContext<'_, u64, Self::State, Row>) {
        let seller = *ctx.key();
        let mut s = ctx.state();
        let (last, total) = s.get_or_insert_with(|| (Vec::new(), 0));
        // Closings of one seller can arrive out of order (from several subtasks): keep them
        // sorted by (expires, auction), so the last ten do not depend on arrival.
        let at = last.partition_point(|x| (x.0, x.1) < (c.expires, c.auction));
        last.insert(at, (c.expires, c.auction, c.price));
        if last.len() > 10 {
            last.remove(0);
        }
        *total += 1;
        let mean = last.iter().map(|x| x.2).sum::<u64>() / last.len() as u64;
        let total = *total;
        ctx.emit((seller, total, mean));
    }
}

/// q19: per auction, the ten best bids, emitted when the input ends (an event-time timer at
/// the end of time).
#[derive(Clone)]
struct TopBids;

impl weir::operator::process::KeyedProcessFunction<u64, BidPrice> for TopBids {
    type Out = Row;
    type State = weir::state::KeyedValueState<u64, Vec<BidPrice>>;
    fn state(&self) -> Self::State {
        weir::state::KeyedValueState::new()
    }
    fn process(&mut self, b: BidPrice, ctx: &mut weir::KeyedContext<'_, u64, Self::State, Row>) {
        let mut s = ctx.state();
        let top = s.get_or_insert_with(Vec::new);
        let at = top.partition_point(|x| beats(x, &b));
        if at < 10 {
            top.insert(at, b);
            top.truncate(10);
        }
        ctx.register_event_time_timer(u64::MAX);
    }
    fn on_timer(
        &mut self,
        _: u64,
        _: weir::state::TimeDomain,
        ctx: &mut weir::KeyedContext<'_, u64, Self::State, Row>,
    ) {
        let top = ctx.state().clear().unwrap_or_default();
        for b in top {
            ctx.emit((b.auction, b.price, b.bidder));
        }
    }
}

/// q13's side input: a fixed table of 10,000 entries, looked up by `auction % 10,000`.
fn side_input(key: u64) -> u64 {
    hash_key(&format!("side-value-{}", key % 10_000))
}

/// q14: the time of day of a bid (0 day, 1 night, 2 other), by its hour.
fn time_of_day(date_time: u64) -> u64 {
    match (date_time / 3_600_000) % 24 {
        8..=18 => 0,
        h if h >= 20 || h <= 6 => 1,
        _ => 2,
    }
}

/// q21: the channel id: fixed for the hot channels, else the URL's `channel_id` parameter.
fn channel_id(b: &Bid) -> u64 {
    b.channel().with_str(|c| match c.to_ascii_lowercase().as_str() {
        "apple" => 0,
        "google" => 1,
        "facebook" => 2,
        "baidu" => 3,
        _ => b.url().with_str(|u| {
            u.split("channel_id=")
                .nth(1)
                .and_then(|v| v.split('&').next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(u64::MAX)
        }),
    })
}

/// q22: the first three directories of the bid's URL, hashed.
fn url_dirs(b: &Bid) -> u64 {
    b.url().with_str(|u| {
        let path = u.split("://").nth(1).unwrap_or(u);
        let mut dirs = path.split('/').skip(1);
        hash_key(&(dirs.next().unwrap_or(""), dirs.next().unwrap_or(""), dirs.next().unwrap_or("")))
    })
}

/// q15–q17's running statistics: count by price range (below $100, below $10,000, above),
/// distinct bidders and auctions, lowest, highest and total price.
#[derive(Clone, Debug, Default, PartialEq, Eq, weir::Persist)]
pub struct BidStats {
    bids: u64,
    ranks: [u64; 3],
    bidders: Vec<u64>,
    auctions: Vec<u64>,
    min: u64,
    max: u64,
    sum: u64,
}

impl BidStats {
    fn add(&mut self, b: &BidPrice) {
        self.bids += 1;
        self.ranks[if b.price < 10_000 {
            0
        } else if b.price < 1_000_000 {
            1
        } else {
            2
        }] += 1;
        for (set, v) in [(&mut self.bidders, b.bidder), (&mut self.auctions, b.auction)] {
            if let Err(at) = set.binary_search(&v) {
                set.insert(at, v);
            }
        }
        self.min = if self.bids == 1 { b.price } else { self.min.min(b.price) };
        self.max = self.max.max(b.price);
        self.sum += b.price;
    }
    /// Every statistic in one number (rows have three columns).
    fn digest(&self) -> u64 {
        hash_key(&(self.ranks, self.bidders.len(), self.auctions.len(), self.min, self.max, self.sum))
    }
}

/// Builds query `q` over `events` events (at `rate` events/s if given) on `job`; its results
/// go to the returned stream as rows: q0 (event time, kind, 0); q1 (auction, bidder, euro
/// cents); q2 (auction, price, 0); q3 (seller, auction, person digest); q4 (category, closed
/// auctions, mean price); q5 (window start, auction, bids) for every update of a window's
/// leader; q6 (seller, closed auctions, mean of the last ten); q7 (window start, price,
/// bidder) for every new highest bid; q8 (person, auction, window start); q9 (auction, price,
/// bidder); q10 (auction, bidder, price: what it writes, without the files, see [`write_q10`]);
/// q11 (bidder, session start, bids); q12 (bidder, bids, window start); q13
/// (auction, price, side value); q14 (auction, euro cents, time of day × 2^32 + zeros);
/// q15 (day, bids, digest); q16 (channel, day, digest); q17 (auction, day, digest); q18
/// (bidder, auction, price); q19 (auction, price, bidder); q20 (auction, price, item);
/// q21 (auction, price, channel id); q22 (auction, price, directories).
pub fn build(job: &Job, q: Query, events: Option<u64>, rate: Option<f64>) -> Stream<Row> {
    let source = job.generator(generator(events, rate)).named("nexmark");
    let name = q.to_string();
    let bids_map = |f: fn(&Bid) -> Option<Row>| {
        source.clone().flat_map(move |e: Event, out| {
            if let Some(r) = bid_of(&e).and_then(f) {
                out.emit(r);
            }
        })
    };
    let rows = match q {
        Query::Q0 => source.map(|e: Event| {
            let kind = match e {
                Event::Person(_) => 0,
                Event::Auction(_) => 1,
                Event::Bid(_) => 2,
            };
            (e.date_time(), kind, 0)
        }),
        Query::Q1 => bids_map(|b| Some((b.auction, b.bidder, b.price * 908 / 1000))),
        Query::Q2 => bids_map(|b| (b.auction % 123 == 0).then_some((b.auction, b.price, 0))),
        Query::Q3 => {
            let people = source
                .clone()
                .flat_map(|e: Event, out| {
                    if let Event::Person(p) = e {
                        if p.state().with_str(|s| matches!(s, "OR" | "ID" | "CA")) {
                            out.emit(*p);
                        }
                    }
                })
                .key_by(|p: &Person| p.id);
            let auctions = source
                .flat_map(|e: Event, out| {
                    if let Event::Auction(a) = e {
                        if a.category == 10 {
                            out.emit(*a);
                        }
                    }
                })
                .key_by(|a: &Auction| a.seller);
            people.connect(auctions).process(LocalItems)
        }
        Query::Q4 => closed(source).key_by(|c: &Closed| c.category).aggregate(
            || (0u64, 0u64),
            |(n, sum): &mut (u64, u64), c: Closed| {
                *n += 1;
                *sum += c.price;
            },
            |&category, &(n, sum)| (category, n, sum / n),
        ),
        Query::Q5 => bid_prices(source)
            .key_by(|b: &BidPrice| b.auction)
            .window(Window::sliding(WINDOW_MS, SLIDE_MS), |b: &BidPrice| b.date_time)
            .count()
            .named("q5-count")
            .key_by(|r: &(u64, WindowBounds, u64)| r.1.start)
            // The leader so far: most bids, then the smaller auction id.
            .reduce(|a, b| if (b.2, u64::MAX - b.0) > (a.2, u64::MAX - a.0) { *b } else { *a })
            .named("q5-max")
            .map(|(auction, w, count)| (w.start, auction, count)),
        Query::Q6 => closed(source).key_by(|c: &Closed| c.seller).keyed_process(SellerAverage),
        Query::Q7 => bid_prices(source)
            .key_by(|b: &BidPrice| b.auction)
            .window(Window::tumbling(WINDOW_MS), |b: &BidPrice| b.date_time)
            .aggregate(
                || (0u64, 0u64),
                |best: &mut (u64, u64), b: BidPrice| {
                    if (b.price, u64::MAX - b.bidder) > (best.0, u64::MAX - best.1) {
                        *best = (b.price, b.bidder);
                    }
                },
                |_, w, best| (w.start, best.0, best.1),
            )
            .named("q7-per-auction")
            .key_by(|r: &Row| r.0)
            .reduce(|a, b| if (b.1, u64::MAX - b.2) > (a.1, u64::MAX - a.2) { *b } else { *a })
            .named("q7-max"),
        Query::Q8 => {
            // The join reads ids and times only: people and auctions are projected onto them
            // before the key-by (their strings never cross a ring).
            let people = source
                .flat_map(|e: Event, out| {
                    if let Event::Person(p) = e {
                        out.emit((p.id, p.date_time));
                    }
                })
                .with_watermarks(|p: &(u64, u64)| p.1, 1);
            let auctions = job
                .generator(generator(events, rate))
                .named("nexmark-auctions")
                .flat_map(|e: Event, out| {
                    if let Event::Auction(a) = e {
                        out.emit((a.id, a.seller, a.date_time));
                    }
                })
                .with_watermarks(|a: &(u64, u64, u64)| a.2, 1);
            people.window_join(
                auctions,
                |p: &(u64, u64)| p.0,
                |a: &(u64, u64, u64)| a.1,
                |p: &(u64, u64)| p.1,
                |a: &(u64, u64, u64)| a.2,
                Window::tumbling(WINDOW_MS),
                |&id, p: &(u64, u64), a: &(u64, u64, u64)| (id, a.0, window_start(p.1, WINDOW_MS)),
            )
        }
        Query::Q9 => closed(source).map(|c: Closed| (c.auction, c.price, c.bidder)),
        Query::Q10 => bids_map(|b| Some((b.auction, b.bidder, b.price))),
        Query::Q11 => bid_prices(source)
            .key_by(|b: &BidPrice| b.bidder)
            .session_window(WINDOW_MS, |b: &BidPrice| b.date_time)
            .count()
            .map(|(bidder, w, n)| (bidder, w.start, n)),
        Query::Q12 => bid_prices(source)
            .key_by(|b: &BidPrice| b.bidder)
            .processing_time_window(Window::tumbling(WINDOW_MS))
            .count()
            .map(|(bidder, w, n)| (bidder, n, w.start)),
        Query::Q13 => bids_map(|b| Some((b.auction, b.price, side_input(b.auction)))),
        Query::Q14 => bids_map(|b| {
            let euros = b.price * 908 / 1000;
            (1_000_000 < euros && euros < 50_000_000).then(|| {
                let zeros = b.extra().with_str(|s| s.bytes().filter(|&c| c == b'0').count() as u64);
                (b.auction, euros, time_of_day(b.date_time) << 32 | zeros)
            })
        }),
        Query::Q15 => bid_prices(source).key_by(|b: &BidPrice| b.date_time / DAY_MS).aggregate(
            BidStats::default,
            |s: &mut BidStats, b: BidPrice| s.add(&b),
            |&day, s: &BidStats| (day, s.bids, s.digest()),
        ),
        Query::Q16 => source
            .flat_map(|e: Event, out| {
                if let Event::Bid(b) = e {
                    out.emit((hash_key(&b.channel()), b.numbers()));
                }
            })
            .key_by(|(channel, b): &(u64, BidPrice)| (*channel, b.date_time / DAY_MS))
            .aggregate(
                BidStats::default,
                |s: &mut BidStats, (_, b): (u64, BidPrice)| s.add(&b),
                |&(channel, day), s: &BidStats| (channel, day, hash_key(&(s.bids, s.digest()))),
            ),
        Query::Q17 => bid_prices(source).key_by(|b: &BidPrice| (b.auction, b.date_time / DAY_MS)).aggregate(
            BidStats::default,
            |s: &mut BidStats, b: BidPrice| s.add(&b),
            |&(auction, day), s: &BidStats| (auction, day, hash_key(&(s.bids, s.min, s.max, s.sum / s.bids, s.sum))),
        ),
        Query::Q18 => bid_prices(source)
            .key_by(|b: &BidPrice| (b.bidder, b.auction))
            // The last bid: latest time, then (same millisecond) the highest price.
            .reduce(|a, b| if (b.date_time, b.price) >= (a.date_time, a.price) { *b } else { *a })
            .map(|b: BidPrice| (b.bidder, b.auction, b.price)),
        Query::Q19 => bid_prices(source).key_by(|b: &BidPrice| b.auction).keyed_process(TopBids),
        Query::Q20 => {
            let auctions = auctions(source.clone()).filter(|a: &Auction| a.category == 10).key_by(|a: &Auction| a.id);
            let bids = bid_prices(source).key_by(|b: &BidPrice| b.auction);
            auctions.connect(bids).process(ExpandBids)
        }
        Query::Q21 => bids_map(|b| Some((b.auction, b.price, channel_id(b)))),
        Query::Q22 => bids_map(|b| Some((b.auction, b.price, url_dirs(b)))),
    };
    rows.named(&name)
}

/// The closed auctions of the first `events` events, computed sequentially.
fn reference_closed(all: &[Event]) -> Vec<Closed> {
    let mut best: HashMap<u64, BidPrice> = HashMap::new();
    let opened: HashMap<u64, &Auction> = all
        .iter()
        .filter_map(|e| match e {
            Event::Auction(a) => Some((a.id, &**a)),
            _ => None,
        })
        .collect();
    for b in all.iter().filter_map(bid_of).map(Bid::numbers) {
        if let Some(a) = opened.get(&b.auction) {
            if (a.date_time..=a.expires).contains(&b.date_time) && best.get(&b.auction).is_none_or(|x| beats(&b, x)) {
                best.insert(b.auction, b);
            }
        }
    }
    let mut out: Vec<Closed> = best
        .into_iter()
        .map(|(id, b)| {
            let a = opened[&id];
            Closed {
                auction: id,
                category: a.category,
                seller: a.seller,
                expires: a.expires,
                price: b.price,
                bidder: b.bidder,
            }
        })
        .collect();
    out.sort_unstable_by_key(|c| (c.expires, c.auction));
    out
}

/// What query `q` must produce over the first `events` events, computed sequentially, in the
/// form the checks compare ([`final_rows`] of a job's rows).
pub fn reference(q: Query, events: u64) -> Vec<Row> {
    let all: Vec<Event> = (0..events).map(event).collect();
    let bids = || all.iter().filter_map(bid_of);
    let prices = || bids().map(Bid::numbers);
    let mut rows: Vec<Row> = match q {
        Query::Q0 => all
            .iter()
            .map(|e| {
                let kind = match e {
                    Event::Person(_) => 0,
                    Event::Auction(_) => 1,
                    Event::Bid(_) => 2,
                };
                (e.date_time(), kind, 0)
            })
            .collect(),
        Query::Q1 => bids().map(|b| (b.auction, b.bidder, b.price * 908 / 1000)).collect(),
        Query::Q2 => bids().filter(|b| b.auction % 123 == 0).map(|b| (b.auction, b.price, 0)).collect(),
        Query::Q3 => {
            let people: HashMap<u64, u64> = all
                .iter()
                .filter_map(|e| match e {
                    Event::Person(p) if p.state().with_str(|s| matches!(s, "OR" | "ID" | "CA")) => {
                        Some((p.id, hash_key(&(p.name(), p.city(), p.state()))))
                    }
                    _ => None,
                })
                .collect();
            all.iter()
                .filter_map(|e| match e {
                    Event::Auction(a) if a.category == 10 => people.get(&a.seller).map(|&who| (a.seller, a.id, who)),
                    _ => None,
                })
                .collect()
        }
        Query::Q4 => {
            let mut per: HashMap<u64, (u64, u64)> = HashMap::new();
            for c in reference_closed(&all) {
                let e = per.entry(c.category).or_default();
                e.0 += 1;
                e.1 += c.price;
            }
            per.into_iter().map(|(k, (n, sum))| (k, n, sum / n)).collect()
        }
        Query::Q5 => {
            let mut counts: HashMap<(u64, u64), u64> = HashMap::new();
            for b in bids() {
                let mut start = window_start(b.date_time, SLIDE_MS);
                loop {
                    if start + WINDOW_MS > b.date_time {
                        *counts.entry((start, b.auction)).or_default() += 1;
                    }
                    if start < SLIDE_MS || start - SLIDE_MS + WINDOW_MS <= b.date_time {
                        break;
                    }
                    start -= SLIDE_MS;
                }
            }
            let mut best: HashMap<u64, (u64, u64)> = HashMap::new();
            for ((w, auction), c) in counts {
                let e = best.entry(w).or_insert((auction, c));
                if (c, u64::MAX - auction) > (e.1, u64::MAX - e.0) {
                    *e = (auction, c);
                }
            }
            best.into_iter().map(|(w, (a, c))| (w, a, c)).collect()
        }
        Query::Q6 => {
            let mut per: HashMap<u64, (Vec<u64>, u64)> = HashMap::new();
            for c in reference_closed(&all) {
                let e = per.entry(c.seller).or_default();
                e.0.push(c.price);
                e.1 += 1;
            }
            per.into_iter()
                .map(|(seller, (prices, n))| {
                    let last = &prices[prices.len().saturating_sub(10)..];
                    (seller, n, last.iter().sum::<u64>() / last.len() as u64)
                })
                .collect()
        }
        Query::Q7 => {
            let mut best: HashMap<u64, (u64, u64)> = HashMap::new();
            for b in bids() {
                let e = best.entry(window_start(b.date_time, WINDOW_MS)).or_insert((b.price, b.bidder));
                if (b.price, u64::MAX - b.bidder) > (e.0, u64::MAX - e.1) {
                    *e = (b.price, b.bidder);
                }
            }
            best.into_iter().map(|(w, (p, bidder))| (w, p, bidder)).collect()
        }
        Query::Q8 => {
            let mut people: HashMap<(u64, u64), u64> = HashMap::new();
            for e in &all {
                if let Event::Person(p) = e {
                    *people.entry((p.id, window_start(p.date_time, WINDOW_MS))).or_default() += 1;
                }
            }
            let mut rows = Vec::new();
            for e in &all {
                if let Event::Auction(a) = e {
                    let w = window_start(a.date_time, WINDOW_MS);
                    for _ in 0..people.get(&(a.seller, w)).copied().unwrap_or(0) {
                        rows.push((a.seller, a.id, w));
                    }
                }
            }
            rows
        }
        Query::Q9 => reference_closed(&all).into_iter().map(|c| (c.auction, c.price, c.bidder)).collect(),
        Query::Q10 => bids().map(|b| (b.auction, b.bidder, b.price)).collect(),
        Query::Q11 => {
            let mut times: HashMap<u64, Vec<u64>> = HashMap::new();
            for b in bids() {
                times.entry(b.bidder).or_default().push(b.date_time);
            }
            let mut rows = Vec::new();
            for (bidder, mut ts) in times {
                ts.sort_unstable();
                let (mut start, mut last, mut n) = (ts[0], ts[0], 0);
                for t in ts {
                    if t >= last + WINDOW_MS {
                        rows.push((bidder, start, n));
                        (start, n) = (t, 0);
                    }
                    last = t;
                    n += 1;
                }
                rows.push((bidder, start, n));
            }
            rows
        }
        Query::Q12 => {
            let mut per: HashMap<u64, u64> = HashMap::new();
            for b in bids() {
                *per.entry(b.bidder).or_default() += 1;
            }
            per.into_iter().map(|(k, n)| (k, n, 0)).collect()
        }
        Query::Q13 => bids().map(|b| (b.auction, b.price, side_input(b.auction))).collect(),
        Query::Q14 => bids()
            .filter_map(|b| {
                let euros = b.price * 908 / 1000;
                (1_000_000 < euros && euros < 50_000_000).then(|| {
                    let zeros = b.extra().with_str(|s| s.bytes().filter(|&c| c == b'0').count() as u64);
                    (b.auction, euros, time_of_day(b.date_time) << 32 | zeros)
                })
            })
            .collect(),
        Query::Q15 | Query::Q16 | Query::Q17 => {
            let mut per: HashMap<(u64, u64), BidStats> = HashMap::new();
            for b in bids() {
                let key = match q {
                    Query::Q15 => (b.date_time / DAY_MS, 0),
                    Query::Q16 => (hash_key(&b.channel()), b.date_time / DAY_MS),
                    _ => (b.auction, b.date_time / DAY_MS),
                };
                per.entry(key).or_default().add(&b.numbers());
            }
            per.into_iter()
                .map(|((a, b), s)| match q {
                    Query::Q15 => (a, s.bids, s.digest()),
                    Query::Q16 => (a, b, hash_key(&(s.bids, s.digest()))),
                    _ => (a, b, hash_key(&(s.bids, s.min, s.max, s.sum / s.bids, s.sum))),
                })
                .collect()
        }
        Query::Q18 => {
            let mut last: HashMap<(u64, u64), BidPrice> = HashMap::new();
            for b in prices() {
                let e = last.entry((b.bidder, b.auction)).or_insert(b);
                if (b.date_time, b.price) >= (e.date_time, e.price) {
                    *e = b;
                }
            }
            last.into_values().map(|b| (b.bidder, b.auction, b.price)).collect()
        }
        Query::Q19 => {
            let mut per: HashMap<u64, Vec<BidPrice>> = HashMap::new();
            for b in prices() {
                per.entry(b.auction).or_default().push(b);
            }
            let mut rows = Vec::new();
            for (_, mut v) in per {
                v.sort_by(|a, b| if beats(a, b) { std::cmp::Ordering::Less } else { std::cmp::Ordering::Greater });
                rows.extend(v.into_iter().take(10).map(|b| (b.auction, b.price, b.bidder)));
            }
            rows
        }
        Query::Q20 => {
            let items: HashMap<u64, u64> = all
                .iter()
                .filter_map(|e| match e {
                    Event::Auction(a) if a.category == 10 => Some((a.id, hash_key(&a.item_name()))),
                    _ => None,
                })
                .collect();
            bids().filter_map(|b| items.get(&b.auction).map(|&item| (b.auction, b.price, item))).collect()
        }
        Query::Q21 => bids().map(|b| (b.auction, b.price, channel_id(b))).collect(),
        Query::Q22 => bids().map(|b| (b.auction, b.price, url_dirs(b))).collect(),
    };
    rows.sort_unstable();
    rows
}

/// Reduces a job's output rows to the form [`reference`](fn@reference) gives (see each query's result),
/// sorted.
pub fn final_rows(q: Query, rows: Vec<Row>) -> Vec<Row> {
    let mut v: Vec<Row> = match q.result() {
        Result::All => rows,
        Result::BestPerWindow => {
            let mut best: HashMap<u64, Row> = HashMap::new();
            for r in rows {
                let e = best.entry(r.0).or_insert(r);
                let better = match q {
                    // Most bids, then the smaller auction.
                    Query::Q5 => (r.2, u64::MAX - r.1) > (e.2, u64::MAX - e.1),
                    // Highest price, then the smaller bidder.
                    _ => (r.1, u64::MAX - r.2) > (e.1, u64::MAX - e.2),
                };
                if better {
                    *e = r;
                }
            }
            best.into_values().collect()
        }
        Result::LastPerKey(columns) => {
            let mut last: HashMap<(u64, u64), Row> = HashMap::new();
            for r in rows {
                last.insert((r.0, if columns == 2 { r.1 } else { 0 }), r);
            }
            last.into_values().collect()
        }
        Result::SumPerKey => {
            let mut sums: HashMap<u64, u64> = HashMap::new();
            for r in rows {
                *sums.entry(r.0).or_default() += r.1;
            }
            sums.into_iter().map(|(k, n)| (k, n, 0)).collect()
        }
    };
    v.sort_unstable();
    v
}
