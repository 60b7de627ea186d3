//! The Nexmark generator: people, auctions and bids in the standard proportions, event `n`
//! a function of `n` alone, with the standard generator's text fields drawn when a query
//! reads them.
//!
//! May touch: `weir` (records, the generator source).

use weir::prng::mix;
use weir::record::Word;
use weir::source::Generator;

/// Event time between two events, in microseconds (10,000 events/s).
pub const INTER_EVENT_US: u64 = 100;
pub(super) const PERSON_PROPORTION: u64 = 1;
pub(super) const AUCTION_PROPORTION: u64 = 3;
pub(super) const TOTAL_PROPORTION: u64 = 50;
pub(super) const ACTIVE_PEOPLE: u64 = 1_000;
pub(super) const IN_FLIGHT_AUCTIONS: u64 = 100;
pub(super) const HOT_AUCTION_RATIO: u64 = 2;
pub(super) const HOT_BIDDER_RATIO: u64 = 4;
pub(super) const HOT_SELLER_RATIO: u64 = 4;
/// Hot ids are multiples of this.
#[doc(hidden)] // for the tests (tests/jobs.rs)
pub const HOT_ID_STEP: u64 = 100;
#[doc(hidden)] // for the tests (tests/jobs.rs)
pub const FIRST_PERSON_ID: u64 = 1_000;
#[doc(hidden)] // for the tests (tests/jobs.rs)
pub const FIRST_AUCTION_ID: u64 = 1_000;
pub(super) const FIRST_CATEGORY_ID: u64 = 10;
/// q5 and q7/q8 windows: 10 s, sliding every 2 s for q5.
pub const WINDOW_MS: u64 = 10_000;
/// q5's slide.
pub const SLIDE_MS: u64 = 2_000;

pub(super) const FIRST_NAMES: [&str; 8] = ["Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie"];
pub(super) const LAST_NAMES: [&str; 8] =
    ["Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones"];

pub(super) const US_STATES: [&str; 6] = ["AZ", "CA", "ID", "OR", "WA", "WY"];
pub(super) const US_CITIES: [&str; 10] =
    ["Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond", "Seattle", "Kent", "Cheyenne"];
pub(super) const HOT_CHANNELS: [&str; 4] = ["Google", "Facebook", "Baidu", "Apple"];
/// Channels other than the hot ones: `channel-<n>` for `n` below this.
pub(super) const CHANNELS: u64 = 10_000;

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
pub(super) fn bid_channel(n: u64) -> u64 {
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
pub(super) fn draw(n: u64, k: u64) -> u64 {
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
pub(super) fn pick(count: u64, recent: u64, ratio: u64, r: u64) -> u64 {
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
pub(super) const EXP2_TABLE: [f64; 256] = {
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
pub(super) fn fill_text(n: u64, k: u64, out: &mut [u8]) {
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
pub(super) fn text(n: u64, k: u64, len: usize) -> String {
    let mut bytes = vec![0; len];
    fill_text(n, k, &mut bytes);
    String::from_utf8(bytes).expect("ASCII")
}

/// Padding of 0 to 20 characters, inline in a [`Word`] (no allocation): a stretch of a fixed
/// random text, at a place drawn for the event.
pub(super) fn extra(n: u64, k: u64) -> Word {
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
pub(super) fn channel(c: u64) -> &'static (Word, Word) {
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
pub(super) fn generator(
    events: Option<u64>,
    rate: Option<f64>,
) -> Generator<impl Fn(u64, u64) -> Event + Clone + Send + 'static> {
    let mut g = Generator::new(|n, _| event(n));
    if let Some(n) = events {
        g = g.count(n);
    }
    if let Some(r) = rate {
        g = g.rate(r);
    }
    g
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
